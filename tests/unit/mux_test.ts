/**
 * The relay's framing (lib/proxy/mux.ts): two muxes joined by in-memory pipes, and a host mux
 * fed hand-made bytes the way a hostile relay would send them.
 */
import assert from "node:assert/strict";
import {
  ChunkReader,
  encodeFrame,
  FRAME,
  FrameDecoder,
  HEADER_BYTES,
  HOST_WINDOW_BYTES,
  MAX_DATA_BYTES,
  Mux,
  MuxProtocolError,
  type MuxStream,
  PROTOCOL,
  RELAY_WINDOW_BYTES,
  StreamResetError,
} from "../../lib/proxy/mux.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A one-way in-memory pipe: what one side outputs, the other reads. */
class Pipe implements AsyncIterable<Uint8Array> {
  #chunks: Uint8Array[] = [];
  #ended = false;
  #wake: (() => void) | undefined;
  /** Every byte that went through, for inspection. */
  written = 0;

  push(bytes: Uint8Array): Promise<void> {
    if (this.#ended) return Promise.reject(new Error("pipe closed"));
    // Copied: the writer may reuse its buffer once this resolves, as a real pipe allows.
    this.#chunks.push(bytes.slice());
    this.written += bytes.length;
    this.#wake?.();
    return Promise.resolve();
  }

  end(): void {
    this.#ended = true;
    this.#wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    while (true) {
      const chunk = this.#chunks.shift();
      if (chunk) {
        yield chunk;
        continue;
      }
      if (this.#ended) return;
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = undefined;
    }
  }
}

/** A relay mux and a host mux joined by two pipes; streams the relay opens arrive in `opened`. */
function joined(services = ["llm", "egress"]) {
  const up = new Pipe();
  const down = new Pipe();
  const opened: { stream: MuxStream; service: string }[] = [];
  const arrivals: (() => void)[] = [];
  let ready!: () => void;
  const readied = new Promise<void>((resolve) => (ready = resolve));
  const host = new Mux({
    role: "host",
    input: up,
    output: (bytes) => down.push(bytes),
    services,
    onOpen: (stream, service) => {
      opened.push({ stream, service });
      arrivals.shift()?.();
    },
    onReady: ready,
  });
  const relay = new Mux({ role: "relay", input: down, output: (bytes) => up.push(bytes) });
  relay.sendReady();
  /** The host side of the next stream the relay opens. */
  const accepted = async (): Promise<{ stream: MuxStream; service: string }> => {
    if (opened.length === 0) await new Promise<void>((resolve) => arrivals.push(resolve));
    return opened.shift()!;
  };
  return { host, relay, up, down, readied, accepted };
}

async function readAll(stream: MuxStream): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for (let chunk = await stream.read(); chunk !== null; chunk = await stream.read()) {
    chunks.push(chunk);
  }
  const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const chunk of chunks) {
    all.set(chunk, at);
    at += chunk.length;
  }
  return all;
}

function pattern(size: number, seed: number): Uint8Array {
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 31 + seed) & 0xff;
  return bytes;
}

/** Rejects if `promise` is still pending after `ms`: every wait in these tests has a deadline. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  const late = new Promise<never>((
    _,
    reject,
  ) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** A host mux fed exactly `bytes` by a fake relay; what it answered and how it ended. */
async function hostFed(
  bytes: Uint8Array[],
  options: { services?: string[]; maxStreams?: number } = {},
) {
  const input = new Pipe();
  const answers: Uint8Array[] = [];
  const opened: number[] = [];
  const host = new Mux({
    role: "host",
    input,
    output: (b) => {
      answers.push(b.slice());
      return Promise.resolve();
    },
    services: options.services ?? ["llm"],
    maxStreams: options.maxStreams,
    onOpen: (stream) => opened.push(stream.id),
  });
  for (const chunk of bytes) await input.push(chunk);
  input.end();
  const error = await within(host.done, 2_000, "host mux end");
  // Let the writer flush what it queued before the end.
  await new Promise((resolve) => setTimeout(resolve, 0));
  const frames = new FrameDecoder().push(concat(answers));
  return { error, frames, opened };
}

