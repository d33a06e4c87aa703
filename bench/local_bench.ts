/**
 * Sandbox mode local (lib/sandbox/local/) beside its baselines, measured in the same run:
 * - a bare `bwrap … true` (the same system binds, every namespace unshared) for a command in a
 *   live sandbox (warm), a new sandbox to its first command done (cold), and the sandbox's part
 *   of `sandbox exec -- true` (target, issue 27: ≤ 1.5× the bare bwrap);
 * - Anthropic's sandbox-runtime (`srt`, from npm into a directory of the bench's: bench/_srt.ts)
 *   for `sandbox exec -- true` whole, the CLI's start included, each start beside an `srt true`
 *   (alternated, so that a machine whose speed drifts moves both; target: ≤ 0.5× `srt true`), a
 *   200 MB download from a server on loopback through each one's egress proxy (target: ≥ 2× srt's)
 *   and the memory of an idle sandbox (each launcher's process tree, Pss);
 * - a replayed run (examples/hello) from process start to its first event and to its exit.
 *
 *   deno task bench local
 */
import { parseConfig, resolveProfile } from "../lib/config.ts";
import { run, spawn } from "../lib/process.ts";
import { localTools, systemArgs } from "../lib/sandbox/local/bwrap.ts";
import { sandboxLifecycle } from "../lib/sandbox/providers.ts";
import type { BenchContext, Benchmark, BenchResult, Figure } from "./main.ts";
import { idleSandboxMb, installSrt, SRT_VERSION, srtSettings } from "./_srt.ts";

const SAMPLES = 9;
const RUNS = 3;
/** `sandbox exec -- true` and `srt true`: each a whole process start. */
const STARTS = 7;
const DOWNLOAD_BYTES = 200 * 1024 * 1024;
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

/** A replayed run in mode local: ms from its process start to its first NDJSON event, and to its exit. */
async function replayedRun(dir: string): Promise<{ first: number; exit: number }> {
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
  return { first, exit: performance.now() - start };
}

/** The CLI's argv for `args` with the bench's config. */
function cliArgv(dir: string, args: string[]): string[] {
  return [
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    `${ROOT}/cli.ts`,
    "--config",
    `${dir}/sandbox.yaml`,
    ...args,
  ];
}

/** The ms of a trace line (`sandbox: trace 12.3 ms LABEL`) in `stderr`. */
function traced(stderr: string, label: string): number {
  const found = new RegExp(`trace ([\\d.]+) ms ${label}$`, "m").exec(stderr);
  if (!found) throw new Error(`no trace "${label}" in: ${stderr}`);
  return Number(found[1]);
}

/**
 * `sandbox exec -- true` in mode local, whole (process start to exit), and the sandbox's part of
 * it (its modules loaded → its sandbox released, from the CLI's trace): the rest is the CLI's own
 * start (deno, the CLI's modules, the configuration) and exit.
 */
/** The steps of the sandbox's part of `sandbox exec`: trace labels, each ending one. */
const EXEC_STEPS = [
  ["holder up", "exec: local sandbox up"],
  ["relay ready", "exec: session open"],
  ["command", "exec: command ended"],
  ["release", "exec: local sandbox released"],
] as const;

interface ExecTimes {
  wholeMs: number;
  sandboxMs: number;
  /** ms of each of EXEC_STEPS. */
  steps: number[];
}

async function execTrue(dir: string): Promise<ExecTimes> {
  const start = performance.now();
  const result = await run(cliArgv(dir, ["exec", "-p", "bench-local", "--", "true"]), {
    env: { XDG_STATE_HOME: `${dir}/state`, SANDBOX_TRACE: "1" },
  });
  const wholeMs = performance.now() - start;
  if (result.exitCode !== 0) throw new Error(`sandbox exec failed: ${result.stderr}`);
  const marks = ["exec: local modules loaded", ...EXEC_STEPS.map(([, label]) => label)]
    .map((label) => traced(result.stderr, label));
  const steps = marks.slice(1).map((mark, i) => mark - marks[i]);
  return { wholeMs, sandboxMs: marks.at(-1)! - marks[0], steps };
}

/** A server on loopback answering every request with `DOWNLOAD_BYTES` bytes. */
function downloadServer(): Deno.HttpServer<Deno.NetAddr> {
  const chunk = new Uint8Array(1024 * 1024);
  return Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () => {
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent >= DOWNLOAD_BYTES) return controller.close();
        controller.enqueue(chunk);
        sent += chunk.length;
      },
    });
    return new Response(body, { headers: { "content-length": String(DOWNLOAD_BYTES) } });
  });
}

