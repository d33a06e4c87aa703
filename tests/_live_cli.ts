/**
 * The CLI as a live subprocess that a test can watch and signal: started with `Deno.Command`
 * directly (the test signals it by pid, which `lib/process.ts` does not expose), stdout read line
 * by line, stderr collected as it arrives. Tests wait on the lines themselves (events), never on
 * time; the whole process is killed after `timeoutMs` so that a regression fails instead of hanging.
 */
import assert from "node:assert/strict";
import { readLines } from "../lib/lines.ts";
import { CLI } from "./_helpers.ts";

export class LiveCli implements AsyncDisposable {
  readonly child: Deno.ChildProcess;
  readonly stdoutLines: string[] = [];
  stderr = "";
  readonly #lines: ReadableStreamDefaultReader<string>;
  readonly #stderrDone: Promise<void>;
  readonly #deadline: ReturnType<typeof setTimeout>;

  constructor(
    args: string[],
    options: { config: string; env: Record<string, string>; timeoutMs?: number },
  ) {
    this.child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--quiet", CLI, "--config", options.config, ...args],
      env: options.env,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#deadline = setTimeout(() => this.#kill("SIGKILL"), options.timeoutMs ?? 240_000);
    this.#lines = readLines(this.child.stdout).getReader();
    const stderr = this.child.stderr;
    this.#stderrDone = (async () => {
      for await (const chunk of stderr.pipeThrough(new TextDecoderStream())) this.stderr += chunk;
    })();
  }

  get pid(): number {
    return this.child.pid;
  }

  /** Read stdout until a line satisfies `test`; fails with the output if stdout ends first. */
  async lineWhere(test: (line: string) => boolean): Promise<string> {
    while (true) {
      const { done, value } = await this.#lines.read();
      if (done) {
        await this.#stderrDone;
        assert.fail(`the CLI's stdout ended before the awaited line\n${this.explain()}`);
      }
      this.stdoutLines.push(value);
      if (test(value)) return value;
    }
  }

  /** The rest of stdout, then the exit code. */
  async finish(): Promise<number> {
    while (true) {
      const { done, value } = await this.#lines.read();
      if (done) break;
      this.stdoutLines.push(value);
    }
    await this.#stderrDone;
    const { code } = await this.child.status;
    clearTimeout(this.#deadline);
    return code;
  }

  explain(code?: number): string {
    return `exit ${code}\n--- stdout\n${this.stdoutLines.join("\n")}\n--- stderr\n${this.stderr}`;
  }

  #kill(signal: Deno.Signal): void {
    try {
      this.child.kill(signal);
    } catch {
      // Already exited.
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    // SIGTERM, which the CLI passes on to its run's supervisor (SIGKILL would end only the CLI,
    // and the run would go on); the deadline's SIGKILL remains for a CLI that hangs.
    this.#kill("SIGTERM");
    await this.finish().catch(() => {});
    clearTimeout(this.#deadline);
  }
}
