/**
 * The one writer to stdout. A closed pipe (`sandbox ... | head`) is a normal end: writes after it
 * are dropped and `closed` turns true, so callers can stop producing.
 */
export class StdoutWriter {
  #closed = false;
  readonly #encoder = new TextEncoder();
  readonly #out: { write(p: Uint8Array): Promise<number> };
  readonly #buffered: boolean;
  /** Buffered mode: text waiting for the write in flight to finish. */
  #pending = "";
  #flushing: Promise<void> | undefined;

  /**
   * With `buffered`, `write()` returns at once while a write is in flight and the text joins the
   * next write (order kept, far fewer writes per event); it waits only past 1 MiB of backlog.
   * The owner must `flush()` before exiting.
   */
  constructor(
    out: { write(p: Uint8Array): Promise<number> } = Deno.stdout,
    options: { buffered?: boolean } = {},
  ) {
    this.#out = out;
    this.#buffered = options.buffered ?? false;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Write text as is. */
  async write(text: string): Promise<void> {
    if (this.#closed) return;
    if (!this.#buffered) return await this.#writeNow(text);
    this.#pending += text;
    this.#flushing ??= this.#drain();
    if (this.#pending.length > BACKLOG_CHARS) await this.flush();
  }

  /** Resolves when everything written so far has reached the file descriptor. */
  async flush(): Promise<void> {
    while (this.#flushing) await this.#flushing;
  }

  async #drain(): Promise<void> {
    try {
      while (this.#pending && !this.#closed) {
        const text = this.#pending;
        this.#pending = "";
        await this.#writeNow(text);
      }
    } finally {
      this.#flushing = undefined;
    }
  }

  async #writeNow(text: string): Promise<void> {
    let bytes = this.#encoder.encode(text);
    try {
      while (bytes.length > 0) {
        const n = await this.#out.write(bytes);
        bytes = bytes.subarray(n);
      }
    } catch (error) {
      if (isGoneOutput(error)) this.#closed = true;
      else throw error;
    }
  }

  /** Write one line (a newline is added). */
  line(text: string): Promise<void> {
    return this.write(text + "\n");
  }

  /** Write one JSON value as one line. */
  json(value: unknown): Promise<void> {
    return this.line(JSON.stringify(value));
  }
}

const BACKLOG_CHARS = 1024 * 1024;

/** Render rows as left-aligned columns under a header, for humans. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const render = (row: readonly string[]) =>
    row.map((cell, i) => i === row.length - 1 ? cell : cell.padEnd(widths[i])).join("  ").trimEnd();
  return [render(header), ...rows.map(render)].join("\n");
}

/**
 * A write to an output nobody reads any more: a closed pipe, or a terminal hung up (closed, or its
 * ssh connection lost: EIO) under a supervisor that outlives it.
 */
export function isGoneOutput(error: unknown): boolean {
  return error instanceof Deno.errors.BrokenPipe ||
    (error instanceof Error && (error as { code?: unknown }).code === "EIO");
}
