/**
 * Helpers of `run_bench.ts`: a frozen copy of the sources, timed child processes, the CLI timed to
 * its first event, a tracer for the docker and iptables calls the CLI makes, synthetic events.
 */
import { encodeMessage } from "../lib/run/protocol.ts";
import { run, spawn } from "../lib/process.ts";

export const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
/** What the CLI needs to run from a copy: the module graph, the lock, the image's build context. */
const SOURCE_ENTRIES = [
  "cli.ts",
  "mod.ts",
  "deno.json",
  "deno.lock",
  "Dockerfile",
  "lib",
  "cli",
  "worker",
  "relay",
  "scripts",
];
/** No timed child may run longer than this. */
export const CHILD_TIMEOUT_MS = 180_000;
/** Lines "sandbox: " prints on stderr when a run has an id (after config, before any docker call). */
const RUN_ID_LINE = /^sandbox: run (\S+) /;

/** Milliseconds since the epoch with sub-millisecond precision, comparable to `date +%s%N`. */
export function wallClockMs(): number {
  return performance.timeOrigin + performance.now();
}

export interface Summary {
  median: number;
  min: number;
  max: number;
  n: number;
}

/** Median (the lower middle for an even count, as nearest-rank p50), min and max. */
export function summarize(values: readonly number[]): Summary {
  if (values.length === 0) throw new RangeError("Cannot summarize no values");
  const sorted = [...values].sort((a, b) => a - b);
  return {
    median: sorted[Math.ceil(sorted.length / 2) - 1],
    min: sorted[0],
    max: sorted[sorted.length - 1],
    n: sorted.length,
  };
}

/** "median 123 ms (min 110, max 140, n 7)". */
export function describe(summary: Summary, unit = "ms"): string {
  const round = (value: number) => Math.round(value).toLocaleString("en-US");
  return `median ${round(summary.median)} ${unit} (min ${round(summary.min)}, max ${
    round(summary.max)
  }, n ${summary.n})`;
}

/**
 * Copy the sources the CLI runs from into `dir`. The checkout may change while the benchmark runs
 * (an editor, a `git checkout`): the image tag is a hash of `lib/` and `worker/`, so every edit would
 * rebuild the image and replace the container in the middle of a measurement. The copy is frozen.
 */
export async function snapshotSources(dir: string): Promise<void> {
  await Deno.mkdir(dir, { recursive: true });
  for (const entry of SOURCE_ENTRIES) await copyTree(`${ROOT}/${entry}`, `${dir}/${entry}`);
}

async function copyTree(from: string, to: string): Promise<void> {
  const info = await Deno.stat(from);
  if (info.isFile) {
    await Deno.copyFile(from, to);
    if (info.mode !== null) await Deno.chmod(to, info.mode & 0o777);
    return;
  }
  await Deno.mkdir(to, { recursive: true });
  for await (const entry of Deno.readDir(from)) {
    if (entry.isFile || entry.isDirectory) {
      await copyTree(`${from}/${entry.name}`, `${to}/${entry.name}`);
    }
  }
}

export interface TimedOptions {
  cwd?: string;
  env?: Record<string, string>;
  signal?: AbortSignal;
}

/** Run `argv` to its end; milliseconds from spawn to exit. Raises on non-zero exit. */
export async function timeCommand(
  argv: readonly string[],
  options: TimedOptions = {},
): Promise<number> {
  const started = performance.now();
  const result = await run(argv, { ...options, timeoutMs: CHILD_TIMEOUT_MS });
  const ms = performance.now() - started;
  if (result.exitCode !== 0) {
    throw new Error(
      `${argv.join(" ")}: exit code ${result.exitCode}: ${result.stderr.slice(-2_000)}`,
    );
  }
  return ms;
}

/** `count` timings of `argv`, after `warmup` untimed runs. */
export async function timeRepeated(
  argv: readonly string[],
  count: number,
  options: TimedOptions & { warmup?: number } = {},
): Promise<number[]> {
  for (let i = 0; i < (options.warmup ?? 1); i++) await timeCommand(argv, options);
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    options.signal?.throwIfAborted();
    times.push(await timeCommand(argv, options));
  }
  return times;
}

/** One `sandbox run` as seen from outside. Times are milliseconds after spawn. */
export interface CliRunTiming {
  /** Wall clock (see `wallClockMs`) at spawn: aligns traced calls with this run. */
  spawnedAtMs: number;
  /** The "sandbox: run ID" line on stderr: CLI started, config loaded, run log created. */
  runIdMs: number | null;
  runId: string | null;
  /** The first NDJSON line on stdout: the worker's first event, through the CLI. */
  firstEventMs: number;
  /** The last line on stdout (the `usage` event): what follows is the user waiting for cleanup. */
  lastEventMs: number;
  /** The process has exited and stdout and stderr are closed. */
  exitMs: number;
  /** Event types, in order. */
  types: string[];
  stderr: string;
  /**
   * The image was built, a container replaced, or a stale pooled sandbox removed during this run:
   * not a warm/cold sample.
   */
  disturbed: boolean;
}

