/**
 * The issue-11 figures of `run_bench.ts`, each beside its baseline from the same run: the bundled
 * CLI's start against the checkout's, `sandbox exec -- true` against `docker exec true`, a second
 * run on a repository against a warm run, a fresh-container run's wait after its last event against
 * the removal it no longer waits for, and 8 concurrent runs against the same 8 one after another.
 */
import type { BenchContext, Figure } from "./main.ts";
import { run } from "../lib/process.ts";
import { readTrailer, trailerComment } from "../lib/sandbox/bundle_trailer.ts";
import {
  CHILD_TIMEOUT_MS,
  type CliRunTiming,
  describe,
  summarize,
  timeCliRun,
  timeCommand,
  type TimedOptions,
  timeRepeated,
} from "./_run_helpers.ts";

/** The sandbox user and the relay's (lib/sandbox/docker_provider.ts SANDBOX_USER, RELAY_USER). */
const SANDBOX_USER = "10001:10001";
const RELAY_USER = "10002:10002";

/** What `run_bench.ts` prepared: a frozen source copy, a state directory, a warm profile. */
export interface RunSetup {
  dir: string;
  src: string;
  state: string;
  profile: string;
  container: string;
  env: Record<string, string>;
  cli(args: string[]): string[];
  runArgv: string[];
}

export interface Measured {
  figures: Figure[];
  notes: string[];
}

const STARTS = 9;
const EXECS = 7;
const REPO_RUNS = 5;
const FRESH_RUNS = 3;
const CONCURRENT = 8;
const EXEC_TARGET_RATIO = 1.5;
const REPO_TARGET_MS = 500;
const CONCURRENT_TARGET_RATIO = 0.5;
/** GNU time, for peak memory (skipped where it is missing). */
const GNU_TIME = "/usr/bin/time";

/** Alternate two commands `count` times each (after one untimed round); timings of each. */
async function alternate(
  a: readonly string[],
  b: readonly string[],
  count: number,
  options: TimedOptions,
): Promise<[number[], number[]]> {
  await timeCommand(a, options);
  await timeCommand(b, options);
  const times: [number[], number[]] = [[], []];
  for (let i = 0; i < count; i++) {
    options.signal?.throwIfAborted();
    times[0].push(await timeCommand(a, options));
    times[1].push(await timeCommand(b, options));
  }
  return times;
}

/** Peak resident memory of `argv` in MiB, by GNU time; undefined where it is not installed. */
async function peakMiB(argv: readonly string[], options: TimedOptions): Promise<number | undefined> {
  try {
    await Deno.stat(GNU_TIME);
  } catch {
    return undefined;
  }
  const result = await run([GNU_TIME, "-f", "peak-kib %M", ...argv], { ...options, timeoutMs: CHILD_TIMEOUT_MS });
  const match = /peak-kib (\d+)\s*$/.exec(result.stderr);
  return match ? Number(match[1]) / 1024 : undefined;
}

/** The bundled CLI (scripts/bundle.sh of the frozen copy) as the installed launcher runs it. */
async function bundledCli(setup: RunSetup, context: BenchContext): Promise<(args: string[]) => string[]> {
  context.progress("bundling the CLI from the frozen sources (scripts/bundle.sh)");
  const built = await run(["bash", `${setup.src}/scripts/bundle.sh`], { cwd: setup.src, timeoutMs: CHILD_TIMEOUT_MS });
  if (built.exitCode !== 0) throw new Error(`scripts/bundle.sh failed: ${built.stderr.slice(-2_000)}`);
  const config = JSON.parse(await Deno.readTextFile(`${setup.src}/deno.json`)) as { unstable?: string[] };
  const unstable = (config.unstable ?? []).map((feature) => `--unstable-${feature}`);
  const bundle = `${setup.src}/dist/sandbox.js`;
  return (args) => [
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    "--no-config",
    ...unstable,
    bundle,
    "--config",
    `${setup.dir}/sandbox.yaml`,
    ...args,
  ];
}

/**
 * A copy of the bundle without its embedded worker (the comment at its end that carries it, see
 * lib/sandbox/bundle_trailer.ts, cut out): what the bundle's start would be without those bytes to
 * read. It cannot build an image; `--version` does not need one.
 */
