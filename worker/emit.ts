/**
 * The worker's only way to stdout: one `AgenticMessage` per line, flushed per line. Enforces the
 * run contract: exactly one `result`, then one `usage`, then nothing. A closed stdout (the host
 * went away) is a normal end: later messages are dropped.
 */
import { type AgenticMessageInit, type DriverUsage, encodeMessage } from "../lib/run/protocol.ts";
import { StdoutWriter } from "../lib/output.ts";

export class Emitter {
  readonly #out: StdoutWriter;
  #resultSent = false;
  #usageSent = false;

  constructor(out: StdoutWriter = new StdoutWriter()) {
    this.#out = out;
  }

  /** Whether stdout was closed by the reader: nobody listens any more, so stop working. */
  get closed(): boolean {
    return this.#out.closed;
  }

  /** Whether the one `result` has been written. */
  get resultSent(): boolean {
    return this.#resultSent;
  }

  /** A `thinking`, `tool_call` or `tool_result` message. */
  async event(message: AgenticMessageInit): Promise<void> {
    if (message.type === "result" || message.type === "usage") {
      throw new TypeError(`Use result() or usage() for a "${message.type}" message`);
    }
    if (this.#resultSent) throw new Error(`Cannot emit "${message.type}" after the result`);
    await this.#out.line(encodeMessage(message));
  }

  /** The run's one result. */
  async result(content: string, options: { isError?: boolean; model?: string | null } = {}) {
    if (this.#resultSent) throw new Error("Cannot emit a second result");
    this.#resultSent = true;
    await this.#out.line(encodeMessage({
      type: "result",
      content,
      is_error: options.isError ?? false,
      model: options.model ?? null,
    }));
  }

  /** The last line of a run. */
  async usage(usage: Partial<DriverUsage>): Promise<void> {
    if (!this.#resultSent) throw new Error("Cannot emit usage before the result");
    if (this.#usageSent) throw new Error("Cannot emit a second usage");
    this.#usageSent = true;
    await this.#out.line(encodeMessage({ type: "usage", usage, model: usage.model ?? null }));
  }
}