function concat(parts: Uint8Array[]): Uint8Array {
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    all.set(part, at);
    at += part.length;
  }
  return all;
}

const READY = encodeFrame(FRAME.READY, 0, encoder.encode(PROTOCOL));
const open = (id: number, service = "llm") => encodeFrame(FRAME.OPEN, id, encoder.encode(service));

Deno.test("frames decode the same whatever the chunk boundaries, DATA in pieces that are views of the input", () => {
  const frames = [
    encodeFrame(FRAME.READY, 0, encoder.encode(PROTOCOL)),
    encodeFrame(FRAME.OPEN, 1, encoder.encode("llm")),
    encodeFrame(FRAME.DATA, 1, pattern(1000, 1)),
    encodeFrame(FRAME.FIN, 1),
  ];
  const bytes = concat(frames);
  for (const size of [1, 2, 5, 9, 10, 100, bytes.length]) {
    const splitter = new FrameDecoder();
    const out = [];
    for (let at = 0; at < bytes.length; at += size) {
      out.push(...splitter.push(bytes.subarray(at, at + size)));
    }
    // A DATA payload comes in pieces as it arrives, each a view of the input; the rest whole.
    const data = out.filter((f) => f.type === FRAME.DATA);
    assert.ok(
      data.every((f) =>
        f.stream === 1 && f.payload.length > 0 && f.payload.buffer === bytes.buffer
      ),
    );
    assert.deepEqual(concat(data.map((f) => f.payload)), pattern(1000, 1), `chunks of ${size}`);
    assert.deepEqual(
      out.filter((f) => f.type !== FRAME.DATA).map((
        f,
      ) => [f.type, f.stream, decoder.decode(f.payload)]),
      [[FRAME.READY, 0, PROTOCOL], [FRAME.OPEN, 1, "llm"], [FRAME.FIN, 1, ""]],
      `chunks of ${size}`,
    );
  }
});

Deno.test("ChunkReader hands full reads over without copying, copies small ones out, and grows its buffer to the reads", async () => {
  const source = [70_000, 70_000, 100, 5];
  let handed: Uint8Array | undefined;
  const reader = new ChunkReader((buffer) => {
    const size = source.shift();
    if (size === undefined) return Promise.resolve(null);
    const n = Math.min(size, buffer.length);
    buffer.fill(n % 251, 0, n);
    handed = buffer;
    return Promise.resolve(n);
  }, 64 * 1024);
  const first = (await reader.next())!;
  assert.equal(first.length, 16 * 1024, "the first read fills the initial 16 KiB buffer");
  assert.equal(first.buffer, handed!.buffer, "a full read is handed over, not copied");
  const second = (await reader.next())!;
  assert.equal(second.length, 32 * 1024, "the buffer doubled after a full read");
  const third = (await reader.next())!;
  assert.equal(third.length, 100);
  assert.notEqual(third.buffer, handed!.buffer, "a small read is copied out");
  assert.deepEqual([...new Set(third)], [100]);
  assert.equal((await reader.next())!.length, 5);
  assert.equal(await reader.next(), null);
});

Deno.test("a header announcing an oversized payload is refused before any of the payload is held", () => {
  const header = new Uint8Array(HEADER_BYTES);
  const view = new DataView(header.buffer);
  view.setUint8(0, FRAME.DATA);
  view.setUint32(1, 1);
  view.setUint32(5, 0xffff_ffff);
  assert.throws(() => new FrameDecoder().push(header), MuxProtocolError);
  view.setUint32(5, MAX_DATA_BYTES + 1);
  assert.throws(
    () => new FrameDecoder().push(header),
    new RegExp(`DATA frame of ${MAX_DATA_BYTES + 1} bytes`),
  );
  view.setUint8(0, 99);
  assert.throws(() => new FrameDecoder().push(header), /unknown frame type 99/);
});