async function bundleWithoutWorker(bundle: string): Promise<string> {
  const text = await Deno.readTextFile(bundle);
  const comment = trailerComment("worker", readTrailer(new URL(`file://${bundle}`), "worker"));
  if (text.split(comment).length !== 2) throw new Error(`the embedded worker is not found once in ${bundle}`);
  const stripped = bundle.replace(/\.js$/, ".no-worker.js");
  await Deno.writeTextFile(stripped, text.replace(comment, ""));
  return stripped;
}

/** The bundled CLI against the checkout: `--version`, peak memory, and a warm run's first event. */
export async function measureBundle(
  setup: RunSetup,
  context: BenchContext,
  warmFirstMs: number,
): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const bundled = await bundledCli(setup, context);
  context.progress(`start: ${STARTS} × checkout and bundle --version, alternating`);
  const [checkout, bundle] = await alternate(setup.cli(["--version"]), bundled(["--version"]), STARTS, at);
  const checkoutStart = summarize(checkout);
  const bundleStart = summarize(bundle);
  const withoutWorker = await bundleWithoutWorker(`${setup.src}/dist/sandbox.js`);
  const stripped = (args: string[]) => bundled(args).map((arg) => arg.endsWith("/dist/sandbox.js") ? withoutWorker : arg);
  const [withWorker, noWorker] = await alternate(bundled(["--version"]), stripped(["--version"]), STARTS, at);
  const checkoutPeak = await peakMiB(setup.cli(["--version"]), at);
  const bundlePeak = await peakMiB(bundled(["--version"]), at);
  context.progress("warm runs through the bundle (same image: its tag is a hash of the same bytes)");
  // The CLI's own arguments of the warm run: from its `run agentic` on.
  const runArgs = setup.runArgv.slice(setup.runArgv.indexOf("agentic") - 1);
  const bundleRuns: CliRunTiming[] = [];
  await timeCliRun(bundled(runArgs), at);
  for (let i = 0; i < 5; i++) bundleRuns.push(await timeCliRun(bundled(runArgs), at));
  const disturbed = bundleRuns.filter((t) => t.disturbed).length;
  const bundleFirst = summarize(bundleRuns.map((t) => t.firstEventMs));
  const figures: Figure[] = [
    {
      name: "bundled CLI start: checkout cli.ts --version → bundle --version",
      unit: "ms",
      baseline: checkoutStart.median,
      measured: bundleStart.median,
      better: "lower",
      target: { text: "≤ checkout", met: bundleStart.median <= checkoutStart.median },
    },
    {
      name: "what-if: bundle --version, as built → without its embedded worker",
      unit: "ms",
      baseline: summarize(withWorker).median,
      measured: summarize(noWorker).median,
      better: "lower",
    },
    {
      name: "warm run through the bundle: checkout → bundle, first event",
      unit: "ms",
      baseline: warmFirstMs,
      measured: bundleFirst.median,
      better: "lower",
    },
  ];
  if (checkoutPeak !== undefined && bundlePeak !== undefined) {
    figures.push({
      name: "peak memory, --version: checkout → bundle",
      unit: "MiB",
      baseline: checkoutPeak,
      measured: bundlePeak,
      better: "lower",
    });
  }
  return {
    figures,
    notes: [
      `bundle: --version ${describe(bundleStart)}; checkout --version ${describe(checkoutStart)}; warm run first event ${
        describe(bundleFirst)
      }${disturbed ? ` (${disturbed} not warm)` : ""}; peak memory checkout ${checkoutPeak?.toFixed(0) ?? "?"} MiB, bundle ${
        bundlePeak?.toFixed(0) ?? "?"
      } MiB`,
    ],
  };
}

/**
 * The relay's start as `sandbox exec` pays it before its command (no command may start before the
 * proxies' ports listen): the image's relay under the exec wrapper, as the relay's own uid,
 * loaded and exiting at once (`--check`), one `docker exec`.
 */
function relayStart(container: string): string[] {
  return [
    "docker", "exec", "--user", RELAY_USER, container, "sandbox-exec", `bench-relay-${crypto.randomUUID()}`,
    "deno", "run", "--quiet", "--no-config", "--no-prompt", "--allow-net=127.0.0.1", "/opt/sandbox/relay.js", "--check",
  ];
}

/**
 * `sandbox exec -- true` against `docker exec CONTAINER true`, alternating; and against its floor
 * on this machine, measured in the same run: a Deno process's start (an empty script), then
 * `docker exec true` — the two things any `sandbox exec` must do one after the other, its relay
 * being started ahead of it (the spare relay the exec before it left, lib/proxy/spare_relay.ts).
 * The relay's own start is measured too: what an exec without a spare relay waits for on top.
 */
