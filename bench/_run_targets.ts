/**
 * The figures of `run_bench.ts` beyond the single run, each beside its baseline from the same run:
 * the bundled CLI's start against the checkout's, `sandbox exec -- true` against `docker exec
 * true`, the objects a second run on a 50 MB repository sends against the first run's, an idle
 * pooled sandbox's memory against a plain `sleep` container's, and 8 concurrent runs from a pool
 * of 8 against the same 8 one after another.
 */
import type { BenchContext, Figure } from "./main.ts";
import { run } from "../lib/process.ts";
import { readTrailer, trailerComment } from "../lib/sandbox/bundle_trailer.ts";
import {
  machineMemoryMiB,
  memoryMiB,
  POOLED_NAME,
  readyPooled,
  removeBenchContainers,
  runContainer,
  startBenchContainer,
  waitSettled,
} from "./_pool_probe.ts";
import {
  CHILD_TIMEOUT_MS,
  type CliRunTiming,
  describe,
  summarize,
  timeCliRun,
  timeCommand,
  type TimedOptions,
  timeRepeated,
  wallClockMs,
} from "./_run_helpers.ts";

/** Clock ticks per second of /proc/stat (USER_HZ, 100 on every Linux the project runs on). */
const USER_HZ = 100;

/** Milliseconds of CPU time the whole machine has spent busy since boot (every core summed). */
function machineBusyMs(): number {
  const [cpu] = Deno.readTextFileSync("/proc/stat").split("\n");
  // cpu  user nice system idle iowait irq softirq steal guest …: the work done here is user, nice,
  // system, irq and softirq (guest time is in user already; steal is another machine's).
  const [user, nice, system, , , irq, softirq] = cpu.trim().split(/\s+/).slice(1).map(Number);
  return ((user + nice + system + irq + softirq) * 1000) / USER_HZ;
}

/** The relay's user (lib/sandbox/docker_provider.ts RELAY_USER). */
const RELAY_USER = "10002:10002";

/** What `run_bench.ts` prepared: a frozen source copy, a state directory, its profiles. */
export interface RunSetup {
  dir: string;
  src: string;
  state: string;
  /** Default settings: a pool of 1. */
  profile: string;
  /** `sandbox.pool: 0`: every run starts its own container. */
  coldProfile: string;
  /** `sandbox.pool: 8`. */
  poolProfile: string;
  /** The profile's development sandbox (`sandbox start`, `exec`): runs never use it. */
  container: string;
  env: Record<string, string>;
  cli(args: string[]): string[];
  /** `sandbox run agentic` of the replayed conversation in `profile`. */
  runArgv: string[];
  /** The same in another profile. */
  runArgvOf(profile: string): string[];
}

export interface Measured {
  figures: Figure[];
  notes: string[];
}

const STARTS = 9;
const EXECS = 7;
const CONCURRENT = 8;
const EXEC_TARGET_RATIO = 1.5;
const CONCURRENT_TARGET_RATIO = 0.5;
/** The repository of the second-run figure: this many files of random (incompressible) bytes. */
const REPO_FILES = 50;
const REPO_FILE_BYTES = 1_000_000;
const REPO_TARGET_BYTES = 1_000_000;
/** docker stats samples of each container's memory. */
const MEMORY_SAMPLES = 3;
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
async function peakMiB(
  argv: readonly string[],
  options: TimedOptions,
): Promise<number | undefined> {
  try {
    await Deno.stat(GNU_TIME);
  } catch {
    return undefined;
  }
  const result = await run([GNU_TIME, "-f", "peak-kib %M", ...argv], {
    ...options,
    timeoutMs: CHILD_TIMEOUT_MS,
  });
  const match = /peak-kib (\d+)\s*$/.exec(result.stderr);
  return match ? Number(match[1]) / 1024 : undefined;
}

