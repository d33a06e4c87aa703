/**
 * The one seam around `Deno.Command`. Nothing else in the project spawns processes.
 *
 * - argv arrays only: nothing is ever joined into a shell string.
 * - stdout and stderr are read concurrently with the exit status, never abandoned early.
 * - Every call takes an AbortSignal and an optional timeout; either ends the child with SIGTERM,
 *   then SIGKILL after a grace period.
 * - The tail of stderr is kept for error messages.
 */
import { CommandExitError, SandboxError, type SandboxErrorCode, tail } from "./errors.ts";
import { MAX_LINE_CHARS, readLines } from "./lines.ts";

/** How long a child gets between SIGTERM and SIGKILL. */
export const KILL_GRACE_MS = 2_000;
/** How much of stderr is kept for error messages. */
const STDERR_TAIL_CHARS = 8_192;
/** How long stderr may stay open after a killed child has exited. */
const STDERR_GRACE_MS = 500;

export interface SpawnOptions {
  cwd?: string;
  /** Variables to set. With `clearEnv`, the only variables the child sees (plus PATH). */
  env?: Record<string, string>;
  /** Start from an empty environment instead of inheriting the host's. */
  clearEnv?: boolean;
  /** Bytes or a stream for the child's stdin; without it stdin is /dev/null. */
  stdin?: Uint8Array | string | ReadableStream<Uint8Array>;
  signal?: AbortSignal;
  timeoutMs?: number;
  /** Called with each stderr line as it arrives (the tail is kept either way). */
  onStderrLine?: (line: string) => void;
  /** Called with each decoded stderr chunk as it arrives. */
  onStderrChunk?: (text: string) => void;
  /** Cap on one stdout line for `lines()`. */
  maxLineChars?: number;
}

/** How a child ended. */
export interface ProcessOutcome {
  argv: readonly string[];
  /** Exit code; 128 + signal number when killed by a signal. */
  exitCode: number;
  /** The signal that ended it, if any. */
  signal: Deno.Signal | null;
  durationMs: number;
  /** Ended by `timeoutMs`. */
  timedOut: boolean;
  /** Ended by the caller's AbortSignal. */
  aborted: boolean;
  stderrTail: string;
}

export interface RunResult extends ProcessOutcome {
  stdout: string;
  stderr: string;
}

/** The program to run was not found (ENOENT on spawn). */
export class ProgramNotFoundError extends SandboxError {
  override name = "ProgramNotFoundError";
  constructor(readonly program: string, options?: ErrorOptions) {
    super("exec_failed", `Cannot run "${program}": not found on PATH`, options);
  }
}

/**
 * A running child as its users see it: a local process (`ChildProcess`), or a `docker exec` made
 * through the engine's API in its stead (lib/sandbox/engine_api.ts).
 */
export interface Child {
  readonly argv: readonly string[];
  /** Raw stdout; consume it or `lines()`, not both. */
  readonly stdout: ReadableStream<Uint8Array>;
  /** Resolves when the child has exited and stderr is fully read. */
  readonly finished: Promise<ProcessOutcome>;
  /** stdout as lines; a line over the cap raises `LineTooLongError` (and the child is stopped). */
  lines(): AsyncGenerator<string>;
  /** Stop it: SIGTERM, then SIGKILL after the grace period. */
  kill(graceMs?: number): void;
}

/** A running child. Read `lines()` (or `stdout`) and await `finished`. */
export class ChildProcess implements Child {
  readonly argv: readonly string[];
  /** Raw stdout; consume it or `lines()`, not both. */
  readonly stdout: ReadableStream<Uint8Array>;
  /** Resolves when the child has exited and stderr is fully read. */
  readonly finished: Promise<ProcessOutcome>;
  readonly #child: Deno.ChildProcess;
  readonly #maxLineChars: number;
  #killTimer: ReturnType<typeof setTimeout> | undefined;
  #exited = false;

  constructor(argv: readonly string[], options: SpawnOptions = {}) {
    if (argv.length === 0) throw new TypeError("Cannot spawn an empty argv");
    this.argv = argv;
    this.#maxLineChars = options.maxLineChars ?? MAX_LINE_CHARS;
    const env = options.clearEnv
      ? { PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin", ...options.env }
      : options.env;
    try {
      this.#child = new Deno.Command(argv[0], {
        args: argv.slice(1),
        cwd: options.cwd,
        env,
        clearEnv: options.clearEnv,
        stdin: options.stdin === undefined ? "null" : "piped",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) {
        throw new ProgramNotFoundError(argv[0], { cause: error });
      }
      throw error;
    }
    this.stdout = this.#child.stdout;
    if (options.stdin !== undefined) void this.#feedStdin(options.stdin);
    this.finished = this.#watch(options);
  }