Deno.test("bytes arrive in order on each stream, and interleaved streams keep theirs apart", async () => {
  const { relay, readied, accepted, host } = joined();
  await within(readied, 2_000, "READY");
  const a = relay.open("llm")!;
  const b = relay.open("egress")!;
  const first = await within(accepted(), 2_000, "first OPEN");
  const second = await within(accepted(), 2_000, "second OPEN");
  assert.deepEqual([first.service, second.service], ["llm", "egress"]);
  const sentA: Uint8Array[] = [];
  const sentB: Uint8Array[] = [];
  const reads = Promise.all([readAll(first.stream), readAll(second.stream)]);
  // Writes of many sizes, alternating between the streams, so frames interleave on the wire.
  for (let i = 0; i < 200; i++) {
    const pa = pattern(1 + (i * 977) % 70_000, i);
    const pb = pattern(1 + (i * 613) % 3_000, i + 7);
    sentA.push(pa);
    sentB.push(pb);
    await Promise.all([a.write(pa), b.write(pb)]);
  }
  a.closeWrite();
  b.closeWrite();
  const [gotA, gotB] = await within(reads, 5_000, "reads");
  assert.deepEqual(gotA, concat(sentA));
  assert.deepEqual(gotB, concat(sentB));
  relay.close();
  host.close();
});

Deno.test("a reader that never reads stalls only its own stream: its writer stops at the window while another stream moves 16 MiB", async (t) => {
  for (const direction of ["relay to host (uploads)", "host to relay (downloads)"] as const) {
    await t.step(direction, async () => {
      const { relay, readied, accepted, host, up, down } = joined();
      await within(readied, 2_000, "READY");
      const stalledRelay = relay.open("egress")!;
      const busyRelay = relay.open("llm")!;
      const stalledHost = (await accepted()).stream;
      const busyHost = (await accepted()).stream;
      assert.equal(stalledHost.id, stalledRelay.id);
      const toHost = direction.startsWith("relay");
      const [stalledWriter, stalledReader, busyWriter, busyReader] = toHost
        ? [stalledRelay, stalledHost, busyRelay, busyHost]
        : [stalledHost, stalledRelay, busyHost, busyRelay];
      const window = toHost ? HOST_WINDOW_BYTES : RELAY_WINDOW_BYTES;
      const wire = toHost ? up : down;

      // The stalled stream's writer: it gets exactly one window's worth out, then waits.
      let stalledSent = 0;
      let resumed!: () => void;
      const resumedPast = new Promise<void>((resolve) => (resumed = resolve));
      const writing = (async () => {
        while (true) {
          await stalledWriter.write(pattern(MAX_DATA_BYTES, 3));
          stalledSent += MAX_DATA_BYTES;
          if (stalledSent > window) resumed();
        }
      })().catch((error) => error);

      const total = 16 * 1024 * 1024;
      const receiving = readAll(busyReader);
      for (let sent = 0; sent < total; sent += MAX_DATA_BYTES) {
        await busyWriter.write(pattern(MAX_DATA_BYTES, 5));
      }
      busyWriter.closeWrite();
      const received = await within(receiving, 10_000, "the busy stream");
      assert.equal(received.length, total);
      assert.equal(stalledSent, window, "the stalled stream sent past its window, or less than it");
      assert.ok(wire.written < total + 2 * window, "more was buffered than the windows allow");

      // Once its reader reads, the stalled stream moves again.
      let read = 0;
      while (read <= window / 2) {
        read += (await within(stalledReader.read(), 2_000, "stalled data"))!.length;
      }
      await within(resumedPast, 2_000, "the stalled stream resuming");
      relay.close();
      host.close();
      assert.ok(await writing instanceof StreamResetError);
    });
  }
});

Deno.test("half-close: after one side's FIN the other direction still flows, and each reader sees its end", async () => {
  const { relay, readied, accepted, host } = joined();
  await readied;
  const client = relay.open("llm")!;
  const server = (await accepted()).stream;
  await client.write(encoder.encode("request"));
  client.closeWrite();
  assert.equal(decoder.decode(await within(readAll(server), 2_000, "request")), "request");
  await server.write(encoder.encode("response after the request ended"));
  server.closeWrite();
  assert.equal(
    decoder.decode(await within(readAll(client), 2_000, "response")),
    "response after the request ended",
  );
  await assert.rejects(() => client.write(encoder.encode("more")), StreamResetError);
  // Both directions ended: the stream has left both tables.
  assert.equal(host.streamCount, 0);
  assert.equal(relay.streamCount, 0);
  relay.close();
  host.close();
});