/** Traced execs after the timed ones: how many went to the waiting wrapper. */
const TRACED_EXECS = 3;

export async function measureExec(setup: RunSetup, context: BenchContext, denoEmptyMs: number): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  context.progress(`exec: ${EXECS} × sandbox exec -- true and docker exec true, alternating`);
  const [raw, ours] = await alternate(
    ["docker", "exec", setup.container, "true"],
    setup.cli(["exec", "-p", setup.profile, "--", "true"]),
    EXECS,
    at,
  );
  const baseline = summarize(raw);
  const measured = summarize(ours);
  context.progress(`exec: ${EXECS} × the relay's start in the sandbox (its floor's middle part)`);
  const relay = summarize(await timeRepeated(relayStart(setup.container), EXECS, at));
  const floor = denoEmptyMs + baseline.median;
  // Whether the commands went to the wrapper waiting in the container, as the timed ones did: traced.
  let handed = 0;
  for (let i = 0; i < TRACED_EXECS; i++) {
    const traced = await run(setup.cli(["exec", "-p", setup.profile, "--", "true"]), { ...at, env: { ...at.env, SANDBOX_TRACE: "1" } });
    if (/waiting exec: connected/.test(traced.stderr)) handed++;
  }
  return {
    figures: [{
      name: "sandbox exec -- true: docker exec true → sandbox exec",
      unit: "ms",
      baseline: baseline.median,
      measured: measured.median,
      better: "lower",
      target: {
        text: `≤ ${EXEC_TARGET_RATIO}× docker exec`,
        met: measured.median <= EXEC_TARGET_RATIO * baseline.median,
      },
    }, {
      name: "what-if: deno start + docker exec true (an exec of its own) → sandbox exec",
      unit: "ms",
      baseline: floor,
      measured: measured.median,
      better: "lower",
    }],
    notes: [
      `exec: sandbox exec -- true ${describe(measured)}; docker exec true ${describe(baseline)}; relay start (docker exec of relay.js --check under the wrapper) ${
        describe(relay)
      } (what an exec without a spare relay would wait for on top); an exec of its own would take at least ${Math.round(floor)} ms = deno empty ${
        Math.round(denoEmptyMs)
      } + docker exec true ${Math.round(baseline.median)} (${(floor / baseline.median).toFixed(1)}× docker exec); commands handed to the waiting wrapper (traced): ${handed} of ${TRACED_EXECS}`,
    ],
  };
}