/**
 * Spawn the CLI (`argv`) and time it to its run id, its first event and its exit. Raises unless it
 * exits 0 having printed a `result` and, last, a `usage` event.
 */
export async function timeCliRun(
  argv: readonly string[],
  options: TimedOptions = {},
): Promise<CliRunTiming> {
  const stderrLines: string[] = [];
  let runIdMs: number | null = null;
  let runId: string | null = null;
  const spawnedAtMs = wallClockMs();
  const started = performance.now();
  const child = spawn(argv, {
    ...options,
    timeoutMs: CHILD_TIMEOUT_MS,
    onStderrLine: (line) => {
      const match = runIdMs === null ? RUN_ID_LINE.exec(line) : null;
      if (match) {
        runIdMs = performance.now() - started;
        runId = match[1];
      }
      stderrLines.push(line);
    },
  });
  let firstEventMs: number | null = null;
  let lastEventMs = 0;
  let text = "";
  const decoder = new TextDecoder();
  const reading = (async () => {
    for await (const chunk of child.stdout) {
      if (firstEventMs === null && chunk.includes(0x0a)) firstEventMs = performance.now() - started;
      if (chunk.includes(0x0a)) lastEventMs = performance.now() - started;
      text += decoder.decode(chunk, { stream: true });
    }
  })();
  const [outcome] = await Promise.all([child.finished, reading]);
  const exitMs = performance.now() - started;
  const stderr = stderrLines.join("\n");
  const types = text.split("\n").filter(Boolean).map((line) => {
    try {
      return String((JSON.parse(line) as { type?: unknown }).type);
    } catch {
      return "(not JSON)";
    }
  });
  if (
    outcome.exitCode !== 0 || firstEventMs === null || !types.includes("result") ||
    types.at(-1) !== "usage"
  ) {
    throw new Error(
      `sandbox run failed: exit code ${outcome.exitCode}, events [${types.join(", ")}]\n${
        stderr.slice(-3_000)
      }`,
    );
  }
  return {
    spawnedAtMs,
    runIdMs,
    runId,
    firstEventMs,
    lastEventMs,
    exitMs,
    types,
    stderr,
    disturbed:
      /Building sandbox image|Replacing sandbox|Bundling the worker|removing pooled sandbox/.test(
        stderr,
      ),
  };
}

/** Spawn `argv`, count the lines it prints; milliseconds from spawn to exit. */
export async function countLines(
  argv: readonly string[],
  options: TimedOptions = {},
): Promise<{ ms: number; lines: number }> {
  const started = performance.now();
  const child = spawn(argv, { ...options, timeoutMs: CHILD_TIMEOUT_MS });
  let lines = 0;
  const reading = (async () => {
    for await (const chunk of child.stdout) {
      for (let i = chunk.indexOf(0x0a); i !== -1; i = chunk.indexOf(0x0a, i + 1)) lines++;
    }
  })();
  const [outcome] = await Promise.all([child.finished, reading]);
  const ms = performance.now() - started;
  if (outcome.exitCode !== 0) {
    throw new Error(`${argv.join(" ")}: exit code ${outcome.exitCode}: ${outcome.stderrTail}`);
  }
  return { ms, lines };
}

/**
 * `count` worker lines (NDJSON, as the worker writes them) in a typical mix: thinking, a tool call
 * with a file to write, its result with some output. About 400 bytes per event.
 */
export function syntheticEvents(count: number): string {
  const lines: string[] = [];
  const body = "export function add(a: number, b: number): number {\n  return a + b;\n}\n".repeat(
    3,
  );
  for (let i = 0; i < count; i++) {
    const call = `call_${Math.floor(i / 3)}`;
    switch (i % 3) {
      case 0:
        lines.push(encodeMessage({
          type: "thinking",
          content:
            `Step ${i}: the tests fail because add() is missing; I will write src/math_${i}.ts and run them.`,
          model: "bench-model",
        }));
        break;
      case 1:
        lines.push(encodeMessage({
          type: "tool_call",
          tool_name: "write_file",
          tool_input: { file_path: `src/math_${i}.ts`, content: body },
          tool_call_id: call,
          model: "bench-model",
        }));
        break;
      default:
        lines.push(encodeMessage({
          type: "tool_result",
          tool_name: "write_file",
          tool_output: `Updated file src/math_${
            i - 1
          }.ts (${body.length} bytes)\nok 1 - add\nok 2 - sub`,
          tool_call_id: call,
          model: "bench-model",
        }));
    }
  }
  return lines.join("\n") + "\n";
}

/** `bytes` cut into chunks of `size`, as a pipe delivers them. */
export function chunked(bytes: Uint8Array, size = 64 * 1024): Uint8Array[] {
  const chunks: Uint8Array[] = [];
  for (let i = 0; i < bytes.length; i += size) chunks.push(bytes.subarray(i, i + size));
  return chunks;
}