Deno.test("abrupt close: a reset fails the peer's reader and writer at once; the end of the mux fails every stream", async (t) => {
  await t.step("reset by one side", async () => {
    const { relay, readied, accepted, host } = joined();
    await readied;
    const client = relay.open("llm")!;
    const server = (await accepted()).stream;
    const pending = server.read();
    client.resetStream("client went away");
    await assert.rejects(
      () => within(pending, 2_000, "reader"),
      /stream reset by the peer: client went away/,
    );
    await assert.rejects(() => server.write(encoder.encode("x")), StreamResetError);
    relay.close();
    host.close();
  });
  await t.step("the pipe ends", async () => {
    const { relay, readied, accepted, host, up, down } = joined();
    await readied;
    const one = relay.open("llm")!;
    const two = relay.open("egress")!;
    const hostOne = (await accepted()).stream;
    await accepted();
    const reads = [one.read(), two.read(), hostOne.read()].map((p) =>
      p.then(() => "data", (e) => e.name)
    );
    up.end();
    down.end();
    assert.deepEqual(await within(Promise.all(reads), 2_000, "reads"), [
      "StreamResetError",
      "StreamResetError",
      "StreamResetError",
    ]);
    assert.equal(await host.done, undefined);
    await assert.rejects(() => one.write(encoder.encode("x")), StreamResetError);
    assert.equal(relay.open("llm"), undefined);
  });
});

Deno.test("garbage from the relay ends the host mux with a protocol error", async (t) => {
  await t.step("random bytes", async () => {
    const { error } = await hostFed([crypto.getRandomValues(new Uint8Array(4096))]);
    assert.ok(error instanceof MuxProtocolError, String(error));
  });
  await t.step("anything before READY", async () => {
    const { error } = await hostFed([open(1)]);
    assert.match(String(error), /OPEN frame before READY/);
  });
  await t.step("READY with another protocol", async () => {
    const { error } = await hostFed([
      encodeFrame(FRAME.READY, 0, encoder.encode("sandbox-relay/9")),
    ]);
    assert.match(String(error), /speaks "sandbox-relay\/9"/);
  });
  await t.step("a second READY", async () => {
    const { error } = await hostFed([READY, READY]);
    assert.match(String(error), /second READY/);
  });
  await t.step("DATA for a stream never opened", async () => {
    const { error } = await hostFed([READY, encodeFrame(FRAME.DATA, 7, encoder.encode("x"))]);
    assert.match(String(error), /DATA frame for stream 7, never opened/);
  });
  await t.step("a stream id going backwards", async () => {
    const { error, opened } = await hostFed([READY, open(5), open(3)]);
    assert.deepEqual(opened, [5]);
    assert.match(String(error), /OPEN for stream 3 after stream 5/);
  });
  await t.step("DATA past the window", async () => {
    const frames = [READY, open(1)];
    for (let sent = 0; sent <= HOST_WINDOW_BYTES; sent += MAX_DATA_BYTES) {
      frames.push(encodeFrame(FRAME.DATA, 1, new Uint8Array(MAX_DATA_BYTES)));
    }
    const { error } = await hostFed(frames);
    assert.match(String(error), /DATA beyond the window on stream 1/);
  });
  await t.step("a window credit past the cap", async () => {
    const credit = new Uint8Array(4);
    new DataView(credit.buffer).setUint32(0, 0xffff_ffff);
    const { error } = await hostFed([READY, open(1), encodeFrame(FRAME.WINDOW, 1, credit)]);
    assert.match(String(error), /window over/);
  });
  await t.step("an oversized frame header", async () => {
    const header = new Uint8Array(HEADER_BYTES);
    new DataView(header.buffer).setUint8(0, FRAME.DATA);
    new DataView(header.buffer).setUint32(1, 1);
    new DataView(header.buffer).setUint32(5, 100 * 1024 * 1024);
    const { error } = await hostFed([READY, open(1), header]);
    assert.match(String(error), /DATA frame of 104857600 bytes/);
  });
  await t.step("the same stream traffic, well formed, is accepted (positive twin)", async () => {
    const { error, opened, frames } = await hostFed([
      READY,
      open(1),
      encodeFrame(FRAME.DATA, 1, new Uint8Array(MAX_DATA_BYTES)),
      encodeFrame(FRAME.FIN, 1),
    ]);
    assert.equal(error, undefined);
    assert.deepEqual(opened, [1]);
    assert.deepEqual(frames.filter((f) => f.type === FRAME.RST), []);
  });
});

