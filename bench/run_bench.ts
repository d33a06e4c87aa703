/**
 * `sandbox run` end to end against raw docker (DESIGN.md targets: warm run ≤ 300 ms to the first
 * worker event, cold run ≤ 1.2 s, ≥ 20,000 NDJSON events/s through the CLI).
 *
 * The CLI runs as a subprocess (`deno run -A cli.ts run agentic`) with a replayed one-step
 * conversation (`--model replay:FILE`, the LLM answers at once), in a fresh profile with default
 * settings (no network: egress proxy and the relay for every run), from a frozen copy
 * of the sources and with a temporary state directory. Every figure stands beside a baseline
 * measured in the same run: `docker exec CONTAINER true` for the warm run, `docker run --rm IMAGE
 * true` for the cold run, `cat` for `sandbox logs`. The warm figure is broken down into its parts
 * (CLI start, the run's own trace points with SANDBOX_TRACE=1 — its steps and each call to the
 * engine —, the worker's start) so that it shows where the time goes.
 */
import type { BenchContext, Benchmark, BenchResult, Figure } from "./main.ts";
import { readLines } from "../lib/lines.ts";
import { StdoutWriter } from "../lib/output.ts";
import { decodeMessages, encodeMessage } from "../lib/run/protocol.ts";
import { Redactor } from "../lib/redact.ts";
import { newRunId, RunLog } from "../lib/run/run_log.ts";
import { removeProfile } from "../tests/_helpers.ts";
import {
  chunked,
  type CliRunTiming,
  countLines,
  describe,
  snapshotSources,
  summarize,
  syntheticEvents,
  timeCliRun,
  timeCommand,
  timeRepeated,
} from "./_run_helpers.ts";
import { measureBundle, measureConcurrency, measureExec, measureFresh, measurePool, measureRepo } from "./_run_targets.ts";

const WARM_RUNS = 7;
const TRACED_RUNS = 3;
/** How long an idle warm run waits after the run before (its cleanup done behind it). */
const IDLE_PAUSE_MS = 1_500;
const COLD_RUNS = 5;
const STARTUP_RUNS = 5;
const EVENTS = 100_000;
const LOGS_ROUNDS = 3;
const WARM_TARGET_MS = 300;
const WARM_EXIT_TARGET_MS = 400;
const COLD_TARGET_MS = 1_200;
const EVENTS_TARGET = 20_000;
/** The sandbox user (lib/docker_provider.ts SANDBOX_USER). */
const SANDBOX_USER = "10001:10001";
const WORKER_HELP = [
  "deno",
  "run",
  "--allow-all",
  "--no-config",
  "/opt/sandbox/worker.js",
  "--help",
];
/** Where the what-if figure keeps a writable copy of the image's Deno cache (the sandbox's tmpfs). */
const WRITABLE_DENO_DIR = "/tmp/bench-deno-dir";

/** A one-step conversation: the model answers "done" at once. */
const RECORDING = {
  version: 1,
  kind: "openai",
  responses: [{
    status: 200,
    body: {
      id: "chatcmpl-bench",
      object: "chat.completion",
      created: 0,
      model: "replay",
      choices: [{
        index: 0,
        message: { role: "assistant", content: "done" },
        finish_reason: "stop",
      }],
      usage: { prompt_tokens: 10, completion_tokens: 1, total_tokens: 11 },
    },
  }],
};

interface Setup {
  dir: string;
  src: string;
  state: string;
  profile: string;
  container: string;
  env: Record<string, string>;
  /** The CLI with `args`, run from the frozen sources. */
  cli(args: string[]): string[];
  /** `sandbox run agentic` of the replayed conversation. */
  runArgv: string[];
  /** A profile like `profile` with `sandbox.container: fresh`. */
  freshProfile: string;
}