/** A git repository with one commit, for `--repo` runs. */
async function makeRepo(path: string): Promise<void> {
  await Deno.mkdir(path, { recursive: true });
  const git = async (...args: string[]) => {
    const result = await run(["git", "-C", path, ...args], { timeoutMs: CHILD_TIMEOUT_MS });
    if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr}`);
  };
  await git("init", "-q", "-b", "main");
  await Deno.writeTextFile(`${path}/README.md`, "# bench\n");
  await git("add", "README.md");
  await git("-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q", "-m", "init");
}

/** A second (and later) run on the same repository, nothing new to send, against a warm run. */
export async function measureRepo(
  setup: RunSetup,
  context: BenchContext,
  warmFirstMs: number,
): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const repo = `${setup.dir}/repo`;
  await makeRepo(repo);
  const argv = [...setup.runArgv, "--repo", repo];
  context.progress(`repository: a first run, then ${REPO_RUNS} more on the same repository`);
  const first = await timeCliRun(argv, at);
  const again: CliRunTiming[] = [];
  for (let i = 0; i < REPO_RUNS; i++) {
    context.signal.throwIfAborted();
    again.push(await timeCliRun(argv, at));
  }
  const second = summarize(again.map((t) => t.firstEventMs));
  const exit = summarize(again.map((t) => t.exitMs));
  return {
    figures: [{
      name: "repository, second run: warm run → first event",
      unit: "ms",
      baseline: warmFirstMs,
      measured: second.median,
      better: "lower",
      target: { text: `≤ ${REPO_TARGET_MS} ms median`, met: second.median <= REPO_TARGET_MS },
    }],
    notes: [
      `repository: first run first event ${Math.round(first.firstEventMs)} ms, exit ${Math.round(first.exitMs)} ms; later runs first event ${
        describe(second)
      }, exit ${describe(exit)}`,
    ],
  };
}

/** Containers (any state) carrying `label`. */
async function containersWith(label: string): Promise<string[]> {
  const result = await run(["docker", "ps", "-aq", "--filter", `label=${label}`], { timeoutMs: 30_000 });
  return result.stdout.split("\n").filter(Boolean);
}

/**
 * Runs of a `container: fresh` profile: from the last event to the exit (what the user waits for
 * after the result), against removing such a container and volume with docker, and how long until
 * nothing of them is left.
 */
export async function measureFresh(
  setup: RunSetup,
  context: BenchContext,
  freshProfile: string,
  image: string,
): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const argv = setup.runArgv.map((arg) => arg === setup.profile ? freshProfile : arg);
  context.progress(`fresh container: ${FRESH_RUNS} runs of a profile with sandbox.container: fresh`);
  const runs: CliRunTiming[] = [];
  const removals: number[] = [];
  const leftoversGoneMs: number[] = [];
  for (let i = 0; i < FRESH_RUNS; i++) {
    context.signal.throwIfAborted();
    const timing = await timeCliRun(argv, at);
    runs.push(timing);
    const exitedAt = performance.now();
    // How long after the exit nothing of the run's container is left (cleanup done behind it).
    const deadline = exitedAt + 60_000;
    while ((await containersWith(`dev.sandbox.profile=${freshProfile}`)).length > 0 && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    leftoversGoneMs.push(performance.now() - exitedAt);
    // The baseline: removing a container and a volume like the run's, with docker.
    const name = `${freshProfile}-baseline`;
    await timeCommand(["docker", "volume", "create", "--label", "dev.sandbox.bench=1", name], at);
    await timeCommand([
      "docker", "run", "-d", "--name", name, "--label", "dev.sandbox.bench=1",
      "--mount", `type=volume,src=${name},dst=/workspace`, image, "sleep", "infinity",
    ], at);
    removals.push(
      await timeCommand(["docker", "rm", "--force", name], at) + await timeCommand(["docker", "volume", "rm", name], at),
    );
  }
  const wait = summarize(runs.map((t) => t.exitMs - t.lastEventMs));
  const removal = summarize(removals);
  return {
    figures: [{
      name: "fresh container run: container+volume removal → last event to exit",
      unit: "ms",
      baseline: removal.median,
      measured: wait.median,
      better: "lower",
      target: { text: "< 0.5× the removal (not waited for)", met: wait.median < 0.5 * removal.median },
    }],
    notes: [
      `fresh: last event → exit ${describe(wait)}; docker rm --force + volume rm ${describe(removal)}; first event ${
        describe(summarize(runs.map((t) => t.firstEventMs)))
      }; nothing of the run's container left ${describe(summarize(leftoversGoneMs))} after the exit`,
    ],
  };
}

/** A name for a container of the bench's own measurements (`kind`: what it is for). */
function benchContainerName(kind: string): string {
  return `sandbox-bench-${kind}-${crypto.randomUUID().slice(0, 8)}`;
}

/** Start the bench's container `name` from `image` (removed by the caller: `docker rm --force`). */
async function startBenchContainer(name: string, image: string, at: TimedOptions): Promise<void> {
  await timeCommand(["docker", "run", "-d", "--name", name, "--label", "dev.sandbox.bench=1", image], at);
}

/**
 * The least that `count` concurrent runs must do, done at once with docker alone: `count - 1`
 * containers started (`docker run -d`; the hostile-agent rules give each run but the one that
 * leases the shared container one of its own), a worker and a relay loaded in each of them (the
 * shared container's worker and relay are already waiting: the image's programs under the exec
 * wrapper, loaded and exiting at once), and `count` CLI processes started (`--version`). Wall time
 * in milliseconds.
 */
async function floorAtOnce(setup: RunSetup, image: string, count: number, context: BenchContext): Promise<number> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const names = Array.from({ length: count - 1 }, () => benchContainerName("floor"));
  const started = performance.now();
  try {
    await Promise.all([
      ...names.map(async (name) => {
        await startBenchContainer(name, image, at);
        await Promise.all([timeCommand(workerStart(name), at), timeCommand(relayStart(name), at)]);
      }),
      ...Array.from({ length: count }, () => timeCommand(setup.cli(["--version"]), at)),
    ]);
    return performance.now() - started;
  } finally {
    await run(["docker", "rm", "--force", ...names], { timeoutMs: 60_000 });
  }
}