Deno.test("limits: an OPEN for a service not served, or beyond the stream cap, is refused with RST and the mux lives on", async () => {
  const { error, opened, frames } = await hostFed(
    [
      READY,
      open(1, "llm"),
      open(2, "docker"),
      open(3, "llm"),
      open(4, "llm"),
      encodeFrame(FRAME.DATA, 2, encoder.encode("x")),
    ],
    { maxStreams: 2 },
  );
  assert.equal(error, undefined, "a refused OPEN must not end the mux");
  assert.deepEqual(opened, [1, 3]);
  const resets = frames.filter((f) => f.type === FRAME.RST);
  assert.deepEqual(resets.map((f) => [f.stream, decoder.decode(f.payload)]), [
    [2, 'no service "docker"'],
    [4, "too many streams (at most 2)"],
  ]);
});

Deno.test("the relay side refuses frames only a relay may send", async () => {
  const input = new Pipe();
  const relay = new Mux({ role: "relay", input, output: () => Promise.resolve() });
  await input.push(open(1));
  assert.match(String(await within(relay.done, 2_000, "relay end")), /OPEN frame from the host/);
});

Deno.test("READY reports how the relay carries connections: the stream, or the sockets; any other word ends the mux", async (t) => {
  const readyWith = async (payload: string) => {
    const input = new Pipe();
    const said: string[] = [];
    const host = new Mux({
      role: "host",
      input,
      output: () => Promise.resolve(),
      services: ["llm"],
      onReady: (transport) => said.push(transport),
    });
    await input.push(encodeFrame(FRAME.READY, 0, encoder.encode(payload)));
    input.end();
    return { error: await within(host.done, 2_000, "host mux end"), said };
  };
  await t.step("the relay's own READY, both ways", async () => {
    for (const transport of ["stream", "socket"] as const) {
      const up = new Pipe();
      const said: string[] = [];
      const readied = Promise.withResolvers<void>();
      const host = new Mux({
        role: "host",
        input: up,
        output: () => Promise.resolve(),
        onReady: (word) => {
          said.push(word);
          readied.resolve();
        },
      });
      const relay = new Mux({
        role: "relay",
        input: new Pipe(),
        output: (bytes) => up.push(bytes),
      });
      relay.sendReady(transport);
      await within(readied.promise, 2_000, "READY");
      assert.deepEqual(said, [transport]);
      relay.close();
      host.close();
    }
  });
  await t.step("on the wire", async () => {
    assert.deepEqual(await readyWith(PROTOCOL), { error: undefined, said: ["stream"] });
    assert.deepEqual(await readyWith(`${PROTOCOL} socket`), { error: undefined, said: ["socket"] });
  });
  await t.step("another word, or more after it, is a protocol error", async () => {
    for (
      const payload of [
        `${PROTOCOL} sockets`,
        `${PROTOCOL} socket `,
        `${PROTOCOL}  socket`,
        `${PROTOCOL} tcp`,
      ]
    ) {
      const { error, said } = await readyWith(payload);
      assert.ok(error instanceof MuxProtocolError, `${payload}: ${error}`);
      assert.deepEqual(said, []);
    }
  });
});