/** The bundled CLI (scripts/bundle.sh of the frozen copy) as the installed launcher runs it. */
async function bundledCli(
  setup: RunSetup,
  context: BenchContext,
): Promise<(args: string[], file?: string) => string[]> {
  context.progress("bundling the CLI from the frozen sources (scripts/bundle.sh)");
  const built = await run(["bash", `${setup.src}/scripts/bundle.sh`], {
    cwd: setup.src,
    timeoutMs: CHILD_TIMEOUT_MS,
  });
  if (built.exitCode !== 0) {
    throw new Error(`scripts/bundle.sh failed: ${built.stderr.slice(-2_000)}`);
  }
  const config = JSON.parse(await Deno.readTextFile(`${setup.src}/deno.json`)) as {
    unstable?: string[];
  };
  const unstable = (config.unstable ?? []).map((feature) => `--unstable-${feature}`);
  // What the launcher runs: the start file, which imports dist/sandbox.js unless it supervises a run.
  const start = `${setup.src}/dist/sandbox-start.js`;
  return (args, file = start) => [
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    "--no-config",
    ...unstable,
    file,
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
  if (text.split(comment).length !== 2) {
    throw new Error(`the embedded worker is not found once in ${bundle}`);
  }
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
  const [checkout, bundle] = await alternate(
    setup.cli(["--version"]),
    bundled(["--version"]),
    STARTS,
    at,
  );
  const checkoutStart = summarize(checkout);
  const bundleStart = summarize(bundle);
  const asBuilt = `${setup.src}/dist/sandbox.js`;
  const withoutWorker = await bundleWithoutWorker(asBuilt);
  const [withWorker, noWorker] = await alternate(
    bundled(["--version"], asBuilt),
    bundled(["--version"], withoutWorker),
    STARTS,
    at,
  );
  const checkoutPeak = await peakMiB(setup.cli(["--version"]), at);
  const bundlePeak = await peakMiB(bundled(["--version"]), at);
  context.progress(
    "warm runs through the bundle (same image: its tag is a hash of the same bytes)",
  );
  // The CLI's own arguments of the warm run: from its `run agentic` on.
  const runArgs = setup.runArgv.slice(setup.runArgv.indexOf("agentic") - 1);
  const bundleRuns: CliRunTiming[] = [];
  await timeCliRun(bundled(runArgs), at);
  for (let i = 0; i < 5; i++) bundleRuns.push(await timeCliRun(bundled(runArgs), at));
  // The same runs started from the bundle file itself, as the launcher did before it had a start
  // file: the CLI parsed all of the bundle before starting the supervisor, which parses it again.
  const directRuns: CliRunTiming[] = [];
  for (let i = 0; i < 5; i++) directRuns.push(await timeCliRun(bundled(runArgs, asBuilt), at));
  const disturbed = [...bundleRuns, ...directRuns].filter((t) => t.disturbed).length;
  const bundleFirst = summarize(bundleRuns.map((t) => t.firstEventMs));
  const directFirst = summarize(directRuns.map((t) => t.firstEventMs));
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
    {
      name: "warm run through the bundle: the bundle file itself → its start file, first event",
      unit: "ms",
      baseline: directFirst.median,
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
      `bundle: --version ${describe(bundleStart)}; checkout --version ${
        describe(checkoutStart)
      }; warm run first event ${describe(bundleFirst)} (from the bundle file itself ${
        describe(directFirst)
      })${disturbed ? ` (${disturbed} not warm)` : ""}; peak memory checkout ${
        checkoutPeak?.toFixed(0) ?? "?"
      } MiB, bundle ${bundlePeak?.toFixed(0) ?? "?"} MiB`,
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
    "docker",
    "exec",
    "--user",
    RELAY_USER,
    container,
    "sandbox-exec",
    `bench-relay-${crypto.randomUUID()}`,
    "deno",
    "run",
    "--quiet",
    "--no-config",
    "--no-prompt",
    "--allow-net=127.0.0.1",
    "/opt/sandbox/relay.js",
    "--check",
  ];
}

/**
 * `sandbox exec -- true` against `docker exec CONTAINER true`, alternating; and against its floor
 * on this machine, measured in the same run: a Deno process's start (an empty script), then
 * `docker exec true` — the two things any `sandbox exec` must do one after the other, its relay
 * being started ahead of it (the spare relay the exec before it left, lib/proxy/spare_relay.ts).
 * The relay's own start is measured too: what an exec without a spare relay waits for on top.
 * `sandbox exec` acts on the profile's development sandbox, which `run_bench.ts` started.
 */
export async function measureExec(
  setup: RunSetup,
  context: BenchContext,
  denoEmptyMs: number,
): Promise<Measured> {
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
      `exec: sandbox exec -- true ${describe(measured)}; docker exec true ${
        describe(baseline)
      }; relay start (docker exec of relay.js --check under the wrapper) ${
        describe(relay)
      } (what an exec without a spare relay would wait for on top); an exec of its own would take at least ${
        Math.round(floor)
      } ms = deno empty ${Math.round(denoEmptyMs)} + docker exec true ${
        Math.round(baseline.median)
      } (${(floor / baseline.median).toFixed(1)}× docker exec)`,
    ],
  };
}

