/**
 * Many byte streams over one: the framing between the relay inside a sandbox and the host.
 *
 * The relay (relay/main.ts) accepts TCP connections on loopback inside the sandbox and carries
 * each one as a stream over the stdio of one `docker exec -i`; the host end (relay_host.ts) pipes
 * each stream to the Unix socket of the proxy it names. This module is shared by both ends and
 * imports nothing, so that the relay's bundle stays tiny.
 *
 * Every frame is a 9-byte header and a payload:
 *
 * ```
 * [type u8][stream id u32 big-endian][payload length u32 big-endian][payload]
 * ```
 *
 * | type | name   | direction     | payload                                                     |
 * |------|--------|---------------|-------------------------------------------------------------|
 * | 1    | READY  | relay → host  | `sandbox-relay/1` [` socket`]; stream 0; once, when it listens |
 * | 2    | OPEN   | relay → host  | service name (ASCII); a stream id above every earlier one     |
 * | 3    | DATA   | both          | 1 to `MAX_DATA_BYTES` bytes, within the receiver's window     |
 * | 4    | WINDOW | both          | u32 big-endian: more bytes the receiver may now be sent       |
 * | 5    | FIN    | both          | none: the sender will send no more DATA on this stream        |
 * | 6    | RST    | both          | optional reason (UTF-8, ≤ 256 bytes): the stream is aborted   |
 *
 * Flow control is per stream: a side may send the receiver's initial window of DATA on a stream
 * (`RELAY_WINDOW_BYTES` towards the relay, `HOST_WINDOW_BYTES` towards the host), and more only
 * as the receiver grants it with WINDOW frames after its consumer took the data. So a stalled
 * reader stalls only its own stream: the frame reader never waits on any one of them, and the
 * memory a peer can make us hold is bounded by our window × streams. The windows differ because
 * the costs do: what the host holds for a hostile relay is host memory (small window), while a
 * download's path through `docker exec` has deep buffers that a small window would leave idle
 * (and what the relay holds is the sandbox's own memory).
 *
 * READY says how the relay carries connections: `sandbox-relay/1` over this stream (OPEN…), or
 * `sandbox-relay/1 socket` straight to the proxies' Unix sockets, which the host bind-mounted into
 * the sandbox (a local engine; relay/main.ts `--sockets`), the stream then only keeping the relay's
 * lifetime. Either way the host serves what it is sent: the word is a report, not a permission.
 *
 * The host treats the relay as hostile: a frame of unknown type, a payload over its cap, DATA past
 * the window, a stream id that goes backwards, or anything before READY is a `MuxProtocolError`
 * that ends the whole mux (and with it every stream); an OPEN beyond `MAX_STREAMS` or for a
 * service the host does not serve is refused with RST. Frames for a stream that has already
 * ended are ignored (they may have crossed our RST on the way).
 */

export const FRAME = {
  READY: 1,
  OPEN: 2,
  DATA: 3,
  WINDOW: 4,
  FIN: 5,
  RST: 6,
} as const;
export type FrameType = typeof FRAME[keyof typeof FRAME];

export const HEADER_BYTES = 9;
export const PROTOCOL = "sandbox-relay/1";
/** How a relay carries its connections: over this stream, or to the proxies' sockets itself. */
export type RelayTransport = "stream" | "socket";
/** Largest DATA payload. Writes larger than this are split. */
export const MAX_DATA_BYTES = 128 * 1024;
/** Largest payload of any other frame. */
export const MAX_CONTROL_BYTES = 256;
/** Bytes the relay may send on a new stream before the host grants more (host memory per stream). */
export const HOST_WINDOW_BYTES = 512 * 1024;
/** Bytes the host may send on a new stream before the relay grants more (downloads). */
export const RELAY_WINDOW_BYTES = 8 * 1024 * 1024;
/** Cap on the credit a peer may grant (a sanity bound, far above anything we grant). */
export const MAX_WINDOW_BYTES = 1 << 30;
/** Live streams at once; an OPEN beyond this is refused. */
export const MAX_STREAMS = 256;
/** Highest stream id; the relay that runs out of ids exits and is restarted. */
export const MAX_STREAM_ID = 0xffff_ffff;
/**
 * How many bytes of its DATA a stream may have queued but not yet written out: enough that it
 * keeps reading its connection while a write is under way (no bubbles in the pipe).
 */