async function prepare(): Promise<Setup> {
  const dir = await Deno.makeTempDir({ prefix: "sandbox-bench-run-" });
  const src = `${dir}/src`;
  const state = `${dir}/state`;
  try {
    await snapshotSources(src);
  } catch (error) {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw error;
  }
  await Deno.mkdir(state);
  const profile = `bench-${crypto.randomUUID().slice(0, 8)}`;
  const freshProfile = `${profile}-fresh`;
  await Deno.writeTextFile(
    `${dir}/sandbox.yaml`,
    `profiles:\n  ${profile}: {}\n  ${freshProfile}: {sandbox: {container: fresh}}\n  ${profile}-pool: {sandbox: {containers: 8}}\n`,
  );
  await Deno.writeTextFile(`${dir}/recording.json`, JSON.stringify(RECORDING));
  await Deno.writeTextFile(`${dir}/prompt.txt`, "Answer with one word: done\n");
  await Deno.writeTextFile(`${src}/empty.ts`, "\n");
  const cli = (args: string[]) => [
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    `${src}/cli.ts`,
    "--config",
    `${dir}/sandbox.yaml`,
    ...args,
  ];
  return {
    dir,
    src,
    state,
    profile,
    container: `sandbox-${profile}`,
    env: { XDG_STATE_HOME: state },
    cli,
    runArgv: cli([
      "run",
      "agentic",
      "--prompt-file",
      `${dir}/prompt.txt`,
      "-p",
      profile,
      "--model",
      `replay:${dir}/recording.json`,
      "--format",
      "ndjson",
    ]),
    freshProfile,
  };
}

/** One `SANDBOX_TRACE` line: milliseconds since the CLI process started, and what happened. */
interface TracePoint {
  ms: number;
  label: string;
}

const TRACE_LINE = /^sandbox: trace ([\d.]+) ms (.*)$/;

/**
 * A run with `SANDBOX_TRACE=1`: its timing, and the trace points it printed on stderr (the CLI's
 * own clock: its steps, and each call to the engine, see lib/trace.ts).
 */
async function tracedRun(
  setup: Setup,
  signal: AbortSignal,
): Promise<{ timing: CliRunTiming; points: TracePoint[] }> {
  const timing = await timeCliRun(setup.runArgv, { cwd: setup.src, env: { ...setup.env, SANDBOX_TRACE: "1" }, signal });
  const points = timing.stderr.split("\n").flatMap((line) => {
    const match = TRACE_LINE.exec(line);
    return match ? [{ ms: Number(match[1]), label: match[2] }] : [];
  });
  return { timing, points };
}

/** The phases of one traced run, in milliseconds (the CLI's clock). */
interface Phases {
  /** Process start to the run id. */
  cli: number;
  /** Run id to the job handed to the worker (sandbox, lease, relay, worker reached). */
  setup: number;
  /** Job handed over to the first event. */
  worker: number;
}

function phasesOf(points: TracePoint[]): Phases {
  const at = (label: string) => {
    const point = points.find((p) => p.label === label);
    if (!point) throw new Error(`traced run: no "${label}" (trace: ${points.map((p) => p.label).join(", ")})`);
    return point.ms;
  };
  const id = at("run: id");
  const job = at("driver: job sent");
  return { cli: id, setup: job - id, worker: at("run: first event") - job };
}

/** The trace points, shortened: `label @ms`. */
function listPoints(points: TracePoint[]): string {
  return points.map((p) => `${p.label.replace(/^docker api: /, "api ")} @${Math.round(p.ms)}`).join(", ");
}

/**
 * How `sandbox run` handles worker events, in this process; events per second.
 *
 * - `pipeline`: as the CLI does it: ContainerDriver decodes and validates each worker line,
 *   runAgent appends it to the run log (redacted, one synchronous write), the CLI prints it
 *   through its buffered stdout (events join the write in flight), flushed at the end.
 * - `floor`: the naive way, two awaited writes per event, with no decoding, validation,
 *   redaction or encoding.
 * - `cpu`: decoding, validation, redaction and encoding, with no writes.
 */
