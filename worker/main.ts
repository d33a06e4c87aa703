/**
 * The agent worker: runs inside the sandbox (or on the host in mode "none") and speaks the wire
 * protocol of `lib/protocol.ts` on stdout, nothing else; diagnostics go to stderr.
 *
 *   worker serve [--await-job DIR]
 *   worker agentic  --prompt-file F [--instructions-file F] [--model M] [--cwd D] [--max-turns N]
 *   worker generate --prompt-file F [--schema F.json] [--model M]
 *
 * `serve` takes its job — prompt, run variables, options — as one JSON line on stdin (or, with
 * `--await-job`, from the host that claims the pooled container it waits in): see
 * worker/serve.ts and worker/job.ts. The argv forms read the prompt from a file, which they only
 * read (its owner, the host, deletes it). The LLM connection comes from the environment (see
 * `llm.ts`), the job's variables added to it. Exit codes: 0 once a result was emitted, even an
 * `is_error` one (a missing prompt file, a bad schema, an unreachable LLM, a failed agent are all
 * results); 2 for bad usage (nothing on stdout); 1 if a result could not be emitted at all; 130
 * when the host went away (`serve`'s input ended) before the end.
 */
import { parseArgs } from "node:util";
import { Emitter } from "./emit.ts";
import type { WorkerJob } from "./job.ts";
import { type JsonSchema, loadJsonSchema } from "./json_schema.ts";
import { describeError, llmSettings, scrubEnvironment } from "./llm.ts";
import {
  type Channel,
  EXIT_HOST_GONE,
  inputEnded,
  jobChannel,
  readJob,
  sayWarm,
  stdioChannel,
} from "./serve.ts";
import { StdoutWriter } from "../lib/output.ts";

export const USAGE = `Usage:
  worker serve [--await-job DIR]
  worker agentic  --prompt-file F [--instructions-file F] [--model M] [--cwd D] [--max-turns N]
  worker generate --prompt-file F [--schema F.json] [--model M]

serve reads its job (one JSON line: mode, prompt, env, cwd, instructions, model, maxTurns,
schema) from stdin, or with --await-job from DIR/job.sock once the host makes it.
Environment: SANDBOX_LLM_BASE_URL, SANDBOX_LLM_TOKEN, SANDBOX_LLM_MODEL, SANDBOX_LLM_API,
SANDBOX_LLM_MAX_RETRIES. Output: one AgenticMessage JSON object per line on stdout.`;

export type WorkerCommand =
  | { kind: "help" }
  | { kind: "serve"; awaitJob?: string }
  | {
    kind: "agentic";
    promptFile: string;
    instructionsFile?: string;
    model?: string;
    cwd?: string;
    maxTurns?: number;
  }
  | { kind: "generate"; promptFile: string; schemaFile?: string; model?: string };

const FLAGS = {
  serve: ["await-job"],
  agentic: ["prompt-file", "instructions-file", "model", "cwd", "max-turns"],
  generate: ["prompt-file", "schema", "model"],
} as const;

/** Parse argv; raises `TypeError` with a usage message on bad input. */
export function parseWorkerArgs(args: readonly string[]): WorkerCommand {
  const [mode, ...rest] = args;
  if (mode === undefined || mode === "--help" || mode === "-h" || mode === "help") {
    return { kind: "help" };
  }
  if (mode !== "agentic" && mode !== "generate" && mode !== "serve") {
    throw new TypeError(`Unknown mode "${mode}": expected "serve", "agentic" or "generate"`);
  }
  const options = Object.fromEntries(
    FLAGS[mode].map((name) => [name, { type: "string" as const }]),
  );
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({ args: [...rest], options, strict: true, allowPositionals: false }));
  } catch (error) {
    throw new TypeError(`Invalid arguments for "${mode}": ${(error as Error).message}`);
  }
  const value = (name: string) => values[name] as string | undefined;
  if (mode === "serve") return { kind: "serve", awaitJob: value("await-job") };
  const promptFile = value("prompt-file");
  if (!promptFile) throw new TypeError(`Missing --prompt-file for "${mode}"`);
  if (mode === "generate") {
    return { kind: "generate", promptFile, schemaFile: value("schema"), model: value("model") };
  }
  const maxTurnsText = value("max-turns");
  const maxTurns = maxTurnsText === undefined ? undefined : Number(maxTurnsText);
  if (maxTurns !== undefined && (!Number.isInteger(maxTurns) || maxTurns < 1)) {
    throw new TypeError(`Invalid --max-turns "${maxTurnsText}": expected a positive integer`);
  }
  return {
    kind: "agentic",
    promptFile,
    instructionsFile: value("instructions-file"),
    model: value("model"),
    cwd: value("cwd"),
    maxTurns,
  };
}

