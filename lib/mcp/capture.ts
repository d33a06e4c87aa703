/**
 * Command output kept to a bound: the first bytes are kept, the rest counted and read to the end
 * (never cut off early: the command must not block on a full pipe).
 */

/** Output as text, with how many bytes were left out. */
export interface Captured {
  text: string;
  /** Bytes read past the bound, not kept. */
  omittedBytes: number;
}

/** Read `stream` to its end, keeping its first `maxBytes` bytes. */
export async function captureBytes(
  stream: ReadableStream<Uint8Array>,
  maxBytes: number,
): Promise<Captured> {
  const kept: Uint8Array[] = [];
  let keptBytes = 0;
  let omittedBytes = 0;
  for await (const chunk of stream) {
    const room = Math.max(0, maxBytes - keptBytes);
    if (room > 0) {
      const part = chunk.subarray(0, room);
      kept.push(part);
      keptBytes += part.byteLength;
    }
    omittedBytes += chunk.byteLength - Math.min(room, chunk.byteLength);
  }
  const text = new TextDecoder().decode(concat(kept, keptBytes));
  return { text, omittedBytes };
}

function concat(parts: Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}

/** Lines (stderr, as they arrive) kept up to `maxBytes` of text; the rest counted. */
export class CapturedLines {
  readonly #maxBytes: number;
  readonly #encoder = new TextEncoder();
  #text = "";
  #keptBytes = 0;
  #omittedBytes = 0;

  constructor(maxBytes: number) {
    this.#maxBytes = maxBytes;
  }

  add(line: string): void {
    const bytes = this.#encoder.encode(line + "\n");
    const room = this.#maxBytes - this.#keptBytes;
    if (bytes.byteLength <= room) {
      this.#text += line + "\n";
      this.#keptBytes += bytes.byteLength;
    } else {
      this.#keptBytes = this.#maxBytes;
      this.#omittedBytes += bytes.byteLength;
    }
  }

  result(): Captured {
    return { text: this.#text, omittedBytes: this.#omittedBytes };
  }
}