/** curl's arguments for the download: its body discarded, its speed (bytes/s) on stdout. */
const CURL_SPEED = ["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{speed_download}"];

/** MB/s of a download run by `argv` (curl's own measure: the transfer, not the sandbox's start). */
async function downloadMbps(argv: string[], env?: Record<string, string>): Promise<number> {
  const result = await run(argv, { env, timeoutMs: 600_000 });
  const speed = Number(result.stdout.trim().split("\n").at(-1));
  if (result.exitCode !== 0 || !(speed > 0)) {
    throw new Error(`download failed (${result.exitCode}): ${result.stdout} ${result.stderr}`);
  }
  return speed / 1e6;
}

interface SrtFigures {
  trueMs: number;
  downloadMbps: number;
  idleMb: number;
}

/** srt installed, its `srt true` tried once; or why srt cannot be measured. */
interface SrtReady {
  srt: string;
  /** Its settings allowing no network. */
  none: string;
  /** One `srt true` (checked by the first). */
  start: () => Promise<unknown>;
}

async function srtTrue(context: BenchContext, dir: string): Promise<SrtReady | string> {
  const installed = await installSrt(context.progress);
  if ("missing" in installed) return installed.missing;
  const { srt } = installed;
  const none = await srtSettings(dir, []);
  const argv = [srt, "--settings", none, "--", "true"];
  const probe = await run(argv, { cwd: `${dir}/work` });
  if (probe.exitCode !== 0) return `srt true failed (${probe.exitCode}): ${probe.stderr.trim()}`;
  return { srt, none, start: () => run(argv, { cwd: `${dir}/work` }) };
}

/** srt's figures beside its `srt true` (measured beside `sandbox exec`). */
async function measureSrt(
  context: BenchContext,
  dir: string,
  port: number,
  { srt, none, trueMs }: SrtReady & { trueMs: number },
): Promise<SrtFigures> {
  const upstream = await srtSettings(dir, [`localhost:${port}`]);
  context.progress("srt: 200 MB from loopback through its proxy");
  // srt's NO_PROXY names localhost: emptied, so that curl goes through srt's proxy as it must.
  const downloadMbps_ = await downloadMbps([
    srt,
    "--settings",
    upstream,
    "--",
    "env",
    "NO_PROXY=",
    "no_proxy=",
    ...CURL_SPEED,
    `http://localhost:${port}/`,
  ]);
  context.progress("srt: an idle sandbox's memory");
  const idleMb = await idleSandboxMb([srt, "--settings", none, "--", "sleep", "600"]);
  return { trueMs, downloadMbps: downloadMbps_, idleMb };
}

/** Mode local's figures against srt's (or a note saying why srt was not measured). */
async function compareWithSrt(
  context: BenchContext,
  dir: string,
  port: number,
  exec: { wholeMs: number },
  srtReady: (SrtReady & { trueMs: number }) | string,
): Promise<{ figures: Figure[]; notes: string[] }> {
  const env = { XDG_STATE_HOME: `${dir}/state` };
  context.progress("mode local: 200 MB from loopback through the egress proxy");
  const ours = await downloadMbps(
    cliArgv(dir, ["exec", "-p", "bench-local", "--", ...CURL_SPEED, `http://up.test:${port}/`]),
    env,
  );
  const direct = await downloadMbps([...CURL_SPEED, `http://127.0.0.1:${port}/`]);
  context.progress("mode local: an idle sandbox's memory");
  const idle = await idleSandboxMb(
    cliArgv(dir, ["exec", "-p", "bench-local", "--", "sleep", "600"]),
    env,
  );
  const srt = typeof srtReady === "string"
    ? srtReady
    : await measureSrt(context, dir, port, srtReady);
  const notes = [
    `200 MB direct on the host (no sandbox, no proxy): ${Math.round(direct)} MB/s`,
    `mode local alone: 200 MB at ${Math.round(ours)} MB/s; an idle sandbox ${Math.round(idle)} MB`,
  ];
  if (typeof srt === "string") return { figures: [], notes: [...notes, srt] };
  const vsSrt = (name: string, unit: string, measured: number, baseline: number) => ({
    name,
    unit,
    baseline: Math.round(baseline),
    measured: Math.round(measured),
  });
  return {
    figures: [
      {
        ...vsSrt("`sandbox exec -- true` vs `srt true` (whole)", "ms", exec.wholeMs, srt.trueMs),
        better: "lower",
        target: { text: "≤ 0.5× srt", met: exec.wholeMs <= 0.5 * srt.trueMs },
      },
      {
        ...vsSrt("200 MB from loopback via the proxy, vs srt's", "MB/s", ours, srt.downloadMbps),
        better: "higher",
        target: { text: "≥ 2× srt", met: ours >= 2 * srt.downloadMbps },
      },
      {
        ...vsSrt("idle sandbox memory (Pss of the tree), vs srt's", "MB", idle, srt.idleMb),
        better: "lower",
      },
    ],
    notes: [
      ...notes,
      `srt ${SRT_VERSION} (npm), settings: no network / localhost:PORT only; each \`srt true\` right after a \`sandbox exec -- true\``,
    ],
  };
}