/** Run the worker; returns the exit code. */
export async function main(args: readonly string[]): Promise<number> {
  let command: WorkerCommand;
  try {
    command = parseWorkerArgs(args);
  } catch (error) {
    console.error(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (command.kind === "help") {
    console.log(USAGE);
    return 0;
  }
  if (command.kind === "serve") return await serve(command.awaitJob);
  divertConsole();
  const fallbackModel = command.model || Deno.env.get("SANDBOX_LLM_MODEL") || null;
  return await runTask(
    async () => {
      const prompt = await readInput(command.promptFile, "prompt");
      if (prompt.trim() === "") throw new Error(`The prompt file "${command.promptFile}" is empty`);
      if (command.kind === "agentic") {
        const instructions = command.instructionsFile
          ? await readInput(command.instructionsFile, "instructions")
          : undefined;
        return {
          mode: "agentic",
          prompt,
          env: {},
          instructions,
          cwd: command.cwd,
          model: command.model,
          maxTurns: command.maxTurns,
        };
      }
      const schema = command.schemaFile ? await loadJsonSchema(command.schemaFile) : undefined;
      return { mode: "generate", prompt, env: {}, schema, model: command.model };
    },
    new Emitter(),
    fallbackModel,
  );
}

/**
 * How many times a pooled worker runs an agent before its job (worker/agentic.ts `warmUpAgentic`):
 * V8 optimises what has run often. Measured on a pooled worker with a local upstream (medians of
 * 5), from the job to its first model request: 52 ms after 1 round, 35 after 2, ~30 after 5; and a
 * whole warm run to its first event (`sandbox run`, medians of 9, two alternations): 381 and 376 ms
 * after 2 rounds, 359 and 330 after 5. The rounds run while the container waits in the pool; a
 * run's exit, which awaits its refill, measured the same (1,395 ms after 2, 1,397 after 5).
 */
const WARM_UP_ROUNDS = 5;

/**
 * `worker serve`: the job from stdin, or (with `awaitJob`, a directory) from the host that claims
 * the pooled container, once the code is loaded. Exits as soon as the input ends after the job:
 * the host is gone.
 */
async function serve(awaitJob: string | undefined): Promise<number> {
  // A pooled worker loads its code, and runs it a few times, while it waits: its job then starts
  // warm. It takes its job as soon as its code is loaded (a run that claims its container need not
  // wait for the warm-up to reach it); a job that comes meanwhile ends the warm-up, and starts once
  // the round under way is over.
  let warming: Promise<void> = Promise.resolve();
  let jobCame = false;
  const preload = async () => {
    const [{ warmUpAgentic }] = await Promise.all([
      import("./agentic.ts"),
      import("./generate.ts"),
    ]);
    warming = (async () => {
      for (let round = 0; round < WARM_UP_ROUNDS && !jobCame; round++) await warmUpAgentic();
    })();
    // Warm: the host that filled the pool may be waiting to hear it (its container is ready then).
    if (awaitJob !== undefined) void warming.then(() => sayWarm(awaitJob));
  };
  let channel: Channel;
  try {
    channel = awaitJob === undefined ? stdioChannel() : await jobChannel(awaitJob, preload);
    jobCame = true;
  } catch (error) {
    console.error(`worker: cannot take a job from "${awaitJob}": ${describeError(error)}`);
    return 1;
  }
  divertConsole(channel.diagnostic);
  const reader = channel.readable.getReader();
  const emit = new Emitter(new StdoutWriter(channel.events));
  let job: WorkerJob | undefined;
  /** Set once the job has run: its input ending then is the host done, not gone. */
  let finished = false;
  const code = await runTask(
    async () => {
      try {
        job = (await readJob(reader)).job;
      } catch (error) {
        throw new Error(`Cannot read the job: ${(error as Error).message}`);
      }
      // The host's input stays open while it waits for the run; its end means nobody does.
      void inputEnded(reader).then(async () => {
        if (finished) return;
        await channel.finish(EXIT_HOST_GONE);
        Deno.exit(EXIT_HOST_GONE);
      });
      if (job.prompt.trim() === "") throw new Error("The job's prompt is empty");
      await warming;
      return job;
    },
    emit,
    () => job?.model || job?.env.SANDBOX_LLM_MODEL || Deno.env.get("SANDBOX_LLM_MODEL") || null,
  );
  finished = true;
  await channel.finish(code);
  return code;
}

/**
 * Read the task (`load`), then run it, emitting events, the result and the usage; every failure
 * before the result becomes an is_error result. Returns the exit code.
 */
/** What the exec wrapper keeps of the container's environment for the agent's commands (scripts/sandbox-exec). */
const CONTAINER_ENV_PREFIX = "SANDBOX_CONTAINER_ENV_";

/**
 * The environment the agent's commands start from: this process's, with the container's own
 * variables given back under their names (the exec wrapper started this worker without them, so
 * that none could steer it) and the wrapper's prefixed copies gone from this process.
 */
function ownEnvironment(): Record<string, string> {
  const own: Record<string, string> = {};
  const container: Record<string, string> = {};
  for (const [name, value] of Object.entries(Deno.env.toObject())) {
    if (!name.startsWith(CONTAINER_ENV_PREFIX)) own[name] = value;
    else {
      container[name.slice(CONTAINER_ENV_PREFIX.length)] = value;
      Deno.env.delete(name);
    }
  }
  return { ...own, ...container };
}

async function runTask(
  load: () => Promise<WorkerJob>,
  emit: Emitter,
  fallbackModel: string | null | (() => string | null),
): Promise<number> {
  const started = performance.now();
  try {
    const job = await load();
    const givenEnv = { ...ownEnvironment(), ...job.env };
    const llm = llmSettings(givenEnv, job.model);
    scrubEnvironment();
    if (job.mode === "agentic") {
      const cwd = workingDirectory(job.cwd);
      // Loaded on demand: `generate` need not evaluate deepagents, LangGraph and LangSmith.
      const { runAgentic } = await import("./agentic.ts");
      const { prompt, instructions, maxTurns } = job;
      await runAgentic({ prompt, instructions, cwd, maxTurns, llm, toolEnv: givenEnv }, emit);
    } else {
      const schema: JsonSchema | undefined = job.schema;
      const { runGenerate } = await import("./generate.ts");
      await runGenerate({ prompt: job.prompt, schema, llm }, emit);
    }
    return 0;
  } catch (error) {
    if (emit.resultSent) {
      console.error(`worker: failed after the result: ${describeError(error)}`);
      return 1;
    }
    const model = typeof fallbackModel === "function" ? fallbackModel() : fallbackModel;
    try {
      await emit.result(`Cannot run the worker: ${describeError(error)}`, { isError: true, model });
      await emit.usage({
        duration_ms: Math.round(performance.now() - started),
        num_turns: 0,
        model,
      });
      return 0;
    } catch (emitError) {
      console.error(`worker: cannot emit a result: ${describeError(emitError)}`);
      return 1;
    }
  }
}

/**
 * stdout (or the socket) belongs to the protocol: a library that logs with console.log must not
 * corrupt it. Every console method writes to stderr, or through `line` when given.
 */
function divertConsole(line?: (text: string) => void): void {
  if (!line) {
    console.log = console.info = console.debug = console.error;
    return;
  }
  const write = (...args: unknown[]) =>
    line(args.map((arg) => typeof arg === "string" ? arg : Deno.inspect(arg)).join(" "));
  console.log =
    console.info =
    console.debug =
    console.warn =
    console.error =
      write;
}

async function readInput(file: string, what: string): Promise<string> {
  try {
    return await Deno.readTextFile(file);
  } catch (error) {
    throw new Error(`Cannot read ${what} file "${file}": ${(error as Error).message}`);
  }
}

/** Enter `--cwd`, creating it if needed (saves the host a round trip into the sandbox). */
function workingDirectory(cwd: string | undefined): string {
  if (cwd === undefined) return Deno.cwd();
  try {
    Deno.mkdirSync(cwd, { recursive: true });
    Deno.chdir(cwd);
  } catch (error) {
    throw new Error(`Cannot use working directory "${cwd}": ${(error as Error).message}`);
  }
  return Deno.cwd();
}

if (import.meta.main) {
  const code = await main(Deno.args);
  // Keep-alive sockets and library timers must not hold the process open after the usage line.
  // On the next turn, not inside this module's evaluation: Deno writes a module's V8 code cache
  // only once its evaluation is complete, and the image build's run of `--help` is what leaves the
  // worker's compiled code in the image's Deno cache, which every worker start copies (without it,
  // each start compiles the 7 MB bundle again: ~80 ms).
  setTimeout(() => Deno.exit(code), 0);
}