async function pipelineRate(
  chunks: Uint8Array[],
  expected: number,
  state: string,
  mode: "pipeline" | "floor" | "cpu",
): Promise<{ rate: number; runId: string }> {
  const id = newRunId();
  using devNull = await Deno.open("/dev/null", { write: true });
  const stdout = new StdoutWriter(devNull, { buffered: mode === "pipeline" });
  const redactor = new Redactor();
  // A run always has one secret registered: the session token.
  redactor.add(crypto.randomUUID() + crypto.randomUUID());
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state);
  let log: RunLog;
  try {
    log = await RunLog.create({
      id,
      mode: "agentic",
      profile: "bench",
      model: "bench-model",
      sandbox: "container",
    }, redactor);
  } finally {
    if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", previous);
  }
  await using _log = log;
  let count = 0;
  let bytes = 0;
  const started = performance.now();
  const lines = readLines(ReadableStream.from(chunks));
  if (mode === "pipeline") {
    for await (const message of decodeMessages(lines)) {
      await log.append(message);
      await stdout.line(encodeMessage(message));
      count++;
    }
  } else if (mode === "cpu") {
    for await (const message of decodeMessages(lines)) {
      bytes += redactor.redact(JSON.stringify(message)).length + encodeMessage(message).length;
      count++;
    }
  } else {
    const encoder = new TextEncoder();
    using events = await Deno.open(`${log.dir}/events.ndjson`, { append: true });
    for await (const line of lines) {
      await events.write(encoder.encode(line + "\n"));
      await stdout.write(line + "\n");
      count++;
    }
  }
  await stdout.flush();
  await log.finish({ status: "succeeded", exitCode: 0, usage: null, error: null });
  const ms = performance.now() - started;
  if (mode === "cpu" && bytes === 0) throw new Error("pipeline (cpu): encoded nothing");
  if (count !== expected) {
    throw new Error(`pipeline (${mode}): expected ${expected} events, got ${count}`);
  }
  return { rate: count / (ms / 1000), runId: id };
}

