/**
 * The seam between runs, sessions and the sandboxes they use. Three interfaces, each implemented
 * once per kind of sandbox (Docker: lib/sandbox/docker_lifecycle.ts; mode none: host_provider.ts)
 * and chosen in one place (providers.ts):
 *
 * - `SandboxProvider`: one sandbox's operations (exec, files, status, teardown).
 * - `SandboxLifecycle`: the sandboxes runs use: a virgin one per run (`acquire`), its end
 *   (`RunSandbox.release` / `keep`), the warm pool (`fill`, `ready`) and orphans (`reapOrphans`).
 * - `SandboxRelayTransport`: how the host reaches the relay inside a sandbox (an attached exec
 *   stream always; a socket directory bound in where the sandbox has one).
 *
 * A new kind of sandbox implements these and passes tests/conformance/ (docs/architecture.md,
 * "Adding a provider").
 */
import type { AgentCliName } from "../agents/packages.ts";
import type { RelayProcess } from "../proxy/relay_host.ts";
import type { LocalRepo } from "../repo/local.ts";
import type { WorkerProcess } from "../run/worker_process.ts";
import type { SandboxError } from "../errors.ts";
import type { Profile } from "../config.ts";

export interface ExecOptions {
  /** Working directory inside the sandbox. */
  cwd?: string;
  /** Variables for this command only. Nothing from the host environment is inherited. */
  env?: Record<string, string>;
  /** Bytes or a stream for the command's stdin; without it stdin is empty. */
  stdin?: Uint8Array | string | ReadableStream<Uint8Array>;
  signal?: AbortSignal;
  /** Wall-clock limit; the command's whole process tree is killed when it passes. */
  timeoutMs?: number;
  /** Each stderr line as it arrives. */
  onStderrLine?: (line: string) => void;
  /** The run this command belongs to (Docker: its exec id is then `worker-RUN-…`, for traces). */
  runId?: string;
}

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  durationMs: number;
  timedOut: boolean;
  /** The command (or part of its tree) was killed by the sandbox memory limit. */
  oomKilled: boolean;
}

/** How `execStream` ended, available after the iteration finishes. */
/** What a run's worker is started with: its deadline, its interrupt, where its diagnostics go. */
export interface WorkerOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
  onStderrLine?: (line: string) => void;
}

export interface ExecStreamOutcome {
  exitCode: number;
  durationMs: number;
  timedOut: boolean;
  oomKilled: boolean;
  stderrTail: string;
}

/** A streaming command: iterate stdout lines, then read `outcome`. */
export interface ExecStream extends AsyncIterable<string> {
  /** Resolves once the command has exited (after iteration ends). */
  readonly outcome: Promise<ExecStreamOutcome>;
}

/** A command whose stdout is bytes (a pack, an archive): read `stdout`, then `outcome`. */
export interface ExecBytes {
  readonly stdout: ReadableStream<Uint8Array>;
  /** Resolves once the command has exited; raises like `execStream`'s outcome. */
  readonly outcome: Promise<ExecStreamOutcome>;
  /** Stop the command (and its whole tree) before it ends, e.g. when its output is refused. */
  stop(): Promise<void>;
}

export type SandboxState =
  | "running"
  | "stopped"
  | "missing"
  | "paused"
  | "restarting"
  | "dead"
  | "created";
export type SandboxHealth = "healthy" | "unhealthy" | "starting" | "unknown";

export interface SandboxStatus {
  profile: string;
  /** Container name. */
  name: string;
  id: string;
  image: string;
  state: SandboxState;
  health: SandboxHealth;
  /** ISO 8601. */
  createdAt: string;
  /** When it last started (ISO 8601), or null if it never ran. */
  startedAt: string | null;
  /** When it last stopped (ISO 8601), or null while it runs or if it never stopped. */
  stoppedAt: string | null;
  /** Where work happens inside it (the workspace volume's mount point). */
  workspacePath: string;
  /** The container's config hash matches the profile's current configuration. */
  current: boolean;
  /**
   * "shared" for the profile's long-lived development sandbox (exec, cp; runs never use it),
   * "pool" for a fresh one started ahead for a run, "run" for one a run started itself.
   */
  kind: "shared" | "pool" | "run";
  /** The repository a container serves (`name-hash`), or null for one without. */
  repo: string | null;
}

export interface SandboxStats {
  profile: string;
  name: string;
  memoryBytes: number;
  memoryLimitBytes: number;
  cpuPercent: number;
  pids: number;
  pidsLimit: number;
}

export interface TeardownReport {
  containers: string[];
  networks: string[];
  volumes: string[];
}