const STREAM_QUEUE_BYTES = 4 * MAX_DATA_BYTES;
/** Frames queued together are written out in one write of up to this many bytes. */
const WRITE_BATCH_BYTES = 256 * 1024;

const FRAME_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(FRAME).map(([name, type]) => [type, name]),
);

/** The peer broke the protocol: the mux ends. */
export class MuxProtocolError extends Error {
  override name = "MuxProtocolError";
}

/** A stream ended abruptly: reset by the peer or by us, or the mux itself ended. */
export class StreamResetError extends Error {
  override name = "StreamResetError";
}

export interface Frame {
  type: FrameType;
  stream: number;
  payload: Uint8Array;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** One frame as bytes. */
export function encodeFrame(
  type: FrameType,
  stream: number,
  payload: Uint8Array = new Uint8Array(0),
): Uint8Array {
  const bytes = new Uint8Array(HEADER_BYTES + payload.length);
  writeHeader(bytes, 0, type, stream, payload.length);
  bytes.set(payload, HEADER_BYTES);
  return bytes;
}

function writeHeader(
  into: Uint8Array,
  at: number,
  type: number,
  stream: number,
  length: number,
): void {
  const view = new DataView(into.buffer, into.byteOffset + at, HEADER_BYTES);
  view.setUint8(0, type);
  view.setUint32(1, stream);
  view.setUint32(5, length);
}

function u32(value: number): Uint8Array {
  const bytes = new Uint8Array(4);
  new DataView(bytes.buffer).setUint32(0, value);
  return bytes;
}

/** Largest payload allowed for a frame type, or undefined for an unknown type. */
function payloadCap(type: number): number | undefined {
  switch (type) {
    case FRAME.DATA:
      return MAX_DATA_BYTES;
    case FRAME.WINDOW:
      return 4;
    case FRAME.FIN:
      return 0;
    case FRAME.READY:
    case FRAME.OPEN:
    case FRAME.RST:
      return MAX_CONTROL_BYTES;
    default:
      return undefined;
  }
}

/**
 * Splits a byte stream into frames. Each header is checked before any of its payload is taken.
 * A DATA payload comes out in pieces as its bytes arrive (each piece a view of the input chunk,
 * never a copy: one frame may span chunks, and copying it whole would cost more than the rest of
 * the path); control payloads are small and come out whole.
 */
export class FrameDecoder {
  readonly #header = new Uint8Array(HEADER_BYTES);
  #headerFill = 0;
  /** The DATA frame whose payload is still arriving. */
  #data: { stream: number; remaining: number } | undefined;
  /** The control frame whose payload is still arriving. */
  #control: { type: FrameType; stream: number; payload: Uint8Array; fill: number } | undefined;