/** The in-process figures: warm and cold commands. */
async function inProcess(
  context: BenchContext,
  yaml: string,
): Promise<{ warm: number; cold: number }> {
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
  return { warm, cold };
}

async function measure(context: BenchContext): Promise<BenchResult> {
  const tools = await localTools();
  const bare = [tools.bwrap, "--unshare-all", ...await systemArgs(), "--proc", "/proc", "true"];
  context.progress(`bare bwrap true ×${SAMPLES}`);
  const baseline = median(await samples(SAMPLES, () => run(bare)));
  const processStart = median(await samples(SAMPLES, () => run(["true"])));
  const dir = await Deno.makeTempDir({ prefix: "sandbox-bench-local-" });
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", `${dir}/state`);
  await using server = downloadServer();
  try {
    const port = server.addr.port;
    const yaml = "profiles:\n  bench-local:\n    sandbox:\n      mode: local\n" +
      `      network: {allow: ["up.test:${port}"], hosts: {up.test: 127.0.0.1}}\n`;
    await Deno.writeTextFile(`${dir}/sandbox.yaml`, yaml);
    await Deno.mkdir(`${dir}/work`);
    const { warm, cold } = await inProcess(context, yaml);
    const srt = await srtTrue(context, dir);
    context.progress(
      `sandbox exec -- true ×${STARTS} (+1 not counted)${
        typeof srt === "string" ? "" : ", each beside an srt true"
      }`,
    );
    await execTrue(dir);
    // Alternated with srt's starts: a machine whose speed drifts during the bench moves both.
    const execs: ExecTimes[] = [];
    const srtStarts: number[] = [];
    for (let i = 0; i < STARTS; i++) {
      execs.push(await execTrue(dir));
      if (typeof srt !== "string") srtStarts.push(await timed(srt.start));
    }
    const exec = {
      wholeMs: median(execs.map((e) => e.wholeMs)),
      sandboxMs: median(execs.map((e) => e.sandboxMs)),
    };
    const steps = EXEC_STEPS.map(([name], i) =>
      `${name} ${Math.round(median(execs.map((e) => e.steps[i])))} ms`
    );
    context.progress(`replayed runs to their first event ×${RUNS} (+1 to bundle)`);
    await replayedRun(dir);
    const runs: { first: number; exit: number }[] = [];
    for (let i = 0; i < RUNS; i++) runs.push(await replayedRun(dir));
    const firstEvent = median(runs.map((r) => r.first));
    const exit = median(runs.map((r) => r.exit));
    const row = (name: string, measured: number, target?: number): Figure => ({
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
    const vsSrt = await compareWithSrt(
      context,
      dir,
      port,
      exec,
      typeof srt === "string" ? srt : { ...srt, trueMs: median(srtStarts) },
    );
    return {
      figures: [
        row("warm: `true` in a live sandbox", warm, 1.5),
        row("cold: new sandbox → first command done", cold),
        row("`sandbox exec -- true`: the sandbox's part", exec.sandboxMs, 1.5),
        row("`sandbox exec -- true`: the CLI's own start and exit", exec.wholeMs - exec.sandboxMs),
        row("replayed run: process start → first event", firstEvent),
        row("replayed run: process start → exit", exit),
        ...vsSrt.figures,
      ],
      notes: [
        `medians: ${SAMPLES} commands, ${STARTS} execs and srt starts, ${RUNS} sandboxes and runs; ` +
        "baseline: bare bwrap true unless the row says srt",
        `a process start (\`true\` from this process) takes ${processStart.toFixed(1)} ms`,
        `the sandbox's part of \`sandbox exec -- true\`, step by step (medians): ${
          steps.join(", ")
        }`,
        ...vsSrt.notes,
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
  title: "sandbox mode local (bubblewrap) beside a bare bwrap … true and srt",
  baselineLabel: "bwrap true / srt",
  measuredLabel: "mode local",
  run: measure,
};