  /** stdout as lines; a line over the cap raises `LineTooLongError` (and the child is killed). */
  lines(): AsyncGenerator<string> {
    return linesOrStop(this.stdout, this.#maxLineChars, () => this.kill());
  }

  /** SIGTERM now, SIGKILL after the grace period if still running. */
  kill(graceMs = KILL_GRACE_MS): void {
    if (this.#exited) return;
    this.#signal("SIGTERM");
    this.#killTimer ??= setTimeout(() => this.#signal("SIGKILL"), graceMs);
  }

  #signal(signal: Deno.Signal): void {
    if (this.#exited) return;
    try {
      this.#child.kill(signal);
    } catch {
      // Already exited between the check and the kill.
    }
  }

  async #feedStdin(input: Uint8Array | string | ReadableStream<Uint8Array>): Promise<void> {
    const stream = typeof input === "string"
      ? ReadableStream.from([new TextEncoder().encode(input)])
      : input instanceof Uint8Array
      ? ReadableStream.from([input])
      : input;
    try {
      await stream.pipeTo(this.#child.stdin);
    } catch {
      // The child closed its stdin early (BrokenPipe): a normal end, not our error.
    }
  }

  async #watch(options: SpawnOptions): Promise<ProcessOutcome> {
    const started = performance.now();
    const stop = stopOnAbortOrTimeout(options, () => this.kill());

    // A killed child's grandchildren can keep stderr open for as long as they live: after a kill,
    // stderr gets a short grace period and is then cut, so that cancelling never hangs.
    const stopStderr = new AbortController();
    const stderrTail = collectStderr(this.#child.stderr, options, stopStderr.signal);
    try {
      const status = await this.#child.status;
      let grace: ReturnType<typeof setTimeout> | undefined;
      if (stop.timedOut || stop.aborted) {
        grace = setTimeout(() => stopStderr.abort(), STDERR_GRACE_MS);
      }
      const stderr = await stderrTail;
      clearTimeout(grace);
      this.#exited = true;
      return {
        argv: this.argv,
        exitCode: status.signal ? 128 + signalNumber(status.signal) : status.code,
        signal: status.signal,
        durationMs: performance.now() - started,
        timedOut: stop.timedOut,
        aborted: stop.aborted && !stop.timedOut,
        stderrTail: stderr,
      };
    } finally {
      stop.release();
      clearTimeout(this.#killTimer);
    }
  }
}

/**
 * Read a child's stderr to its end (or until `stop`): each chunk and line to the callbacks, and
 * its tail as the result.
 */
export async function collectStderr(
  stream: ReadableStream<Uint8Array>,
  options: Pick<SpawnOptions, "onStderrLine" | "onStderrChunk">,
  stop: AbortSignal,
): Promise<string> {
  let kept = "";
  let partial = "";
  const onLine = options.onStderrLine;
  try {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream(), { signal: stop })) {
      kept = (kept + chunk).slice(-STDERR_TAIL_CHARS);
      options.onStderrChunk?.(chunk);
      if (!onLine) continue;
      partial += chunk;
      let newline: number;
      while ((newline = partial.indexOf("\n")) !== -1) {
        onLine(partial.slice(0, newline).replace(/\r$/, ""));
        partial = partial.slice(newline + 1);
      }
      // stderr is diagnostics, not protocol: an overlong line is passed on in pieces, not fatal.
      if (partial.length > STDERR_TAIL_CHARS) {
        onLine(partial);
        partial = "";
      }
    }
  } catch (error) {
    if (!stop.aborted) throw error;
  }
  if (onLine && partial) onLine(partial);
  return tail(kept);
}

const SIGNAL_NUMBERS: Partial<Record<Deno.Signal, number>> = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGABRT: 6,
  SIGKILL: 9,
  SIGSEGV: 11,
  SIGPIPE: 13,
  SIGALRM: 14,
  SIGTERM: 15,
};

function signalNumber(signal: Deno.Signal): number {
  return SIGNAL_NUMBERS[signal] ?? 0;
}

/** Start a child process. */
export function spawn(argv: readonly string[], options?: SpawnOptions): ChildProcess {
  return new ChildProcess(argv, options);
}

/**
 * Start `argv` in a session of its own, detached from this process, and return at once: work that
 * must happen but that nobody should wait for (removing a run's container after its result). It
 * outlives this process, and a Ctrl-C meant for this process does not reach it. Its output is
 * discarded; nothing reports how it ended.
 */
