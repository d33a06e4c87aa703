/**
 * Sandbox mode local (lib/sandbox/local/) beside a bare `bwrap … true` (the same system binds,
 * every namespace unshared), measured in the same run: a command in a live sandbox (warm), a new
 * sandbox to its first command done (cold), and a replayed run (examples/hello) from process start
 * to its first event. Target (issue 27): a warm command ≤ 1.5× the bare bwrap.
 *
 *   deno task bench local
 */
import { parseConfig, resolveProfile } from "../lib/config.ts";
import { run, spawn } from "../lib/process.ts";
import { localTools, systemArgs } from "../lib/sandbox/local/bwrap.ts";
import { sandboxLifecycle } from "../lib/sandbox/providers.ts";
import type { BenchContext, Benchmark, BenchResult } from "./main.ts";

const SAMPLES = 9;
const RUNS = 3;
const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

async function timed(work: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await work();
  return performance.now() - start;
}

async function samples(n: number, work: () => Promise<unknown>): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < n; i++) times.push(await timed(work));
  return times;
}

/** A replayed run in mode local: ms from its process start to its first NDJSON event. */
async function runToFirstEvent(dir: string): Promise<number> {
  const start = performance.now();
  const child = spawn([
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    `${ROOT}/cli.ts`,
    "--config",
    `${dir}/sandbox.yaml`,
    "run",
    "agentic",
    "-p",
    "bench-local",
    "--prompt-file",
    `${ROOT}/examples/hello/prompt.txt`,
    "--model",
    `replay:${ROOT}/examples/hello/recording.json`,
    "--format",
    "ndjson",
    "--cwd",
    `${dir}/work`,
  ], { env: { XDG_STATE_HOME: `${dir}/state` } });
  let first = 0;
  for await (const _line of child.lines()) first ||= performance.now() - start;
  const ended = await child.finished;
  if (ended.exitCode !== 0 || first === 0) {
    throw new Error(`the replayed run failed (${ended.exitCode}): ${ended.stderrTail}`);
  }
  return first;
}

async function measure(context: BenchContext): Promise<BenchResult> {
  const tools = await localTools();
  const bare = [tools.bwrap, "--unshare-all", ...await systemArgs(), "--proc", "/proc", "true"];
  context.progress(`bare bwrap true ×${SAMPLES}`);
  const baseline = median(await samples(SAMPLES, () => run(bare)));
  const dir = await Deno.makeTempDir({ prefix: "sandbox-bench-local-" });
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", `${dir}/state`);
  try {
    const yaml = "profiles:\n  bench-local:\n    sandbox: {mode: local}\n";
    await Deno.writeTextFile(`${dir}/sandbox.yaml`, yaml);
    await Deno.mkdir(`${dir}/work`);
    const parsed = parseConfig(yaml, undefined, () => undefined);
    if (parsed.kind !== "ok") throw new Error(JSON.stringify(parsed.issues));
    const lifecycle = await sandboxLifecycle(resolveProfile(parsed.config, "bench-local"));
    context.progress(`cold: a new sandbox to its first command ×${RUNS}`);
    const cold = median(
      await samples(RUNS, async () => {
        const sandbox = await lifecycle.acquire({ runId: "bench" });
        await sandbox.provider.exec(["true"]);
        await sandbox.release();
      }),
    );
    const sandbox = await lifecycle.acquire({ runId: "bench" });
    context.progress(`warm: a command in a live sandbox ×${SAMPLES}`);
    const warm = median(await samples(SAMPLES, () => sandbox.provider.exec(["true"])));
    await sandbox.release();
    context.progress(`replayed runs to their first event ×${RUNS} (+1 to bundle)`);
    await runToFirstEvent(dir);
    const runs: number[] = [];
    for (let i = 0; i < RUNS; i++) runs.push(await runToFirstEvent(dir));
    const firstEvent = median(runs);
    const row = (name: string, measured: number, target?: number) => ({
      name,
      unit: "ms",
      baseline: Math.round(baseline),
      measured: Math.round(measured),
      better: "lower" as const,
      target: target === undefined ? undefined : {
        text: `≤ ${target}× bare bwrap`,
        met: measured <= target * baseline,
      },
    });
    return {
      figures: [
        row("warm: `true` in a live sandbox", warm, 1.5),
        row("cold: new sandbox → first command done", cold),
        row("replayed run: process start → first event", firstEvent),
      ],
      notes: [
        `medians: ${SAMPLES} commands, ${RUNS} sandboxes and runs; baseline: bare bwrap true`,
      ],
    };
  } finally {
    if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", previous);
    await run(["chmod", "-R", "u+rwX", dir]);
    await Deno.remove(dir, { recursive: true });
  }
}

export const benchmark: Benchmark = {
  name: "local",
  title: "sandbox mode local (bubblewrap) beside a bare bwrap … true",
  baselineLabel: "bwrap true",
  measuredLabel: "mode local",
  run: measure,
};
