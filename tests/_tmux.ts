/**
 * A tmux server of the test's own (its own socket), to drive the real CLI in a real terminal:
 * `send-keys` types, `capture-pane` reads the screen. Waits are on what the screen shows.
 */
import { run } from "../lib/process.ts";

export class Tmux implements AsyncDisposable {
  readonly socket = `sandbox-test-${crypto.randomUUID().slice(0, 8)}`;

  async tmux(...args: string[]): Promise<string> {
    const result = await run(["tmux", "-L", this.socket, ...args]);
    if (result.exitCode !== 0) throw new Error(`tmux ${args[0]} failed: ${result.stderr}`);
    return result.stdout;
  }

  /** A window of `cols`×`rows` running `argv` (then a marker with its exit code, and a pause). */
  async start(argv: string[], env: Record<string, string>, size = { cols: 100, rows: 30 }) {
    const assignments = Object.entries(env).map(([name, value]) => `${name}=${value}`);
    // A server just killed (kill-server) may still be going on this socket: a new one started
    // meanwhile exits at once ("server exited unexpectedly"). Try again until the old one is gone.
    for (let attempt = 1;; attempt++) {
      try {
        return await this.#newSession(size, assignments, argv);
      } catch (error) {
        if (attempt === 25 || !/server exited unexpectedly/.test(String(error))) throw error;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    }
  }

  async #newSession(
    size: { cols: number; rows: number },
    assignments: string[],
    argv: string[],
  ): Promise<void> {
    await this.tmux(
      "new-session",
      "-d",
      "-s",
      "t",
      "-x",
      String(size.cols),
      "-y",
      String(size.rows),
      "env",
      ...assignments,
      "sh",
      "-c",
      '"$@"; echo "CLI-EXITED-$?"; sleep 600',
      "sh",
      ...argv,
    );
  }

  send(...keys: string[]): Promise<string> {
    return this.tmux("send-keys", "-t", "t", ...keys);
  }

  screen(): Promise<string> {
    return this.tmux("capture-pane", "-p", "-t", "t", "-S", "-200");
  }

  /** The screen once `pattern` is on it (the test's own timeout bounds the wait). */
  async waitFor(pattern: RegExp): Promise<string> {
    while (true) {
      const text = await this.screen();
      if (pattern.test(text)) return text;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await run(["tmux", "-L", this.socket, "kill-server"]);
  }
}
