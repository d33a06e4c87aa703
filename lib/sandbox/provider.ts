/**
 * The `SandboxProvider` interface: what the engine needs from any isolation backend.
 * Docker is the first implementation; devcontainer, host (`none`) and remote engines are more.
 */

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
