/**
 * `ContainerDriver`: an agent driver whose every call runs the worker inside a sandbox — the
 * seeds' driver contract, in TypeScript.
 *
 * - `executeAgentic()` yields the worker's messages except `usage`, which `getUsage()` returns.
 * - `generate()` returns the result's content, or with a JSON Schema the parsed, validated value.
 * - `cleanupSession()` returns false: the driver keeps no conversation state.
 *
 * The worker runs as `worker serve` and gets its job — the prompt, the session variables, the
 * options — as one line on its input (worker/job.ts): the prompt never touches argv or a file, and
 * no extra `docker exec` writes or removes one. The job is checked like everything else that
 * enters a sandbox: no known secret in it (lib/secret_guard.ts).
 *
 * Errors: an empty prompt is a `usage` error (the caller's fault). A malformed or invalid line, a
 * worker that ends without a `result`, a schema mismatch and a failed `docker exec` are
 * `worker_failed` (or the provider's own code) with context. An agent CLI's private files are
 * removed in `finally`, whatever happened.
 */
import { trace } from "../trace.ts";
import { checkJson, type JsonSchema } from "../../worker/json_schema.ts";
import type { WorkerJob } from "../../worker/job.ts";
import { SandboxError } from "../errors.ts";
import { assertNoSecrets } from "../secret_guard.ts";
import { startWorker, type WorkerProcess } from "./worker_process.ts";
import { type AgenticMessage, decodeMessages, type DriverUsage } from "./protocol.ts";
import type { ExecStream, SandboxProvider } from "../sandbox/provider.ts";
import { formatDuration } from "../units.ts";
import type { AgentCli } from "../agents/agent_cli.ts";
import { translateAgentLines } from "../agents/translate.ts";

/** How the worker is started inside the image (with `serve`, it reads its job from stdin). */
export const WORKER_COMMAND = [
  "deno",
  "run",
  "--allow-all",
  "--no-config",
  "/opt/sandbox/worker.js",
] as const;
/** Where an agent CLI's per-run files live in the sandbox (a tmpfs, readable only by the sandbox user). */
export const PROMPT_ROOT = "/tmp/sandbox-prompts";

/**
 * The model's answer was an error or did not fit the schema: the model failed, not the sandbox.
 * (A `worker_failed` like the seeds' RuntimeError; the CLI exits 1 for it, as for an agent's
 * `is_error` result.)
 */
export class GenerationError extends SandboxError {
  override name = "GenerationError";
  constructor(message: string, options?: { detail?: string }) {
    super("worker_failed", message, options);
  }
}

export interface ContainerDriverOptions {
  provider: SandboxProvider;
  /** Session variables: the credential proxy's URL and token. Never a key. */
  env: Record<string, string>;
  model?: string;
  /** The worker command (default: the bundle baked into the image); `serve` is appended. */
  workerCommand?: readonly string[];
  /**
   * The worker of the next call, already started (a run starts it while its session opens, or
   * attaches one that was waiting in the sandbox): called once per call. Default: start
   * `workerCommand serve` when the call comes.
   */
  worker?: () => WorkerProcess | undefined;
  /** Directory for an agent CLI's files (default `/tmp/sandbox-prompts`). */
  promptRoot?: string;
  /** Worker diagnostics (stderr), line by line. */
  onStderrLine?: (line: string) => void;
  /**
   * Run this agent CLI for `executeAgentic` instead of the worker: its own events are translated
   * into messages on the host (`lib/agents/`).
   */
  agent?: AgentCli;
  /** Every line an agent CLI printed, and whether its translator knew it (for the run log). */
  onAgentEvent?: (line: string, known: boolean) => void | Promise<void>;
}

/** Runs an agent CLI in its working directory, created first when missing (one exec, not two). */
const ENTER_CWD = 'mkdir -p -- "$1" && cd -- "$1" && shift && exec "$@"';

export interface AgenticOptions {
  /** Working directory of the agent inside the sandbox (the worker creates it if missing). */
  cwd: string;
  instructions?: string;
  /** Names prompt files, so concurrent calls never collide (default: a random id). */
  runId?: string;
  timeoutMs?: number;
  signal?: AbortSignal;
  maxTurns?: number;
}

export interface GenerateOptions {
  schema?: JsonSchema;
  runId?: string;
  timeoutMs?: number;
  signal?: AbortSignal;
}

export class ContainerDriver {
  readonly #options: ContainerDriverOptions;
  #usage: DriverUsage | null = null;

  constructor(options: ContainerDriverOptions) {
    this.#options = options;
  }

  /** Usage reported by the last call's worker, or null. */
  getUsage(): DriverUsage | null {
    return this.#usage;
  }

  /** Always false: no session state to clean. */
  cleanupSession(_sessionId: string): boolean {
    return false;
  }

