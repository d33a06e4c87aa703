/**
 * Keystroke-to-echo latency: one key typed into a `sandbox shell` session (through `sandbox
 * attach`: the CLI, the viewers' socket, the supervisor, the event store and the Engine API's
 * terminal exec) against the same key typed into `docker exec -it` of a login shell in the same
 * container. Both run under `script`, a terminal of their own, and the same bash echoes each key.
 */
import type { BenchContext, Benchmark, BenchResult } from "./main.ts";
import { snapshotSources, summarize, type Summary } from "./_run_helpers.ts";
import { removeProxyMounts } from "./_pool_probe.ts";
import { removeProfile } from "../tests/_helpers.ts";
import { run } from "../lib/process.ts";

/** Keys typed per terminal, after a warm-up line. */
const KEYS = 40;
/** Letters no prompt here shows (the prompt is lower case and hex), so each echo is unambiguous. */
const LETTERS = "QZJKVYWX";
/** Each program gets a terminal of this size before it starts (the pipe `script` reads has none). */
const SIZE = "stty cols 120 rows 40";

/** A program in a terminal of its own (`script`), its argv passed by name in the environment. */
class Terminal {
  readonly #child: Deno.ChildProcess;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #reader: ReadableStreamDefaultReader<string>;
  #seen = "";

  constructor(command: string, env: Record<string, string>) {
    this.#child = new Deno.Command("script", {
      args: ["-q", "-f", "-E", "never", "-c", `${SIZE}; exec ${command}`, "/dev/null"],
      env,
      stdin: "piped",
      stdout: "piped",
      stderr: "null",
    }).spawn();
    this.#writer = this.#child.stdin.getWriter();
    this.#reader = this.#child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  }

  type(text: string): Promise<void> {
    return this.#writer.write(new TextEncoder().encode(text));
  }

  /** Read until `text` appears in what came after the last call. */
  async until(text: string): Promise<void> {
    while (!this.#seen.includes(text)) {
      const { done, value } = await this.#reader.read();
      if (done) throw new Error(`the terminal ended before showing ${JSON.stringify(text)}`);
      this.#seen += value;
    }
    this.#seen = this.#seen.slice(this.#seen.indexOf(text) + text.length);
  }

  /** Milliseconds from each key typed to its echo. */
  async echoes(signal: AbortSignal): Promise<number[]> {
    await this.type("echo BENCH-READY\r");
    // The command line's echo, its output, then the next prompt.
    await this.until("BENCH-READY");
    await this.until("BENCH-READY");
    await this.until("$ ");
    const times: number[] = [];
    for (let i = 0; i < KEYS && !signal.aborted; i++) {
      const key = LETTERS[i % LETTERS.length];
      const started = performance.now();
      await this.type(key);
      await this.until(key);
      times.push(performance.now() - started);
    }
    return times;
  }

  async close(): Promise<void> {
    await this.type("\x15exit\r").catch(() => {}); // already gone: nothing to end
    await this.#writer.close().catch(() => {}); // likewise
    await this.#reader.cancel();
    await this.#child.status;
  }
}

/** "median 0.6 ms (min 0.4, max 26.0, n 40)": echoes are well under a millisecond to a few. */
function ms(summary: Summary): string {
  const f = (value: number) => value.toFixed(1);
  return `median ${f(summary.median)} ms (min ${f(summary.min)}, max ${
    f(summary.max)
  }, n ${summary.n})`;
}

async function cli(args: string[], dir: string): Promise<string> {
  const result = await run([
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    `${dir}/src/cli.ts`,
    "-c",
    `${dir}/sandbox.yaml`,
    ...args,
  ], { env: { XDG_STATE_HOME: `${dir}/state` }, stdin: "" });
  if (result.exitCode !== 0) throw new Error(`sandbox ${args[0]}: ${result.stderr}`);
  return result.stdout.trim();
}

async function run_(context: BenchContext): Promise<BenchResult> {
  const dir = await Deno.makeTempDir({ prefix: "sandbox-bench-terminal-" });
  const profile = `bench-terminal-${crypto.randomUUID().slice(0, 8)}`;
  let id: string | undefined;
  try {
    await snapshotSources(`${dir}/src`);
    await Deno.mkdir(`${dir}/state`);
    await Deno.writeTextFile(`${dir}/sandbox.yaml`, `profiles:\n  ${profile}: {}\n`);
    context.progress("starting a shell session");
    id = await cli(["shell", "--detach", "-p", profile], dir);
    const names = await run([
      "docker",
      "ps",
      "--format",
      "{{.Names}}",
      "--filter",
      `label=dev.sandbox.profile=${profile}`,
    ]);
    const container = names.stdout.split("\n").find((name) => name.includes(id!));
    if (!container) throw new Error(`no container for session ${id}: ${names.stdout}`);
    const env = {
      BENCH_DENO: Deno.execPath(),
      BENCH_CLI: `${dir}/src/cli.ts`,
      BENCH_CONFIG: `${dir}/sandbox.yaml`,
      BENCH_ID: id,
      BENCH_CONTAINER: container,
      XDG_STATE_HOME: `${dir}/state`,
    };
    context.progress(`${KEYS} keys through docker exec -it`);
    const direct = new Terminal(
      'docker exec -it --user 10001:10001 "$BENCH_CONTAINER" bash -l',
      env,
    );
    const baseline = await direct.echoes(context.signal).finally(() => direct.close());
    context.progress(`${KEYS} keys through sandbox attach`);
    const attached = new Terminal(
      '"$BENCH_DENO" run -A --quiet "$BENCH_CLI" -c "$BENCH_CONFIG" attach "$BENCH_ID"',
      env,
    );
    const measured = await attached.echoes(context.signal).finally(() => attached.close());
    const [b, m] = [summarize(baseline), summarize(measured)];
    return {
      figures: [
        {
          name: "keystroke → echo, p50",
          unit: "ms",
          baseline: b.median,
          measured: m.median,
          better: "lower",
        },
      ],
      notes: [
        `docker exec -it ${ms(b)}; sandbox attach ${ms(m)}`,
        `setup: one session of profile ${profile} (bash -l in its sandbox); the same container for both; each terminal under script(1), ${KEYS} keys one at a time, each after the last one's echo`,
      ],
    };
  } finally {
    context.progress(`removing profile ${profile}`);
    // Its supervisor ends with its program; the profile's removal takes the container regardless.
    if (id) await cli(["stop", id], dir).catch(() => {});
    await removeProfile(profile);
    await removeProxyMounts(`${dir}/state`);
    await Deno.remove(dir, { recursive: true });
  }
}

export const benchmark: Benchmark = {
  name: "terminal",
  title: "keystroke to echo: a sandbox shell session against docker exec -it",
  baselineLabel: "docker exec -it",
  measuredLabel: "session",
  run: run_,
};