export interface EnsureRunningOptions {
  signal?: AbortSignal;
  /**
   * Also replace a container whose image is not the current build of its tag (after
   * `sandbox image build`). Costs one more docker call, so the hot path of a run skips it.
   */
  checkImage?: boolean;
  /**
   * Also check that a running container can still start a command (one `docker exec`), and
   * replace it when it cannot. A container whose health check fails is replaced either way.
   */
  probe?: boolean;
}

export interface SandboxProvider {
  /** Start the sandbox if needed; a no-op when it already runs with the current configuration. */
  ensureRunning(options?: EnsureRunningOptions): Promise<SandboxStatus>;
  /** Stop the sandbox without removing it: its workspace and files stay for `start`. */
  stop(options?: { signal?: AbortSignal }): Promise<SandboxStatus>;
  /** Start a stopped sandbox as it is (`ensureRunning` also creates or replaces one). */
  start(options?: { signal?: AbortSignal }): Promise<SandboxStatus>;
  /** Run a command, yielding stdout lines as they arrive. */
  execStream(argv: readonly string[], options?: ExecOptions): ExecStream;
  /** Run a command, its stdout as a byte stream: nothing is buffered whole. */
  execBytes(argv: readonly string[], options?: ExecOptions): ExecBytes;
  /** Run a command to completion. Non-zero exit is a result, not an error. */
  exec(argv: readonly string[], options?: ExecOptions): Promise<ExecResult>;
  readFile(path: string, options?: { signal?: AbortSignal }): Promise<Uint8Array>;
  /** Write a file owned by the sandbox user; `mode` defaults to 0o600. */
  writeFile(
    path: string,
    data: Uint8Array | string,
    options?: { mode?: number; signal?: AbortSignal },
  ): Promise<void>;
  /** Copy a host file or directory into the sandbox (the copy is owned by the sandbox user). */
  copyIn(hostPath: string, sandboxPath: string, options?: { signal?: AbortSignal }): Promise<void>;
  /** Copy a sandbox file or directory out to the host. */
  copyOut(sandboxPath: string, hostPath: string, options?: { signal?: AbortSignal }): Promise<void>;
  stats(options?: { signal?: AbortSignal }): Promise<SandboxStats>;
  status(options?: { signal?: AbortSignal }): Promise<SandboxStatus>;
  /** True when the sandbox runs and can execute a command. */
  healthCheck(options?: { signal?: AbortSignal }): Promise<boolean>;
  /** Remove the sandbox's container (and with `volumes`, its workspace volume). */
  teardown(options?: { volumes?: boolean; signal?: AbortSignal }): Promise<TeardownReport>;
}

/**
 * A profile's own sandbox, which commands use (`exec`, `cp`, `stop`, `start`, `snapshot`); runs
 * never do. `openProvider` opens it (making it on `ensureRunning`), `namedSandbox` finds it by name.
 */
export interface ProfileSandbox extends SandboxProvider {
  readonly profile: Profile;
  /** Its name, for messages (Docker: the container's). */
  readonly containerName: string;
  /** The last `ensureRunning` found it running as it was (else it started, made or replaced it). */
  readonly wasRunning: boolean;
  /** Enforce `resources.disk` while a command runs: `signal` aborts with the reason. */
  watchDisk(): { readonly signal: AbortSignal; close(): Promise<void> };
  /** End whatever commands left running in it (their wrappers may not have). */
  sweep(): Promise<void>;
}

/** A terminal's size in characters. */
export interface WindowSize {
  rows: number;
  cols: number;
}

/** What a command with a terminal is started with (`RunSandbox.startTerminal`). */
export interface TerminalRequest {
  argv: readonly string[];
  env: Record<string, string>;
  cwd?: string;
  size: WindowSize;
}

/** A running command with a terminal. */
export interface Terminal {
  /** What the terminal shows, as bytes, until the command ends. */
  readonly output: ReadableStream<Uint8Array>;
  /** Type into the terminal. */
  write(bytes: Uint8Array): Promise<void>;
  resize(size: WindowSize): Promise<void>;
  /** The command's exit code, once its output has ended. */
  readonly exitCode: Promise<number>;
  /** Stop attaching (the wrapper then ends the command: it loses its terminal). */
  close(): void;
}

/**
 * How the host reaches the relay (relay/main.ts) inside one sandbox. The relay always runs as a
 * uid of its own, not the sandbox user's, so that nothing the agent runs can ptrace, read or kill it.
 */