async function run(context: BenchContext): Promise<BenchResult> {
  const { signal } = context;
  const setup = await prepare();
  const { cli, container, env, src } = setup;
  const at = { cwd: src, env, signal };
  const notes: string[] = [];
  try {
    // 1. Process start: deno alone, and the CLI's module graph.
    context.progress(`deno start: ${STARTUP_RUNS} × empty script and cli.ts --version`);
    const denoEmpty = summarize(
      await timeRepeated(
        [Deno.execPath(), "run", "-A", "--quiet", `${src}/empty.ts`],
        STARTUP_RUNS,
        at,
      ),
    );
    const cliVersion = summarize(await timeRepeated(cli(["--version"]), STARTUP_RUNS, at));

    // 2. Warm runs: the container is up and the image present.
    context.progress(
      `warm-up run in profile ${setup.profile} (builds the image when this checkout's is missing)`,
    );
    const warmup = await timeCliRun(setup.runArgv, at);
    if (warmup.disturbed) {
      notes.push("the warm-up run built the image (this checkout's sources had no image yet)");
    }
    context.progress(`warm: ${WARM_RUNS} runs, each after a raw docker exec`);
    await timeCommand(["docker", "exec", container, "true"], at);
    const execTrue: number[] = [];
    const warm: CliRunTiming[] = [];
    for (let i = 0; i < WARM_RUNS; i++) {
      signal.throwIfAborted();
      execTrue.push(await timeCommand(["docker", "exec", container, "true"], at));
      warm.push(await timeCliRun(setup.runArgv, at));
    }
    const disturbedWarm = warm.filter((t) => t.disturbed).length;
    if (disturbedWarm > 0) {
      notes.push(
        `${disturbedWarm} warm runs rebuilt the image or replaced the container: not warm`,
      );
    }
    // The same, each on an idle container: long enough after the run before that nothing of its
    // cleanup still runs there (its lease's release, the next worker loading: ~0.3–0.5 s here).
    // Back to back, a run waits for that worker, whose load (~0.2 s of CPU) its own start
    // competes with; idle, it finds the worker and the relay waiting.
    context.progress(`warm, idle: ${WARM_RUNS} runs, each ${IDLE_PAUSE_MS} ms after the one before, then after a raw docker exec`);
    const idle: CliRunTiming[] = [];
    for (let i = 0; i < WARM_RUNS; i++) {
      signal.throwIfAborted();
      await new Promise((resolve) => setTimeout(resolve, IDLE_PAUSE_MS));
      execTrue.push(await timeCommand(["docker", "exec", container, "true"], at));
      idle.push(await timeCliRun(setup.runArgv, at));
    }
    const idleFirst = summarize(idle.map((t) => t.firstEventMs));
    const idleExit = summarize(idle.map((t) => t.exitMs));
    const execBaseline = summarize(execTrue);
    const warmFirst = summarize(warm.map((t) => t.firstEventMs));
    const warmExit = summarize(warm.map((t) => t.exitMs));
    const warmRunId = summarize(warm.map((t) => t.runIdMs ?? NaN).filter(Number.isFinite));

    // 3. The worker's own start inside the container, as shipped and with a writable Deno cache.
    context.progress(`worker start in the container: ${STARTUP_RUNS} × worker.js --help, twice`);
    const workerHelp = summarize(
      await timeRepeated(
        ["docker", "exec", "--user", SANDBOX_USER, container, ...WORKER_HELP],
        STARTUP_RUNS,
        at,
      ),
    );
    const writableCache = [
      "docker",
      "exec",
      "--user",
      SANDBOX_USER,
      container,
      "sh",
      "-c",
      `[ -d ${WRITABLE_DENO_DIR} ] || cp -a "$DENO_DIR" ${WRITABLE_DENO_DIR}; DENO_DIR=${WRITABLE_DENO_DIR} exec "$@"`,
      "sh",
      ...WORKER_HELP,
    ];
    const workerWritable = summarize(await timeRepeated(writableCache, STARTUP_RUNS, at));

    // 4. Where a warm run's time goes: its own trace points (SANDBOX_TRACE=1).
    context.progress(`warm, traced: ${TRACED_RUNS} runs with SANDBOX_TRACE=1`);
    const traced: { timing: CliRunTiming; phases: Phases; points: TracePoint[] }[] = [];
    for (let i = 0; i < TRACED_RUNS; i++) {
      signal.throwIfAborted();
      await timeCommand(["docker", "exec", container, "true"], at);
      const { timing, points } = await tracedRun(setup, signal);
      traced.push({ timing, phases: phasesOf(points), points });
    }
    const setupPhase = summarize(traced.map((t) => t.phases.setup));
    const workerPhase = summarize(traced.map((t) => t.phases.worker));
    const typical = [...traced].sort((a, b) => a.timing.firstEventMs - b.timing.firstEventMs)[
      Math.ceil(traced.length / 2) - 1
    ];
    notes.push(`warm, traced, median run (ms on the CLI's clock; first event on stdout @${Math.round(typical.timing.firstEventMs)} from spawn): ${listPoints(typical.points)}`);

    // 5. Cold runs: the container removed before each (image, network and volume kept).
    const image = (await new Deno.Command("docker", {
      args: ["container", "inspect", "--format", "{{.Config.Image}}", container],
      stdout: "piped",
      stderr: "null",
    }).output()).stdout;
    const imageTag = new TextDecoder().decode(image).trim();
    if (!imageTag) throw new Error(`cannot find the image of ${container}`);
    context.progress(
      `cold: ${COLD_RUNS} runs, container removed before each, each after a raw docker run --rm`,
    );
    const rm = ["docker", "rm", "--force", container];
    const runTrue: number[] = [];
    const cold: CliRunTiming[] = [];
    await timeCommand(["docker", "run", "--rm", imageTag, "true"], at);
    for (let i = 0; i < COLD_RUNS; i++) {
      signal.throwIfAborted();
      await timeCommand(rm, at);
      runTrue.push(await timeCommand(["docker", "run", "--rm", imageTag, "true"], at));
      cold.push(await timeCliRun(setup.runArgv, at));
    }
    const disturbedCold = cold.filter((t) => t.disturbed).length;
    if (disturbedCold > 0) {
      notes.push(`${disturbedCold} cold runs rebuilt the image: not image-present`);
    }
    await timeCommand(rm, at);
    const coldTraced = await tracedRun(setup, signal);
    notes.push(`cold, traced (ms on the CLI's clock): ${listPoints(coldTraced.points)}`);
    const runBaseline = summarize(runTrue);
    const coldFirst = summarize(cold.map((t) => t.firstEventMs));
    const coldExit = summarize(cold.map((t) => t.exitMs));

    // 6. NDJSON events: the CLI's pipeline in-process, then `sandbox logs` of the run it wrote.
    context.progress(
      `NDJSON: ${EVENTS.toLocaleString("en-US")} synthetic worker events in-process`,
    );
    const text = syntheticEvents(EVENTS);
    const chunks = chunked(new TextEncoder().encode(text));
    const small = chunked(new TextEncoder().encode(syntheticEvents(5_000)));
    for (const mode of ["floor", "pipeline", "cpu"] as const) {
      await pipelineRate(small, 5_000, setup.state, mode);
    }
    // Alternating rounds, best of each: the machine's other load only ever slows a round down.
    const rates = { floor: [] as number[], pipeline: [] as number[], cpu: [] as number[] };
    let runWithEvents = "";
    for (const mode of ["floor", "pipeline", "cpu", "pipeline", "floor"] as const) {
      signal.throwIfAborted();
      const { rate, runId } = await pipelineRate(chunks, EVENTS, setup.state, mode);
      rates[mode].push(rate);
      if (mode === "pipeline") runWithEvents = runId;
    }
    const best = (values: number[]) => Math.max(...values);
    context.progress(
      `NDJSON: sandbox logs of a ${
        EVENTS.toLocaleString("en-US")
      }-event run, ${LOGS_ROUNDS} rounds`,
    );
    const eventsFile = `${setup.state}/sandbox/runs/${runWithEvents}/events.ndjson`;
    const logsRates: number[] = [];
    const catRates: number[] = [];
    for (let i = 0; i < LOGS_ROUNDS; i++) {
      signal.throwIfAborted();
      for (
        const [argv, rates] of [[["cat", eventsFile], catRates], [
          cli(["logs", runWithEvents, "--format", "ndjson"]),
          logsRates,
        ]] as const
      ) {
        const { ms, lines } = await countLines(argv, at);
        if (lines !== EVENTS) {
          throw new Error(`${argv.join(" ")}: expected ${EVENTS} lines, got ${lines}`);
        }
        rates.push(lines / (ms / 1000));
      }
    }
    const logsRate = summarize(logsRates);
    const catRate = summarize(catRates);

    // 7. The other targets: the bundle's start, exec, a second repository run, a fresh-container
    // run's wait after its result, concurrent runs (last: it loads the machine most).
    const targets = [
      await measureBundle(setup, context, warmFirst.median),
      await measureExec(setup, context, denoEmpty.median),
      await measureRepo(setup, context, warmFirst.median),
      await measureFresh(setup, context, setup.freshProfile, imageTag),
      await measureConcurrency(setup, context, imageTag),
      await measurePool(setup, context, `${setup.profile}-pool`, imageTag),
    ];

    const figures: Figure[] = [
      {
        name: "warm run, back to back: process start → first event",
        unit: "ms",
        baseline: execBaseline.median,
        measured: warmFirst.median,
        better: "lower",
        target: { text: `≤ ${WARM_TARGET_MS} ms median`, met: warmFirst.median <= WARM_TARGET_MS },
      },
      {
        name: "warm run, back to back: process start → exit",
        unit: "ms",
        baseline: execBaseline.median,
        measured: warmExit.median,
        better: "lower",
        target: { text: `≤ ${WARM_EXIT_TARGET_MS} ms median`, met: warmExit.median <= WARM_EXIT_TARGET_MS },
      },
      {
        name: "warm run, container idle: process start → first event",
        unit: "ms",
        baseline: execBaseline.median,
        measured: idleFirst.median,
        better: "lower",
        target: { text: `≤ ${WARM_TARGET_MS} ms median`, met: idleFirst.median <= WARM_TARGET_MS },
      },
      {
        name: "warm run, container idle: process start → exit",
        unit: "ms",
        baseline: execBaseline.median,
        measured: idleExit.median,
        better: "lower",
        target: { text: `≤ ${WARM_EXIT_TARGET_MS} ms median`, met: idleExit.median <= WARM_EXIT_TARGET_MS },
      },
      {
        name: "cold run: process start → first event",
        unit: "ms",
        baseline: runBaseline.median,
        measured: coldFirst.median,
        better: "lower",
        target: { text: `≤ ${COLD_TARGET_MS} ms median`, met: coldFirst.median <= COLD_TARGET_MS },
      },
      {
        name: "cold run: process start → exit",
        unit: "ms",
        baseline: runBaseline.median,
        measured: coldExit.median,
        better: "lower",
      },
      {
        name: "part: deno start, empty script → cli.ts --version",
        unit: "ms",
        baseline: denoEmpty.median,
        measured: cliVersion.median,
        better: "lower",
      },
      {
        name: "part: warm, cli.ts --version → run id on stderr",
        unit: "ms",
        baseline: cliVersion.median,
        measured: warmRunId.median,
        better: "lower",
      },
      {
        name: "part: warm, run id → job handed to the worker (traced)",
        unit: "ms",
        baseline: 0,
        measured: setupPhase.median,
        better: "lower",
      },
      {
        name: "part: worker start in container, exec true → worker.js --help",
        unit: "ms",
        baseline: execBaseline.median,
        measured: workerHelp.median,
        better: "lower",
      },
      {
        name: "part: warm, worker --help → job handed over to first event (traced)",
        unit: "ms",
        baseline: workerHelp.median,
        measured: workerPhase.median,
        better: "lower",
      },
      {
        name: "what-if: worker --help, image cache → writable copy of it",
        unit: "ms",
        baseline: workerHelp.median,
        measured: workerWritable.median,
        better: "lower",
      },
      {
        name: `NDJSON in-process, ${EVENTS / 1000}k events: naive writes → CLI pipeline`,
        unit: "events/s",
        baseline: best(rates.floor),
        measured: best(rates.pipeline),
        better: "higher",
        target: {
          text: `≥ ${EVENTS_TARGET.toLocaleString("en-US")}/s`,
          met: best(rates.pipeline) >= EVENTS_TARGET,
        },
      },
      {
        name: `what-if: NDJSON in-process, decode+log+print → without the writes`,
        unit: "events/s",
        baseline: best(rates.pipeline),
        measured: best(rates.cpu),
        better: "higher",
      },
      {
        name: `NDJSON via CLI, ${EVENTS / 1000}k events: cat → sandbox logs`,
        unit: "events/s",
        baseline: catRate.median,
        measured: logsRate.median,
        better: "higher",
        target: {
          text: `≥ ${EVENTS_TARGET.toLocaleString("en-US")}/s`,
          met: logsRate.median >= EVENTS_TARGET,
        },
      },
      ...targets.flatMap((t) => t.figures),
    ];
    notes.push(...targets.flatMap((t) => t.notes));
    notes.unshift(
      `warm (back to back: each right after the run before and a docker exec) first event ${describe(warmFirst)}; docker exec true ${
        describe(execBaseline)
      }; exit ${describe(warmExit)}`,
      `warm, idle (each ${IDLE_PAUSE_MS} ms after the run before, then a docker exec) first event ${describe(idleFirst)}; exit ${
        describe(idleExit)
      }`,
      `cold first event ${describe(coldFirst)}; docker run --rm ${describe(runBaseline)}; exit ${
        describe(coldExit)
      }`,
      `starts: deno empty ${describe(denoEmpty)}; cli --version ${
        describe(cliVersion)
      }; run id (warm) ${describe(warmRunId)}; worker --help ${
        describe(workerHelp)
      }; with a writable cache ${describe(workerWritable)}`,
      `setup: profile ${setup.profile} with default settings (isolated network), --model replay (one instant answer: events thinking, result, usage), sources frozen in a temporary copy, temporary XDG_STATE_HOME`,
      `NDJSON: ${EVENTS.toLocaleString("en-US")} events × ${
        Math.round(text.length / EVENTS)
      } B in 64 KiB chunks; in-process to a run log on disk and /dev/null (floor: two awaited writes per event; pipeline: as the CLI), best of 2 alternating rounds (1 without writes); sandbox logs and cat whole-process (start included), ${LOGS_ROUNDS} rounds, ${
        describe(logsRate, "events/s")
      }`,
    );
    return { figures, notes };
  } finally {
    context.progress(`removing profile ${setup.profile}`);
    await removeProfile(setup.profile).catch(() => {});
    await removeProfile(setup.freshProfile).catch(() => {});
    await removeProfile(`${setup.profile}-pool`).catch(() => {});
    await Deno.remove(setup.dir, { recursive: true }).catch(() => {});
  }
}

export const benchmark: Benchmark = {
  name: "run",
  title: "sandbox run end to end vs raw docker; NDJSON events through the CLI",
  baselineLabel: "baseline",
  measuredLabel: "sandbox",
  run,
};
