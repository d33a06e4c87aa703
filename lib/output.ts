/**
 * The one writer to stdout. A closed pipe (`sandbox ... | head`) is a normal end: writes after it
 * are dropped and `closed` turns true, so callers can stop producing.
 */
export class StdoutWriter {
  #closed = false;
  readonly #encoder = new TextEncoder();
  readonly #out: { write(p: Uint8Array): Promise<number> };

  constructor(out: { write(p: Uint8Array): Promise<number> } = Deno.stdout) {
    this.#out = out;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Write text as is. */
  async write(text: string): Promise<void> {
    if (this.#closed) return;
    let bytes = this.#encoder.encode(text);
    try {
      while (bytes.length > 0) {
        const n = await this.#out.write(bytes);
        bytes = bytes.subarray(n);
      }
    } catch (error) {
      if (error instanceof Deno.errors.BrokenPipe) this.#closed = true;
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

/** Render rows as left-aligned columns under a header, for humans. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const render = (row: readonly string[]) =>
    row.map((cell, i) => i === row.length - 1 ? cell : cell.padEnd(widths[i])).join("  ").trimEnd();
  return [render(header), ...rows.map(render)].join("\n");
}