export interface SandboxRelayTransport {
  /** The sandbox's name, for messages and exec ids. */
  readonly sandboxName: string;
  /**
   * Start a relay with `relayArgs` (relay_host.ts `relayArgv`'s input) whose stdio carries the
   * mux stream; `runId` names its exec after the run.
   */
  launchRelay(relayArgs: readonly string[], runId?: string | null): RelayProcess;
  /**
   * Start relay `id` detached (a spare relay, lib/proxy/spare_relay.ts) with `env` in its
   * environment only, never on argv. Its handle for liveness checks (the engine's exec id, when
   * there is one), or undefined when it could not be started.
   */
  startDetachedRelay(
    id: string,
    relayArgs: readonly string[],
    env: Record<string, string>,
  ): Promise<{ exec?: string } | undefined>;
  /** Stop relay `id` and its whole process tree. */
  stopRelay(id: string): Promise<void>;
  /**
   * The host directory bound into the sandbox for the proxies' sockets (made when missing), and
   * where the sandbox sees it; undefined when the sandbox has none (the relay then uses the
   * stream). With `confirm`, the sandbox is asked whether it really has the binding.
   */
  socketMount(
    options?: { confirm?: boolean; signal?: AbortSignal },
  ): Promise<{ host: string; sandbox: string } | undefined>;
}

/** The kind of sandbox a run needs (the pool is kept per kind). */
export interface SandboxKind {
  /** The agent CLI whose layer the sandbox has; none for the built-in worker. */
  agent?: AgentCliName;
  /** The repository the sandbox serves (`name-hash`); its object cache is mounted. */
  repo?: { key: string };
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
}

/** What `acquire` is asked for: one run's sandbox. */
export interface SandboxRequest extends SandboxKind {
  /** The run's id: it names a sandbox started for the run alone. */
  runId: string;
  /** Told a sandbox's name once it has one, before it is made (recorded in the run's metadata). */
  onNamed?: (name: string) => Promise<void>;
}

/** A sandbox one run holds alone, from `acquire` until `release` or `keep`. */
export interface RunSandbox {
  readonly provider: SandboxProvider;
  /** Its name (the container's), recorded in the run's metadata. */
  readonly name: string;
  /** It was started ahead and claimed from the pool (else started for this run). */
  readonly fromPool: boolean;
  /** How the session's relay reaches it; undefined for a sandbox that is the host itself. */
  readonly relay: SandboxRelayTransport | undefined;
  /** The worker waiting in it (started ahead), connected, its job not sent; undefined when none. */
  attachWorker(options: WorkerOptions): Promise<WorkerProcess | undefined>;
  /** Enforce `resources.disk` while the run is live: `onAbort` is told when it is passed. */
  watchDisk(options: { onAbort?: (reason: SandboxError) => void }): { close(): Promise<void> };
  /** Add `repo`'s base commit to the object cache the sandbox mounts; the bytes sent. */
  updateCache(repo: LocalRepo, signal?: AbortSignal): Promise<number>;
  /**
   * Start `request.argv` in it with a terminal (a shell, an agent's TUI), as the sandbox user under
   * its exec wrapper; an "unsupported" `SandboxError` where the sandbox has no terminals.
   */
  startTerminal(request: TerminalRequest): Promise<Terminal>;
  /**
   * How it stopped when something from outside ended it under its run (killed, removed), or
   * undefined while it runs or when that cannot be told.
   */
  stoppedFromOutside(): Promise<string | undefined>;
  /** Remove it and everything of it (workspace, host records); returns without waiting for all. */
  release(): Promise<void>;
  /** Keep it, with its work, until the user removes it (`sandbox down`). */
  keep(): Promise<void>;
}

/**
 * The sandboxes of one profile's runs. Invariant: `acquire` never returns a sandbox that anything
 * but our own code has run in — no earlier run, no `sandbox exec` — and `release` leaves nothing
 * of it behind.
 */
export interface SandboxLifecycle {
  /** False for mode none: "sandboxes" are this machine, with no isolation at all. */
  readonly isolated: boolean;
  /** A virgin sandbox for one run: claimed from the pool, else started now. */
  acquire(request: SandboxRequest): Promise<RunSandbox>;
  /**
   * Bring the pool for runs of `kind` up to `sandbox.pool` ready sandboxes; the names started.
   * Without `wait`, a pool another process is filling is left to it.
   */
  fill(kind: SandboxKind & { wait?: boolean }): Promise<string[]>;
  /** The names of the pool's ready sandboxes for runs of `kind`. */
  ready(kind: SandboxKind): Promise<string[]>;
  /** Remove the sandboxes of runs whose process is gone; their names. */
  reapOrphans(): Promise<string[]>;
}

/** The exit code of `readFileArgv` when its path names nothing (EX_NOINPUT of sysexits.h). */
export const NO_SUCH_FILE_EXIT = 66;

/**
 * `cat PATH` for a provider's `readFile`, exiting `NO_SUCH_FILE_EXIT` when PATH names nothing: a
 * missing file is told apart by the exit code, never by the text of cat's message.
 */
export function readFileArgv(path: string): string[] {
  return ["sh", "-c", `[ -e "$1" ] || exit ${NO_SUCH_FILE_EXIT}; exec cat -- "$1"`, "sh", path];
}