/** The image's worker under the exec wrapper, loaded (`--help`), as a run's worker starts. */
function workerStart(container: string): string[] {
  return [
    "docker", "exec", "--user", SANDBOX_USER, container, "sandbox-exec", `bench-worker-${crypto.randomUUID()}`,
    "deno", "run", "--allow-all", "--no-config", "/opt/sandbox/worker.js", "--help",
  ];
}

/** How long the machine gets to finish what runs leave behind (the next waiting worker's load). */
const SETTLE_MS = 1_500;

/** CPU time the whole machine has spent busy (not idle, not waiting for I/O), in seconds; /proc/stat. */
async function machineBusySeconds(): Promise<number> {
  const fields = (await Deno.readTextFile("/proc/stat")).split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
  const [user, nice, system, _idle, _iowait, irq, softirq, steal] = fields;
  // USER_HZ is 100 on Linux (sysconf(_SC_CLK_TCK)); the kernel reports /proc/stat in it everywhere.
  return (user + nice + system + irq + softirq + (steal ?? 0)) / 100;
}

/** The machine's busy CPU per second of wall time over `ms` (what it does with no run going). */
async function idleBusyRate(ms: number): Promise<number> {
  const from = await machineBusySeconds();
  await new Promise((resolve) => setTimeout(resolve, ms));
  return (await machineBusySeconds() - from) / (ms / 1000);
}

/**
 * The CPU that `work` costs the whole machine (the CLIs, the engine, the containers), in seconds:
 * busy time from its start until `SETTLE_MS` after it (what the runs left to do: the next waiting
 * worker's load), less what the machine spends meanwhile without them — the higher of two idle
 * readings, one before (after a pause that lets the previous measurement's cleanup end) and one
 * after: the estimate errs low, never high.
 */
async function machineCpuOf<T>(work: () => Promise<T>): Promise<{ value: T; cpuSeconds: number }> {
  await new Promise((resolve) => setTimeout(resolve, 2 * SETTLE_MS));
  const idleBefore = await idleBusyRate(SETTLE_MS);
  const started = performance.now();
  const before = await machineBusySeconds();
  const value = await work();
  await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
  const busy = await machineBusySeconds() - before;
  const elapsed = (performance.now() - started) / 1000;
  const idle = Math.max(idleBefore, await idleBusyRate(SETTLE_MS));
  return { value, cpuSeconds: Math.max(0, busy - idle * elapsed) };
}

/**
 * `CONCURRENT` runs of `argv` one after another, then (after `pauseMs`) all at once: wall times,
 * and the CPU the runs one after another cost the machine.
 */
async function sequentialThenAtOnce(
  argv: string[],
  at: TimedOptions,
  pauseMs = 0,
): Promise<{ sequential: number; sequentialCpuSeconds: number; concurrent: number; together: CliRunTiming[] }> {
  const { value: sequential, cpuSeconds: sequentialCpuSeconds } = await machineCpuOf(async () => {
    const started = performance.now();
    for (let i = 0; i < CONCURRENT; i++) await timeCliRun(argv, at);
    return performance.now() - started;
  });
  if (pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, pauseMs));
  const started = performance.now();
  const together = await Promise.all(Array.from({ length: CONCURRENT }, () => timeCliRun(argv, at)));
  return { sequential, sequentialCpuSeconds, concurrent: performance.now() - started, together };
}

/**
 * The least wall time in which this machine's cores can do the CPU work of the runs one after
 * another, all at once: their CPU seconds over the cores. Concurrent runs do at least that work
 * (each isolated run does what it does alone, and those in containers of their own more), so no
 * schedule finishes them sooner; a target below it cannot be met on this machine.
 */
function cpuFloor(name: string, sequentialCpuSeconds: number, concurrent: number): Figure {
  return {
    name,
    unit: "ms",
    baseline: (sequentialCpuSeconds / navigator.hardwareConcurrency) * 1000,
    measured: concurrent,
    better: "lower",
  };
}