export function spawnDetached(
  argv: readonly string[],
  options: { env?: Record<string, string> } = {},
): void {
  if (argv.length === 0) throw new TypeError("Cannot run an empty command");
  try {
    const child = new Deno.Command(argv[0], {
      args: argv.slice(1),
      env: options.env,
      stdin: "null",
      stdout: "null",
      stderr: "null",
      detached: true,
    }).spawn();
    child.unref();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new ProgramNotFoundError(argv[0], { cause: error });
    }
    throw error;
  }
}

/** Run a child to completion, collecting stdout and stderr. Never throws on non-zero exit. */
export async function run(argv: readonly string[], options?: SpawnOptions): Promise<RunResult> {
  let stderr = "";
  const child = spawn(argv, {
    ...options,
    onStderrChunk: (text) => {
      stderr += text;
      options?.onStderrChunk?.(text);
    },
  });
  const [stdout, outcome] = await Promise.all([
    new Response(child.stdout).text(),
    child.finished,
  ]);
  return { ...outcome, stdout, stderr };
}

/**
 * The error for an outcome that did not succeed: timeout and abort get their own codes, anything
 * else `code` with the stderr tail.
 */
export function outcomeError(
  outcome: ProcessOutcome,
  code: SandboxErrorCode,
  message: string,
): SandboxError {
  if (outcome.timedOut) {
    return new SandboxError(
      "timeout",
      `${message}: timed out after ${Math.round(outcome.durationMs)} ms`,
    );
  }
  if (outcome.aborted) return new SandboxError("interrupted", `${message}: interrupted`);
  return new CommandExitError(code, `${message}: exit code ${outcome.exitCode}`, outcome);
}

/** Start time of process `pid` (clock ticks since boot), undefined when there is no such process. */
export async function processStartTicks(pid: number): Promise<number | undefined> {
  try {
    const stat = await Deno.readTextFile(`/proc/${pid}/stat`);
    // The command name may hold spaces and parentheses: the fields follow the last ")".
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]);
  } catch {
    return undefined;
  }
}

/**
 * Is process `pid`, started at `startTicks`, still alive? A pid the kernel gave to another process
 * since has another start time; without `startTicks` (an older record) the pid alone decides.
 */
export async function isSameProcessAlive(pid: number, startTicks?: number): Promise<boolean> {
  let stat: string;
  try {
    stat = await Deno.readTextFile(`/proc/${pid}/stat`);
  } catch {
    return false;
  }
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // A zombie has ended: it is only not yet reaped (its parent gone, under an init that does not
  // reap, as in many containers).
  if (fields[0] === "Z" || fields[0] === "X") return false;
  return startTicks === undefined || Number(fields[19]) === startTicks;
}

/** Is a process with this pid alive on this host? (Linux: its /proc entry exists.) */
export async function isProcessAlive(pid: number): Promise<boolean> {
  try {
    await Deno.stat(`/proc/${pid}`);
    return true;
  } catch {
    return false;
  }
}

/**
 * How a child is stopped before its end: `kill` when `signal` aborts (`aborted`) or `timeoutMs`
 * passes (`timedOut`). `release` once it has ended.
 */
export function stopOnAbortOrTimeout(
  options: Pick<SpawnOptions, "signal" | "timeoutMs">,
  kill: () => void,
): { readonly aborted: boolean; readonly timedOut: boolean; release(): void } {
  const stop = { aborted: false, timedOut: false, release };
  const detach = closeOnAbort(options.signal, () => {
    stop.aborted = true;
    kill();
  });
  const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => {
    stop.timedOut = true;
    kill();
  }, options.timeoutMs);
  function release(): void {
    clearTimeout(timer);
    detach();
  }
  return stop;
}

/** Call `close` when `signal` aborts (now, if it already has); returns the detach function. */
export function closeOnAbort(signal: AbortSignal | undefined, close: () => unknown): () => void {
  const onAbort = () => void close();
  if (signal?.aborted) onAbort();
  else signal?.addEventListener("abort", onAbort, { once: true });
  return () => signal?.removeEventListener("abort", onAbort);
}

/**
 * `stdout` as lines of at most `maxChars`; a longer line raises `LineTooLongError` after `stop`
 * ends the producer (a process, an exec), whose further output nobody would read.
 */
export async function* linesOrStop(
  stdout: ReadableStream<Uint8Array>,
  maxChars: number,
  stop: () => void,
): AsyncGenerator<string> {
  const reader = readLines(stdout, maxChars).getReader();
  try {
    while (true) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } catch (error) {
    stop();
    throw error;
  } finally {
    reader.releaseLock();
  }
}