/**
 * A git repository with one commit of `REPO_FILES` files of random bytes: incompressible, so the
 * objects a run sends are as large as the files.
 */
async function makeLargeRepo(path: string): Promise<void> {
  await Deno.mkdir(path, { recursive: true });
  const git = async (...args: string[]) => {
    const result = await run(["git", "-C", path, ...args], { timeoutMs: CHILD_TIMEOUT_MS });
    if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr}`);
  };
  await git("init", "-q", "-b", "main");
  const bytes = new Uint8Array(REPO_FILE_BYTES);
  for (let i = 0; i < REPO_FILES; i++) {
    // getRandomValues fills at most 65,536 bytes at a time.
    for (let at = 0; at < bytes.length; at += 65_536) {
      crypto.getRandomValues(bytes.subarray(at, at + 65_536));
    }
    await Deno.writeFile(`${path}/random-${i}.bin`, bytes);
  }
  await git("add", ".");
  await git(
    "-c",
    "user.name=bench",
    "-c",
    "user.email=bench@localhost",
    "commit",
    "-q",
    "-m",
    "random",
  );
}

/** What a run on a local repository says of its checkout (lib/run/run.ts, on stderr). */
const CHECKED_OUT =
  /^sandbox: checked out .+ \(([0-9a-f]{12})\)(?:; (\d+) bytes of objects added to its cache)?$/m;

/** Bytes of objects the run sent into the repository's object cache (none said: 0). */
function objectsSent(timing: CliRunTiming): number {
  const match = CHECKED_OUT.exec(timing.stderr);
  if (!match) {
    throw new Error(
      `the run on the repository did not say what it checked out:\n${timing.stderr.slice(-2_000)}`,
    );
  }
  return match[2] === undefined ? 0 : Number(match[2]);
}

/**
 * A second run on a 50 MB repository: the bytes of objects it sends into the repository's object
 * cache (none: the first run put them there, and the cache outlives the runs), against the first
 * run's.
 */
export async function measureRepo(setup: RunSetup, context: BenchContext): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const repo = `${setup.dir}/repo`;
  context.progress(
    `repository: ${REPO_FILES} × ${REPO_FILE_BYTES.toLocaleString("en-US")} random bytes committed`,
  );
  await makeLargeRepo(repo);
  const argv = [...setup.runArgv, "--repo", repo];
  context.progress("repository: a first run, then a second one");
  const first = await timeCliRun(argv, at);
  const second = await timeCliRun(argv, at);
  const [firstBytes, secondBytes] = [objectsSent(first), objectsSent(second)];
  const pooled = POOLED_NAME.test(await runContainer(setup.state, second.runId!));
  return {
    figures: [{
      name: `repository of ${
        REPO_FILES * REPO_FILE_BYTES / 1e6
      } MB, objects sent: first run → second run`,
      unit: "MB",
      baseline: firstBytes / 1e6,
      measured: secondBytes / 1e6,
      better: "lower",
      target: { text: `≤ ${REPO_TARGET_BYTES / 1e6} MB`, met: secondBytes <= REPO_TARGET_BYTES },
    }],
    notes: [
      `repository: first run sent ${firstBytes.toLocaleString("en-US")} B, first event ${
        Math.round(first.firstEventMs)
      } ms, exit ${Math.round(first.exitMs)} ms; second run sent ${
        secondBytes.toLocaleString("en-US")
      } B, first event ${Math.round(second.firstEventMs)} ms, exit ${
        Math.round(second.exitMs)
      } ms, ${
        pooled
          ? "in a sandbox claimed from the repository's pool"
          : "in a sandbox of its own (the repository's pool was empty)"
      }`,
    ],
  };
}

/** `MEMORY_SAMPLES` readings of each container's memory, alternating; the median of each, MiB. */
async function memoryOf(a: string, b: string): Promise<[number, number]> {
  const samples: [number[], number[]] = [[], []];
  for (let i = 0; i < MEMORY_SAMPLES; i++) {
    samples[0].push(await memoryMiB(a));
    samples[1].push(await memoryMiB(b));
  }
  return [summarize(samples[0]).median, summarize(samples[1]).median];
}

/**
 * Memory of one idle pooled sandbox (its worker loaded and waiting, its relay waiting, as `docker
 * stats` shows it) against a plain `sleep infinity` container of the same image, and how many
 * pooled sandboxes fit in this machine's memory (MemTotal).
 */
export async function measureMemory(
  setup: RunSetup,
  context: BenchContext,
  image: string,
): Promise<Measured> {
  context.progress(
    `memory: an idle pooled sandbox and a sleep container of ${image}, ${MEMORY_SAMPLES} × docker stats each`,
  );
  await waitSettled(setup.state, setup.profile, { signal: context.signal });
  const [pooled] = await readyPooled(setup.state, setup.profile);
  const sleeper = await startBenchContainer(image, "sleep", ["sleep", "infinity"]);
  let memory: [number, number];
  try {
    memory = await memoryOf(sleeper, pooled);
  } finally {
    await removeBenchContainers([sleeper]);
  }
  const [plainMiB, pooledMiB] = memory;
  const totalMiB = await machineMemoryMiB();
  const fit = (mib: number, of = totalMiB) => Math.floor(of / mib);
  return {
    figures: [
      {
        name: "idle sandbox memory: sleep container → pooled sandbox (worker, relay waiting)",
        unit: "MiB",
        baseline: plainMiB,
        measured: pooledMiB,
        better: "lower",
      },
    ],
    notes: [
      `memory (docker stats MemUsage, median of ${MEMORY_SAMPLES}): pooled sandbox ${
        pooledMiB.toFixed(1)
      } MiB (${pooled}), sleep infinity ${plainMiB.toFixed(1)} MiB; ${
        fit(pooledMiB)
      } idle pooled sandboxes fit in this machine's ${(totalMiB / 1024).toFixed(1)} GiB, ${
        fit(pooledMiB, 24 * 1024)
      } per 24 GiB`,
    ],
  };
}

/**
 * Bring the pool of 8 to full (`up`) and wait until every one of its workers listens and the
 * containers of `previous` runs are gone: each run of the concurrency figure starts from there.
 */
async function fullPool(setup: RunSetup, context: BenchContext, previous: string[]): Promise<void> {
  const up = await run(setup.cli(["up", "-p", setup.poolProfile]), {
    cwd: setup.dir,
    env: setup.env,
    signal: context.signal,
    timeoutMs: CHILD_TIMEOUT_MS,
  });
  if (up.exitCode !== 0) {
    throw new Error(`up -p ${setup.poolProfile} failed: ${up.stderr.slice(-2_000)}`);
  }
  await waitSettled(setup.state, setup.poolProfile, {
    previous,
    ready: CONCURRENT,
    signal: context.signal,
  });
}

/**
 * `CONCURRENT` runs of a profile with `sandbox.pool: 8` all at once after `up`, against the same
 * runs one after another, each from a full pool (`up` and the workers' load before each, not
 * timed): wall time to the last exit, and the sum of the exits. Every run must succeed in a
 * container of its own.
 */
export async function measureConcurrency(
  setup: RunSetup,
  context: BenchContext,
): Promise<Measured> {
  const at = { cwd: setup.dir, env: setup.env, signal: context.signal };
  const argv = setup.runArgvOf(setup.poolProfile);
  context.progress(
    `concurrency: ${CONCURRENT} runs one after another, each after up -p ${setup.poolProfile} (sandbox.pool: ${CONCURRENT})`,
  );
  const inRow: CliRunTiming[] = [];
  let previous: string[] = [];
  // The machine's CPU while each run ran, from its spawn to its exit (its refill and its
  // container's removal, which the CLI awaits, included): what a run costs, whatever does the work.
  let busyInRow = 0;
  for (let i = 0; i < CONCURRENT; i++) {
    context.signal.throwIfAborted();
    await fullPool(setup, context, previous);
    const busyBefore = machineBusyMs();
    inRow.push(await timeCliRun(argv, at));
    busyInRow += machineBusyMs() - busyBefore;
    previous = [await runContainer(setup.state, inRow[i].runId!)];
  }
  const sequential = inRow.reduce((sum, t) => sum + t.exitMs, 0);
  await fullPool(setup, context, previous);
  context.progress(`concurrency: ${CONCURRENT} runs at once`);
  const startedAt = wallClockMs();
  const together = await Promise.all(
    Array.from({ length: CONCURRENT }, () => timeCliRun(argv, at)),
  );
  const concurrent = wallClockMs() - startedAt;
  const lastFirstEvent = Math.max(
    ...together.map((t) => t.spawnedAtMs - startedAt + t.firstEventMs),
  );
  const places = await Promise.all(together.map((t) => runContainer(setup.state, t.runId!)));
  if (new Set(places).size !== CONCURRENT) {
    throw new Error(`${CONCURRENT} concurrent runs shared a container: ${places.join(", ")}`);
  }
  const pooled = places.filter((name) => POOLED_NAME.test(name)).length;
  const readyAfter = (await readyPooled(setup.state, setup.poolProfile)).length;
  const cores = navigator.hardwareConcurrency;
  // Runs at once that use every core can end no sooner than their CPU time spread over all cores.
  const cpuFloor = busyInRow / cores;
  return {
    figures: [{
      name:
        `${CONCURRENT} runs, sandbox.pool: ${CONCURRENT} after up: one after another → at once (wall)`,
      unit: "ms",
      baseline: sequential,
      measured: concurrent,
      better: "lower",
      // Runs whose refills did not happen did less work than those one after another did: the
      // figure compares only when the pool is full again.
      target: {
        text: `≤ ${CONCURRENT_TARGET_RATIO}× one after another${
          readyAfter < CONCURRENT
            ? ` (not comparable: the pool held ${readyAfter} of ${CONCURRENT} afterwards)`
            : ""
        }`,
        met: concurrent <= CONCURRENT_TARGET_RATIO * sequential && readyAfter >= CONCURRENT,
      },
    }, {
      name:
        `what-if: ${CONCURRENT} runs at once, bound by CPU: their CPU time in a row ÷ ${cores} cores → at once (wall)`,
      unit: "ms",
      baseline: cpuFloor,
      measured: concurrent,
      better: "lower",
    }],
    notes: [
      `concurrency: ${CONCURRENT} runs in a row kept the machine's CPUs busy ${
        Math.round(busyInRow).toLocaleString("en-US")
      } ms in all (${
        Math.round(busyInRow / CONCURRENT)
      } ms a run from its spawn to its exit, its refill and its container's removal included; /proc/stat): at once on ${cores} cores they cannot end before ${
        Math.round(cpuFloor).toLocaleString("en-US")
      } ms, ${(cpuFloor / sequential).toFixed(2)}× the same runs in a row`,
      `concurrency: one after another, exits ${
        describe(summarize(inRow.map((t) => t.exitMs)))
      }, first events ${
        describe(summarize(inRow.map((t) => t.firstEventMs)))
      }; at once, all succeeded in ${CONCURRENT} different sandboxes (${pooled} claimed from the pool), every first event by ${
        Math.round(lastFirstEvent)
      } ms, first events ${describe(summarize(together.map((t) => t.firstEventMs)))}, exits ${
        describe(summarize(together.map((t) => t.exitMs)))
      } (each exit waits for its run's refill of the pool); the pool held ${readyAfter} ready sandboxes afterwards (sandbox.pool: ${CONCURRENT})`,
    ],
  };
}