/** What the CPU accounting says of the runs one after another: cores busy, and the floor's ratio. */
function cpuNote(sequential: number, sequentialCpuSeconds: number): string {
  const cores = navigator.hardwareConcurrency;
  const floor = (sequentialCpuSeconds / cores) * 1000;
  return `the ${CONCURRENT} runs one after another cost the machine ${sequentialCpuSeconds.toFixed(2)} CPU-s (${
    (sequentialCpuSeconds / CONCURRENT * 1000).toFixed(0)
  } ms a run, the next waiting worker's load included) in ${(sequential / 1000).toFixed(2)} s: ${
    (sequentialCpuSeconds / (sequential / 1000)).toFixed(2)
  } of ${cores} cores busy; at once, the same work needs at least ${(floor / 1000).toFixed(2)} s on ${cores} cores, ${
    (floor / sequential).toFixed(2)
  }× the sequential time (target ${CONCURRENT_TARGET_RATIO}×: it needs ${
    Math.ceil(sequentialCpuSeconds / (CONCURRENT_TARGET_RATIO * sequential / 1000))
  } cores at this CPU per run)`;
}

/** The container each run worked in, from its run log. */
async function containersOf(setup: RunSetup, runs: CliRunTiming[]): Promise<string[]> {
  return await Promise.all(runs.map(async (timing) => {
    const meta = JSON.parse(await Deno.readTextFile(`${setup.state}/sandbox/runs/${timing.runId}/meta.json`)) as {
      extra?: { container?: string };
    };
    return meta.extra?.container ?? "?";
  }));
}

/** The concurrency target's figure: `concurrent` wall time against `sequential`. */
function concurrencyFigure(name: string, sequential: number, concurrent: number): Figure {
  return {
    name,
    unit: "ms",
    baseline: sequential,
    measured: concurrent,
    better: "lower",
    target: {
      text: `≤ ${CONCURRENT_TARGET_RATIO}× sequential`,
      met: concurrent <= CONCURRENT_TARGET_RATIO * sequential,
    },
  };
}

/**
 * Wall time of `count` runs of the profile at once, and one after another; each must succeed. The
 * floor beside it: what those concurrent runs must do at least, done at once with docker alone
 * (floorAtOnce).
 */
export async function measureConcurrency(setup: RunSetup, context: BenchContext, image: string): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  context.progress(`concurrency: the floor, ${CONCURRENT - 1} containers started, ${CONCURRENT - 1} relays and workers and ${CONCURRENT} CLIs loaded at once (3 times)`);
  const floors: number[] = [];
  for (let i = 0; i < 3; i++) floors.push(await floorAtOnce(setup, image, CONCURRENT, context));
  const floor = summarize(floors);
  context.progress(`concurrency: ${CONCURRENT} runs one after another, then ${CONCURRENT} at once`);
  const { sequential, sequentialCpuSeconds, concurrent, together } = await sequentialThenAtOnce(setup.runArgv, at);
  // One run at a time in a container (the hostile-agent rules): each in a container of its own,
  // but for the profile's shared one, whose lease lets runs in one after another (a run that
  // starts once another has ended there takes it, as a run after a run does).
  const places = await containersOf(setup, together);
  const shared = places.filter((name) => name === setup.container).length;
  if (new Set(places).size !== CONCURRENT - Math.max(0, shared - 1)) {
    throw new Error(`${CONCURRENT} concurrent runs shared a container of their own: ${places.join(", ")}`);
  }
  return {
    figures: [
      concurrencyFigure(`${CONCURRENT} concurrent runs, one profile: one after another → at once (wall)`, sequential, concurrent),
      {
        name: `floor: ${CONCURRENT - 1} containers, workers, relays, ${CONCURRENT} CLIs at once → ${CONCURRENT} runs at once`,
        unit: "ms",
        baseline: floor.median,
        measured: concurrent,
        better: "lower",
      },
      cpuFloor(`CPU floor: the ${CONCURRENT} sequential runs' CPU ÷ ${navigator.hardwareConcurrency} cores → ${CONCURRENT} runs at once`, sequentialCpuSeconds, concurrent),
    ],
    notes: [
      `concurrency, CPU: ${cpuNote(sequential, sequentialCpuSeconds)}`,
      `concurrency: ${CONCURRENT} runs at once, all succeeded, ${shared} in the shared container (one after another), ${
        CONCURRENT - shared
      } each in its own; first events ${
        describe(summarize(together.map((t) => t.firstEventMs)))
      }, exits ${describe(summarize(together.map((t) => t.exitMs)))}; floor (${CONCURRENT - 1} containers started with docker run -d, a worker and a relay loaded in each, ${CONCURRENT} CLI starts, all at once) ${
        describe(floor)
      }, ${(floor.median / sequential).toFixed(2)}× the ${CONCURRENT} runs one after another`,
    ],
  };
}