  async *executeAgentic(prompt: string, options: AgenticOptions): AsyncGenerator<AgenticMessage> {
    if (this.#options.agent) {
      return yield* this.#executeAgentCli(this.#options.agent, prompt, options);
    }
    // The worker creates and enters its cwd itself: one `docker exec` fewer per run.
    yield* this.#runWorker({
      mode: "agentic",
      prompt,
      env: this.#options.env,
      cwd: options.cwd,
      instructions: options.instructions,
      model: this.#options.model,
      maxTurns: options.maxTurns,
    }, options);
  }

  async generate(
    prompt: string,
    options: GenerateOptions = {},
  ): Promise<{ value: unknown; sessionId: null }> {
    let result: AgenticMessage | undefined;
    // The schema travels in the job, named by the caller's file: the worker's messages name it so.
    const job: WorkerJob = {
      mode: "generate",
      prompt,
      env: this.#options.env,
      model: this.#options.model,
      schema: options.schema,
    };
    for await (const message of this.#runWorker(job, options)) {
      if (message.type === "result") result = message;
    }
    if (!result) throw new SandboxError("worker_failed", "Worker did not emit a result message");
    if (result.is_error) {
      throw new GenerationError(`Generation failed: ${result.content ?? "no detail"}`);
    }
    if (!options.schema) return { value: result.content ?? "", sessionId: null };
    const checked = checkJson(result.content ?? "", options.schema);
    if (!checked.ok) {
      throw new GenerationError(`Worker result does not match the schema: ${checked.problem}`, {
        detail: (result.content ?? "").slice(0, 500),
      });
    }
    return { value: checked.value, sessionId: null };
  }

  /**
   * The worker with its job on its input: the prompt never touches argv or a file. The job is
   * checked first: no known secret enters the sandbox through it (the session token is no secret
   * of the host's: it is made for the sandbox).
   */
  async *#runWorker(
    job: WorkerJob,
    options: { timeoutMs?: number; signal?: AbortSignal },
  ): AsyncGenerator<AgenticMessage> {
    if (job.prompt.trim() === "") throw new SandboxError("usage", "The prompt is empty");
    const { provider } = this.#options;
    const target = `the worker in ${
      "containerName" in provider ? `sandbox "${provider.containerName}"` : "the sandbox"
    }`;
    assertNoSecrets(target, {
      env: job.env,
      envKind: "worker environment",
      argv: [job.cwd, job.model].filter((v): v is string => v !== undefined),
      texts: [
        { what: "the prompt", data: job.prompt },
        ...(job.instructions !== undefined
          ? [{ what: "the instructions", data: job.instructions }]
          : []),
        ...(job.schema
          ? [{
            what: `the JSON Schema "${job.schema.file}"`,
            data: JSON.stringify(job.schema.schema),
          }]
          : []),
      ],
    });
    const worker = this.#options.worker?.() ??
      startWorker(provider, [...this.#workerCommand(), "serve"], {
        timeoutMs: options.timeoutMs,
        signal: options.signal,
        onStderrLine: this.#options.onStderrLine,
      });
    try {
      worker.send(job);
      trace("driver: job sent");
      yield* this.#consume(worker.stream, { timeoutMs: options.timeoutMs });
    } finally {
      worker.close();
    }
  }

  /**
   * An agent CLI instead of the worker: its private files written (0600), the prompt on its stdin,
   * its events translated. The files go when it ends, whatever happened.
   */
  async *#executeAgentCli(
    agent: AgentCli,
    prompt: string,
    options: AgenticOptions,
  ): AsyncGenerator<AgenticMessage> {
    const files = await this.#writeInputs(prompt, options.runId, {
      instructions: options.instructions,
      promptFile: false,
    });
    const model = this.#options.model ?? this.#options.env.SANDBOX_LLM_MODEL;
    const launch = agent.launch({
      env: this.#options.env,
      model,
      runId: files.dir.slice(files.dir.lastIndexOf("/") + 1),
      instructions: options.instructions,
      instructionsFile: files.instructions,
      cwd: options.cwd,
    });
    try {
      for (const file of launch.files) {
        await this.#options.provider.writeFile(file.path, file.content, { mode: 0o600 });
      }
      const translator = agent.translator({
        model,
        onDiagnostic: (message) => this.#options.onStderrLine?.(`${agent.name}: ${message}`),
      });
      yield* this.#stream(["sh", "-c", ENTER_CWD, "sandbox-agent", options.cwd, ...launch.argv], {
        env: { ...this.#options.env, ...launch.env },
        stdin: prompt,
        timeoutMs: options.timeoutMs,
        signal: options.signal,
        producer: agent.name,
        decode: (lines) =>
          translateAgentLines(lines, translator, { onEvent: this.#options.onAgentEvent }),
      });
    } finally {
      const paths = launch.files.map((file) => file.path);
      if (paths.length > 0) {
        // Best effort: the files are the agent's own private inputs in the sandbox's /tmp (a
        // tmpfs), which goes with the sandbox; a failed removal must not hide the run's outcome.
        await this.#options.provider.exec(["rm", "-f", "--", ...paths], { timeoutMs: 30_000 })
          .catch(() => {});
      }
      await this.#removeInputs(files.dir);
    }
  }

  /** Run `argv` (an agent CLI), validate every line, keep `usage`, require exactly one `result`. */
  async *#stream(
    argv: string[],
    options: {
      cwd?: string;
      timeoutMs?: number;
      signal?: AbortSignal;
      env?: Record<string, string>;
      stdin?: string;
      /** Who prints the lines, for errors (default: the worker). */
      producer?: string;
      /** Lines to messages (default: the strict worker protocol). */
      decode?: (lines: AsyncIterable<string>) => AsyncIterable<AgenticMessage>;
    },
  ): AsyncGenerator<AgenticMessage> {
    const stream = this.#options.provider.execStream(argv, {
      cwd: options.cwd,
      env: options.env ?? this.#options.env,
      stdin: options.stdin,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      onStderrLine: this.#options.onStderrLine,
    });
    yield* this.#consume(stream, options);
  }

  /** Validate every line of `stream`, keep `usage`, require exactly one `result`. */
  async *#consume(
    stream: ExecStream,
    options: {
      timeoutMs?: number;
      producer?: string;
      decode?: (lines: AsyncIterable<string>) => AsyncIterable<AgenticMessage>;
    },
  ): AsyncGenerator<AgenticMessage> {
    this.#usage = null;
    const producer = options.producer ?? "Worker";
    let results = 0;
    try {
      for await (
        const message of speakOfTheRun(
          (options.decode ?? decodeMessages)(stream),
          options.timeoutMs,
        )
      ) {
        if (message.type === "usage") {
          this.#usage = message.usage;
          continue;
        }
        if (message.type === "result" && ++results > 1) {
          throw new SandboxError(
            "worker_failed",
            `${producer} emitted more than one result message`,
          );
        }
        yield message;
      }
    } finally {
      // Leaving early (a consumer's break, an error above) ends the worker inside the sandbox too.
      await stream[Symbol.asyncIterator]().return?.(undefined);
    }
    const outcome = await stream.outcome;
    if (results === 0) {
      const why = outcome.oomKilled
        ? "it was killed by the sandbox memory limit"
        : `it exited with code ${outcome.exitCode}`;
      throw new SandboxError("worker_failed", `${producer} did not emit a result message: ${why}`, {
        detail: outcome.stderrTail || undefined,
      });
    }
  }

  #workerCommand(): readonly string[] {
    return this.#options.workerCommand ?? WORKER_COMMAND;
  }

  /** An agent CLI's files into the sandbox through stdin, mode 0600, in a per-run directory. */
  async #writeInputs(
    prompt: string,
    runId: string | undefined,
    extra: { instructions?: string; promptFile?: boolean },
  ): Promise<{ dir: string; prompt: string; instructions?: string; schema?: string }> {
    if (prompt.trim() === "") throw new SandboxError("usage", "The prompt is empty");
    const dir = `${this.#options.promptRoot ?? PROMPT_ROOT}/${runId ?? crypto.randomUUID()}`;
    const { provider } = this.#options;
    const files: { dir: string; prompt: string; instructions?: string; schema?: string } = {
      dir,
      prompt: `${dir}/prompt.txt`,
    };
    try {
      // Inside the try: a write that fails half-way must not leave a partial prompt behind.
      // (An agent CLI reads its prompt from stdin: no file.)
      if (extra.promptFile !== false) {
        await provider.writeFile(files.prompt, prompt, { mode: 0o600 });
      }
      if (extra.instructions !== undefined) {
        files.instructions = `${dir}/instructions.txt`;
        await provider.writeFile(files.instructions, extra.instructions, { mode: 0o600 });
      }
    } catch (error) {
      await this.#removeInputs(dir);
      throw error;
    }
    return files;
  }

  async #removeInputs(dir: string): Promise<void> {
    try {
      await this.#options.provider.exec(["rm", "-rf", "--", dir], { timeoutMs: 30_000 });
    } catch {
      // Cleanup failures are not the caller's problem; the sandbox's /tmp is a tmpfs.
    }
  }
}

/**
 * The provider words a deadline or an interrupt as a command's ("Command timed out after 5000 ms
 * in sandbox ..."); the caller of a driver started a run, so the error says what became of it.
 */
async function* speakOfTheRun(
  messages: AsyncIterable<AgenticMessage>,
  timeoutMs: number | undefined,
): AsyncGenerator<AgenticMessage> {
  try {
    yield* messages;
  } catch (error) {
    if (error instanceof SandboxError && error.code === "timeout" && timeoutMs !== undefined) {
      throw new SandboxError("timeout", `The run timed out after ${formatDuration(timeoutMs)}`, {
        cause: error,
      });
    }
    if (error instanceof SandboxError && error.code === "interrupted") {
      throw new SandboxError("interrupted", "The run was interrupted", { cause: error });
    }
    throw error;
  }
}