  /**
   * The frames (and DATA pieces) completed by `chunk`; raises `MuxProtocolError` on a malformed
   * header.
   */
  push(chunk: Uint8Array): Frame[] {
    const frames: Frame[] = [];
    let at = 0;
    while (at < chunk.length) {
      if (this.#data) {
        const take = Math.min(this.#data.remaining, chunk.length - at);
        frames.push({
          type: FRAME.DATA,
          stream: this.#data.stream,
          payload: chunk.subarray(at, at + take),
        });
        at += take;
        this.#data.remaining -= take;
        if (this.#data.remaining === 0) this.#data = undefined;
        continue;
      }
      if (this.#control) {
        const control = this.#control;
        const take = Math.min(control.payload.length - control.fill, chunk.length - at);
        control.payload.set(chunk.subarray(at, at + take), control.fill);
        control.fill += take;
        at += take;
        if (control.fill === control.payload.length) {
          frames.push({ type: control.type, stream: control.stream, payload: control.payload });
          this.#control = undefined;
        }
        continue;
      }
      const take = Math.min(HEADER_BYTES - this.#headerFill, chunk.length - at);
      this.#header.set(chunk.subarray(at, at + take), this.#headerFill);
      this.#headerFill += take;
      at += take;
      if (this.#headerFill < HEADER_BYTES) break;
      this.#headerFill = 0;
      const view = new DataView(this.#header.buffer);
      const type = view.getUint8(0);
      const stream = view.getUint32(1);
      const length = view.getUint32(5);
      const cap = payloadCap(type);
      if (cap === undefined) throw new MuxProtocolError(`unknown frame type ${type}`);
      if (length > cap) {
        throw new MuxProtocolError(
          `${FRAME_NAMES[type]} frame of ${length} bytes (at most ${cap})`,
        );
      }
      if (type === FRAME.DATA) {
        if (length === 0) throw new MuxProtocolError(`empty DATA frame on stream ${stream}`);
        this.#data = { stream, remaining: length };
      } else if (length === 0) {
        frames.push({ type: type as FrameType, stream, payload: new Uint8Array(0) });
      } else {
        this.#control = {
          type: type as FrameType,
          stream,
          payload: new Uint8Array(length),
          fill: 0,
        };
      }
    }
    return frames;
  }
}

/**
 * Reads a byte source in chunks that are handed over, not copied: the buffer is sized to what
 * reads return (from 16 KiB up to `maxBytes`), a full read is handed over as it is and a new
 * buffer taken, and a read that used little of a big buffer is copied out so the buffer is reused.
 */
export class ChunkReader {
  #buffer: Uint8Array;
  readonly #maxBytes: number;

  constructor(
    readonly read: (buffer: Uint8Array) => Promise<number | null>,
    maxBytes = 256 * 1024,
  ) {
    this.#maxBytes = maxBytes;
    this.#buffer = new Uint8Array(MIN_READ_BYTES);
  }

  /** The next chunk, or null at the end. */
  async next(): Promise<Uint8Array | null> {
    const buffer = this.#buffer;
    const n = await this.read(buffer);
    if (n === null) return null;
    if (n === buffer.length) {
      // Full: hand it over, and read more at once next time.
      this.#buffer = new Uint8Array(Math.min(buffer.length * 2, this.#maxBytes));
      return buffer;
    }
    if (n >= buffer.length / 2) {
      this.#buffer = new Uint8Array(buffer.length);
      return buffer.subarray(0, n);
    }
    // Mostly empty: copy out what came, keep the buffer, and take a smaller one if it stays so.
    if (buffer.length > MIN_READ_BYTES && n < buffer.length / 8) {
      this.#buffer = new Uint8Array(buffer.length / 2);
    }
    return buffer.slice(0, n);
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    for (let chunk = await this.next(); chunk !== null; chunk = await this.next()) yield chunk;
  }
}

const MIN_READ_BYTES = 16 * 1024;

export type MuxRole = "host" | "relay";

export interface MuxOptions {
  /** "host" accepts OPEN and expects READY first; "relay" opens streams and sends READY. */
  role: MuxRole;
  /** Bytes from the peer. The mux ends when it ends. */
  input: AsyncIterable<Uint8Array>;
  /** Send bytes to the peer; resolves when they were taken (backpressure). */
  output: (bytes: Uint8Array) => Promise<void>;
  /** Host: services a relay may open; an OPEN for any other name is refused. */
  services?: readonly string[];
  /** Host: a stream the relay opened for one of `services`. */
  onOpen?: (stream: MuxStream, service: string) => void;
  /** Host: the relay said READY, and how it carries connections. */
  onReady?: (transport: RelayTransport) => void;
  /** Live stream cap (default `MAX_STREAMS`). */
  maxStreams?: number;
}

/**
 * One end of the multiplexed connection. Create it on the two ends of a byte pipe; `done`
 * resolves when the pipe ends (undefined) or the peer broke the protocol (the error). Either way
 * every stream is reset: its reader and writer fail at once.
 */
export class Mux {
  readonly role: MuxRole;
  /** Resolves once the mux has ended: undefined when the input simply ended, else why. */
  readonly done: Promise<Error | undefined>;
  readonly #options: MuxOptions;
  readonly #streams = new Map<number, MuxStream>();
  readonly #services: ReadonlySet<string>;
  readonly #maxStreams: number;
  #highestId = 0;
  #ready = false;
  #ended: Error | undefined | null = null;
  #resolveDone!: (error: Error | undefined) => void;
  /** Frames that are not a stream's data: written before any DATA. */
  readonly #control: Uint8Array[] = [];
  /** DATA and FIN, per stream in order; streams with some queued are served in turn. */
  readonly #outbound = new Map<MuxStream, { bytes: Uint8Array; data: boolean }[]>();
  #pumping = false;

  constructor(options: MuxOptions) {
    this.role = options.role;
    this.#options = options;
    this.#services = new Set(options.services ?? []);
    this.#maxStreams = options.maxStreams ?? MAX_STREAMS;
    this.done = new Promise((resolve) => (this.#resolveDone = resolve));
    void this.#readLoop();
  }

  /** Live streams (for limits and tests). */
  get streamCount(): number {
    return this.#streams.size;
  }

  get ended(): boolean {
    return this.#ended !== null;
  }

  /** Relay: tell the host we listen. */
  sendReady(transport: RelayTransport = "stream"): void {
    if (this.role !== "relay") throw new TypeError("Only the relay sends READY");
    this.#send(
      FRAME.READY,
      0,
      encoder.encode(transport === "socket" ? `${PROTOCOL} socket` : PROTOCOL),
    );
  }

  /** Relay: open a stream to `service`; undefined when at the stream cap or out of ids. */
  open(service: string): MuxStream | undefined {
    if (this.role !== "relay") throw new TypeError("Only the relay opens streams");
    if (this.ended || this.#streams.size >= this.#maxStreams || this.#highestId >= MAX_STREAM_ID) {
      return undefined;
    }
    const id = ++this.#highestId;
    const stream = new MuxStream(this, id);
    this.#streams.set(id, stream);
    this.#send(FRAME.OPEN, id, encoder.encode(service));
    return stream;
  }

  /** End the mux now: every stream is reset; nothing more is sent or read. */
  close(reason?: Error): void {
    this.#end(reason);
  }

  #end(error: Error | undefined): void {
    if (this.#ended !== null) return;
    this.#ended = error;
    const why = new StreamResetError(
      error ? `relay connection failed: ${error.message}` : "relay connection closed",
    );
    for (const stream of this.#streams.values()) stream._terminate(why);
    this.#streams.clear();
    this.#control.length = 0;
    this.#outbound.clear();
    this.#resolveDone(error);
  }

  async #readLoop(): Promise<void> {
    const frames = new FrameDecoder();
    try {
      for await (const chunk of this.#options.input) {
        if (this.ended) return;
        for (const frame of frames.push(chunk)) {
          this.#dispatch(frame);
          if (this.ended) return;
        }
      }
      this.#end(undefined);
    } catch (error) {
      this.#end(error instanceof Error ? error : new Error(String(error)));
    }
  }

  #dispatch(frame: Frame): void {
    const { type, stream: id, payload } = frame;
    if (this.role === "host") {
      if (!this.#ready) {
        if (type !== FRAME.READY || id !== 0) {
          throw new MuxProtocolError(`${FRAME_NAMES[type]} frame before READY`);
        }
        const said = decoder.decode(payload);
        if (said !== PROTOCOL && said !== `${PROTOCOL} socket`) {
          throw new MuxProtocolError(`the relay speaks "${printable(payload)}", not "${PROTOCOL}"`);
        }
        this.#ready = true;
        this.#options.onReady?.(said === PROTOCOL ? "stream" : "socket");
        return;
      }
      if (type === FRAME.READY) throw new MuxProtocolError("a second READY frame");
      if (id === 0) throw new MuxProtocolError(`${FRAME_NAMES[type]} frame on stream 0`);
      if (type === FRAME.OPEN) return this.#accept(id, payload);
      if (id > this.#highestId) {
        throw new MuxProtocolError(`${FRAME_NAMES[type]} frame for stream ${id}, never opened`);
      }
    } else {
      if (type === FRAME.READY || type === FRAME.OPEN) {
        throw new MuxProtocolError(`${FRAME_NAMES[type]} frame from the host`);
      }
      if (id === 0 || id > this.#highestId) {
        throw new MuxProtocolError(`${FRAME_NAMES[type]} frame for stream ${id}, never opened`);
      }
    }
    const stream = this.#streams.get(id);
    // An ended stream: frames that crossed our RST or FIN are dropped.
    if (!stream) return;
    switch (type) {
      case FRAME.DATA:
        stream._receive(payload);
        return;
      case FRAME.WINDOW: {
        const credit = new DataView(payload.buffer, payload.byteOffset, payload.length);
        if (payload.length !== 4 || credit.getUint32(0) === 0) {
          throw new MuxProtocolError(`malformed WINDOW frame on stream ${id}`);
        }
        stream._credit(credit.getUint32(0));
        return;
      }
      case FRAME.FIN:
        stream._receiveFin();
        return;
      case FRAME.RST:
        this.#outbound.delete(stream);
        stream._terminate(
          new StreamResetError(
            `stream reset by the peer${payload.length ? `: ${printable(payload)}` : ""}`,
          ),
        );
        this._forget(stream);
        return;
    }
  }

  /** Host: an OPEN from the relay. */
  #accept(id: number, payload: Uint8Array): void {
    if (id <= this.#highestId) {
      throw new MuxProtocolError(`OPEN for stream ${id} after stream ${this.#highestId}`);
    }
    this.#highestId = id;
    const service = decoder.decode(payload);
    if (!this.#services.has(service)) {
      this.#send(FRAME.RST, id, encoder.encode(`no service "${printable(payload)}"`));
      return;
    }
    if (this.#streams.size >= this.#maxStreams) {
      this.#send(FRAME.RST, id, encoder.encode(`too many streams (at most ${this.#maxStreams})`));
      return;
    }
    const stream = new MuxStream(this, id);
    this.#streams.set(id, stream);
    this.#options.onOpen?.(stream, service);
  }

  /** A stream that has finished both ways or was reset leaves the table. */
  _forget(stream: MuxStream): void {
    if (this.#streams.get(stream.id) === stream) this.#streams.delete(stream.id);
  }

  /** Queue a frame that is no stream's data (READY, OPEN, WINDOW, RST): it goes out first. */
  _sendControl(type: FrameType, id: number, payload?: Uint8Array): void {
    this.#send(type, id, payload);
  }

  #send(type: FrameType, id: number, payload?: Uint8Array): void {
    if (this.ended) return;
    this.#control.push(encodeFrame(type, id, payload));
    void this.#pump();
  }

  /** Queue a stream's DATA (the stream is told when it has been written out) or its FIN, in order. */
  _sendData(stream: MuxStream, payload: Uint8Array | "fin"): void {
    if (this.ended) return;
    let queue = this.#outbound.get(stream);
    if (!queue) this.#outbound.set(stream, queue = []);
    queue.push(
      payload === "fin"
        ? { bytes: encodeFrame(FRAME.FIN, stream.id), data: false }
        : { bytes: payload, data: true },
    );
    void this.#pump();
  }

  /** Drop what a reset stream still had queued. */
  _dropQueued(stream: MuxStream): void {
    this.#outbound.delete(stream);
  }

  /**
   * Write queued frames out, batching what has piled up into one write: control frames first,
   * then one frame from each stream with data in turn, so that a stream with a lot queued (a
   * download) delays another's next frame (an LLM call's) by at most one frame.
   */
  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      while ((this.#control.length > 0 || this.#outbound.size > 0) && !this.ended) {
        const batch: { bytes: Uint8Array; stream?: MuxStream; data: boolean }[] = [];
        let size = 0;
        for (const bytes of this.#control.splice(0)) {
          batch.push({ bytes, data: false });
          size += bytes.length;
        }
        while (size < WRITE_BATCH_BYTES && this.#outbound.size > 0) {
          for (const [stream, queue] of this.#outbound) {
            const entry = queue.shift()!;
            // Served: to the back of the line (a Map keeps insertion order).
            this.#outbound.delete(stream);
            if (queue.length > 0) this.#outbound.set(stream, queue);
            batch.push({ ...entry, stream });
            size += entry.data ? HEADER_BYTES + entry.bytes.length : entry.bytes.length;
            if (size >= WRITE_BATCH_BYTES) break;
          }
        }
        const bytes = new Uint8Array(size);
        let at = 0;
        for (const entry of batch) {
          if (entry.data) {
            writeHeader(bytes, at, FRAME.DATA, entry.stream!.id, entry.bytes.length);
            at += HEADER_BYTES;
          }
          bytes.set(entry.bytes, at);
          at += entry.bytes.length;
        }
        await this.#options.output(bytes);
        for (const entry of batch) if (entry.data) entry.stream!._written(entry.bytes.length);
      }
    } catch (error) {
      this.#end(error instanceof Error ? error : new Error(String(error)));
    } finally {
      this.#pumping = false;
    }
  }
}

/** A deferred that can be waited on more than once and re-armed. */
class Signal {
  #waiters: (() => void)[] = [];
  wait(): Promise<void> {
    return new Promise((resolve) => this.#waiters.push(resolve));
  }
  wake(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const wake of waiters) wake();
  }
}

/** One connection carried over the mux: ordered bytes both ways, half-close, reset. */
export class MuxStream {
  readonly id: number;
  readonly #mux: Mux;
  readonly #inbound: Uint8Array[] = [];
  #remoteFin = false;
  #localFin = false;
  #error: StreamResetError | undefined;
  /** Bytes we may still send. */
  #sendCredit: number;
  /** Bytes the peer may still send us. */
  #receiveAllowance: number;
  /** Credit is granted back in steps of at least this much (fewer WINDOW frames). */
  readonly #updateBytes: number;
  /** Bytes consumed by our reader and not yet granted back. */
  #ungranted = 0;
  /** Bytes of our DATA queued in the mux and not yet written out. */
  #queued = 0;
  readonly #readable = new Signal();
  readonly #writable = new Signal();

  constructor(mux: Mux, id: number) {
    this.#mux = mux;
    this.id = id;
    const [own, peer] = mux.role === "host"
      ? [HOST_WINDOW_BYTES, RELAY_WINDOW_BYTES]
      : [RELAY_WINDOW_BYTES, HOST_WINDOW_BYTES];
    this.#receiveAllowance = own;
    this.#sendCredit = peer;
    this.#updateBytes = own / 4;
  }

  /** Reset (by either side) or ended with the mux. */
  get reset(): boolean {
    return this.#error !== undefined;
  }

  /**
   * The next chunk, in order; `null` once the peer sent FIN and everything before it was read.
   * Raises `StreamResetError` when the stream was reset or the mux ended.
   */
  async read(): Promise<Uint8Array | null> {
    while (true) {
      if (this.#error) throw this.#error;
      const chunk = this.#inbound.shift();
      if (chunk) {
        this.#grant(chunk.length);
        return chunk;
      }
      if (this.#remoteFin) return null;
      await this.#readable.wait();
    }
  }

  /** Give the peer back the credit for bytes our reader took, in steps. */
  #grant(bytes: number): void {
    if (this.#remoteFin) return;
    this.#ungranted += bytes;
    if (this.#ungranted < this.#updateBytes && this.#inbound.length > 0) return;
    if (this.#ungranted < this.#updateBytes && this.#receiveAllowance >= this.#updateBytes) {
      return;
    }
    this.#receiveAllowance += this.#ungranted;
    this.#mux._sendControl(FRAME.WINDOW, this.id, u32(this.#ungranted));
    this.#ungranted = 0;
  }

  /**
   * Send `bytes` (not copied: do not reuse the buffer). Resolves when they are queued within the
   * peer's window; waits while the window is spent or too much of this stream is queued.
   */
  async write(bytes: Uint8Array): Promise<void> {
    let rest = bytes;
    while (rest.length > 0) {
      if (this.#error) throw this.#error;
      if (this.#localFin) throw new StreamResetError("write after closeWrite()");
      if (this.#sendCredit === 0 || this.#queued >= STREAM_QUEUE_BYTES) {
        await this.#writable.wait();
        continue;
      }
      const size = Math.min(rest.length, this.#sendCredit, MAX_DATA_BYTES);
      this.#sendCredit -= size;
      this.#queued += size;
      this.#mux._sendData(this, rest.subarray(0, size));
      rest = rest.subarray(size);
    }
  }

  /** Half-close: no more data from us; the peer's reader sees the end after what was sent. */
  closeWrite(): void {
    if (this.#localFin || this.#error) return;
    this.#localFin = true;
    // Behind this stream's queued DATA, never ahead of it.
    this.#mux._sendData(this, "fin");
    if (this.#remoteFin) this.#mux._forget(this);
  }

  /** Abort both directions, telling the peer. */
  resetStream(reason = ""): void {
    if (this.#error) return;
    this.#mux._dropQueued(this);
    this.#mux._sendControl(
      FRAME.RST,
      this.id,
      encoder.encode(reason.slice(0, MAX_CONTROL_BYTES / 4)),
    );
    this._terminate(new StreamResetError(reason ? `stream reset: ${reason}` : "stream reset"));
    this.#mux._forget(this);
  }

  /** @internal DATA arrived. */
  _receive(payload: Uint8Array): void {
    if (this.#remoteFin) throw new MuxProtocolError(`DATA after FIN on stream ${this.id}`);
    if (payload.length > this.#receiveAllowance) {
      throw new MuxProtocolError(`DATA beyond the window on stream ${this.id}`);
    }
    this.#receiveAllowance -= payload.length;
    this.#inbound.push(payload);
    this.#readable.wake();
  }

  /** @internal FIN arrived. */
  _receiveFin(): void {
    if (this.#remoteFin) throw new MuxProtocolError(`a second FIN on stream ${this.id}`);
    this.#remoteFin = true;
    this.#readable.wake();
    if (this.#localFin) this.#mux._forget(this);
  }

  /** @internal WINDOW arrived. */
  _credit(bytes: number): void {
    if (this.#sendCredit + bytes > MAX_WINDOW_BYTES) {
      throw new MuxProtocolError(`window over ${MAX_WINDOW_BYTES} bytes on stream ${this.id}`);
    }
    this.#sendCredit += bytes;
    this.#writable.wake();
  }

  /** @internal Some of our DATA was written out. */
  _written(bytes: number): void {
    this.#queued -= bytes;
    if (this.#queued < STREAM_QUEUE_BYTES) this.#writable.wake();
  }

  /** @internal Reset by the peer, by us, or by the end of the mux. */
  _terminate(error: StreamResetError): void {
    if (this.#error) return;
    this.#error = error;
    this.#inbound.length = 0;
    this.#readable.wake();
    this.#writable.wake();
  }
}

/** A socket-like connection: what `Deno.Conn` offers (TCP inside, Unix on the host). */
export interface ByteConn {
  read(buffer: Uint8Array): Promise<number | null>;
  write(bytes: Uint8Array): Promise<number>;
  closeWrite(): Promise<void>;
  close(): void;
}

/** Largest read from a connection into one DATA write. */
const CONN_READ_BYTES = 256 * 1024;

/**
 * Carry `conn` over `stream` both ways until both directions have ended. A half-close on either
 * side is passed on; a failure on either side resets the stream and closes the connection, so
 * neither end waits for the other for ever.
 */
export async function pipeStream(stream: MuxStream, conn: ByteConn): Promise<void> {
  const up = (async () => {
    const reader = new ChunkReader((buffer) => conn.read(buffer), CONN_READ_BYTES);
    for (let chunk = await reader.next(); chunk !== null; chunk = await reader.next()) {
      await stream.write(chunk);
    }
    stream.closeWrite();
  })();
  const down = (async () => {
    while (true) {
      const chunk = await stream.read();
      if (chunk === null) break;
      let rest = chunk;
      while (rest.length > 0) rest = rest.subarray(await conn.write(rest));
    }
    // A connection already closed (its peer went away) has no write side left to close.
    await conn.closeWrite().catch(() => {});
  })();
  try {
    await Promise.all([up, down]);
  } catch (error) {
    stream.resetStream(
      error instanceof StreamResetError ? "" : error instanceof Error ? error.name : "error",
    );
    try {
      conn.close();
    } catch {
      // Already closed.
    }
    await Promise.allSettled([up, down]);
    return;
  }
  try {
    conn.close();
  } catch {
    // Already closed.
  }
}

/** A peer-chosen name, safe to put in a message. */
function printable(bytes: Uint8Array): string {
  return decoder.decode(bytes.subarray(0, 64)).replace(/[^\x20-\x7e]/g, "?");
}