/** How long the pool's waiting workers get to load after `up` (8 of ~0.2 s of CPU, on 2 cores). */
const POOL_SETTLE_MS = 3_000;

/**
 * The same 8 runs at once, and one after another, on a profile that keeps 8 shared containers
 * (`sandbox.containers: 8`), made by `up` beforehand: what an orchestrator that runs 8 at a time
 * configures. Each run must succeed in a shared container of the profile, no two at once in one.
 */
/**
 * The CPU that `CONCURRENT` loads of the waiting worker cost the machine (each a `docker exec` of
 * the worker under the wrapper, in a container of the image made for this): at most what the runs
 * spend on the next run's worker, since a run's lease starts it without a `docker exec`.
 */
async function workerLoadsCpuSeconds(setup: RunSetup, image: string, context: BenchContext): Promise<number> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const name = benchContainerName("loads");
  try {
    await startBenchContainer(name, image, at);
    await timeCommand(workerStart(name), at);
    const { cpuSeconds } = await machineCpuOf(async () => {
      for (let i = 0; i < CONCURRENT; i++) await timeCommand(workerStart(name), at);
    });
    return cpuSeconds;
  } finally {
    await run(["docker", "rm", "--force", name], { timeoutMs: 60_000 });
  }
}

export async function measurePool(setup: RunSetup, context: BenchContext, poolProfile: string, image: string): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const argv = setup.runArgv.map((arg) => arg === setup.profile ? poolProfile : arg);
  context.progress(`pool: up of a profile with sandbox.containers: ${CONCURRENT}`);
  const up = await run(setup.cli(["up", "-p", poolProfile]), { ...at, timeoutMs: CHILD_TIMEOUT_MS });
  if (up.exitCode !== 0) throw new Error(`up -p ${poolProfile} failed: ${up.stderr.slice(-2_000)}`);
  await new Promise((resolve) => setTimeout(resolve, POOL_SETTLE_MS));
  context.progress(`pool: ${CONCURRENT} runs one after another, then ${CONCURRENT} at once`);
  const { sequential, sequentialCpuSeconds, concurrent, together } = await sequentialThenAtOnce(argv, at, POOL_SETTLE_MS);
  // Where each worked: a shared container's lease lets one run at a time in, so a run that found
  // every one busy may follow another that had ended into its container, or make one of its own.
  const shared = (await containersOf(setup, together)).filter((name) => name === `sandbox-${poolProfile}` || /-s\d+$/.test(name));
  context.progress(`pool: the CPU of ${CONCURRENT} waiting workers' loads`);
  const loads = await workerLoadsCpuSeconds(setup, image, context);
  const inWindow = Math.max(0, sequentialCpuSeconds - loads);
  return {
    figures: [
      concurrencyFigure(`${CONCURRENT} concurrent runs, sandbox.containers: ${CONCURRENT} after up: one after another → at once`, sequential, concurrent),
      cpuFloor(`CPU floor (pool): the ${CONCURRENT} sequential runs' CPU ÷ ${navigator.hardwareConcurrency} cores → ${CONCURRENT} runs at once`, sequentialCpuSeconds, concurrent),
      cpuFloor(`CPU floor (pool), the next workers' loads left out → ${CONCURRENT} runs at once`, inWindow, concurrent),
    ],
    notes: [
      `pool, CPU: ${cpuNote(sequential, sequentialCpuSeconds)}`,
      `pool, CPU without the next waiting workers' loads (${CONCURRENT} of them cost at most ${loads.toFixed(2)} CPU-s, measured by docker exec; runs at once may leave them until after the last one ends): ${
        inWindow.toFixed(2)
      } CPU-s, at least ${(inWindow / navigator.hardwareConcurrency).toFixed(2)} s on ${navigator.hardwareConcurrency} cores, ${
        (inWindow / navigator.hardwareConcurrency * 1000 / sequential).toFixed(2)
      }× the sequential time`,
      `pool (sandbox.containers: ${CONCURRENT}, made by up ${Math.round(POOL_SETTLE_MS / 1000)} s before): ${CONCURRENT} runs at once, all succeeded, ${shared.length} in the profile's shared containers (${new Set(shared).size} different ones), ${
        CONCURRENT - shared.length
      } in one of their own; first events ${
        describe(summarize(together.map((t) => t.firstEventMs)))
      }, exits ${describe(summarize(together.map((t) => t.exitMs)))}`,
    ],
  };
}
