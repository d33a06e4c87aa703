/**
 * Exact-length reads from a byte stream, for parsers of binary formats that arrive in chunks of
 * any size (a tar stream, `git cat-file --batch`): a record is whole whatever the chunk
 * boundaries, and the caller holds one record (or one piece of a body) at a time, never the
 * stream.
 */

/** A reader of `stream` in pieces the parser chooses. */
export class ByteReader {
  #reader: ReadableStreamDefaultReader<Uint8Array>;
  #chunk: Uint8Array = new Uint8Array(0);
  #offset = 0;
  #ended = false;
  /** Bytes handed out so far. */
  position = 0;

  constructor(stream: ReadableStream<Uint8Array>) {
    this.#reader = stream.getReader();
  }

  /** Whether a byte is buffered, reading the next non-empty chunk if not; false at the end. */
  async #fill(): Promise<boolean> {
    while (this.#offset === this.#chunk.byteLength) {
      if (this.#ended) return false;
      const { value, done } = await this.#reader.read();
      if (done) {
        this.#ended = true;
        return false;
      }
      this.#chunk = value;
      this.#offset = 0;
    }
    return true;
  }

  /**
   * Up to `max` bytes (at least one), or null at the end of the stream. The bytes are a view of
   * the stream's own chunk: use them before the next read.
   */
  async some(max: number): Promise<Uint8Array | null> {
    if (!await this.#fill()) return null;
    const length = Math.min(max, this.#chunk.byteLength - this.#offset);
    const piece = this.#chunk.subarray(this.#offset, this.#offset + length);
    this.#offset += length;
    this.position += length;
    return piece;
  }

  /** Exactly `length` bytes, or fewer only where the stream ends (none at its end). */
  async exact(length: number): Promise<Uint8Array> {
    const first = await this.some(length);
    if (!first || first.byteLength === length) return first ?? new Uint8Array(0);
    const out = new Uint8Array(length);
    out.set(first);
    let filled = first.byteLength;
    while (filled < length) {
      const piece = await this.some(length - filled);
      if (!piece) return out.subarray(0, filled);
      out.set(piece, filled);
      filled += piece.byteLength;
    }
    return out;
  }

  /**
   * The bytes up to a newline (not included; the newline is consumed), or null at the end of the
   * stream. Undefined when `max` bytes pass without a newline, or the stream ends inside a line.
   */
  async line(max: number): Promise<Uint8Array | null | undefined> {
    const parts: Uint8Array[] = [];
    let length = 0;
    while (await this.#fill()) {
      const newline = this.#chunk.indexOf(10, this.#offset);
      const end = newline === -1 ? this.#chunk.byteLength : newline;
      if (length + end - this.#offset > max) return undefined;
      parts.push(this.#chunk.slice(this.#offset, end));
      length += end - this.#offset;
      this.position += end - this.#offset + (newline === -1 ? 0 : 1);
      this.#offset = newline === -1 ? end : end + 1;
      if (newline !== -1) return concat(parts, length);
    }
    return parts.length === 0 ? null : undefined;
  }

  /** Stop reading: the stream is cancelled (its producer sees a closed pipe). */
  async cancel(reason?: unknown): Promise<void> {
    await this.#reader.cancel(reason);
  }
}

function concat(parts: Uint8Array[], length: number): Uint8Array {
  if (parts.length === 1) return parts[0];
  const out = new Uint8Array(length);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}
