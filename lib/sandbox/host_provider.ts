/**
 * `HostProvider`: sandbox mode "none". Commands run directly on this machine, with NO isolation:
 * the agent can read and change anything this user can. It exists for the seeds' default mode and
 * for debugging; the CLI labels every such run as unsafe.
 *
 * What it still does: commands get a cleared environment (PATH, HOME, LANG and what the caller
 * passes — the proxy URL and token, never a key), and LLM calls still go through the credential
 * proxy on loopback.
 */
import { fileNotFound, SandboxError } from "../errors.ts";
import { execBytesOf, execStreamOf } from "./exec_stream.ts";
import { run, spawn, type SpawnOptions } from "../process.ts";
import { assertNoSecrets } from "../secret_guard.ts";
import type {
  ExecBytes,
  ExecOptions,
  ExecResult,
  ExecStream,
  RunSandbox,
  SandboxLifecycle,
  SandboxProvider,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
} from "./provider.ts";

function baseEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const name of ["PATH", "HOME", "LANG", "TERM", "TMPDIR"]) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/** A command on the host: a cleared environment plus the caller's variables. */
function spawnOptions(options: ExecOptions, argv: readonly string[]): SpawnOptions {
  assertNoSecrets("the host process (sandbox mode none)", {
    env: options.env,
    envKind: "environment",
    argv,
  });
  return {
    cwd: options.cwd,
    env: { ...baseEnv(), ...options.env },
    clearEnv: true,
    stdin: options.stdin,
    signal: options.signal,
    timeoutMs: options.timeoutMs,
    onStderrLine: options.onStderrLine,
  };
}

export class HostProvider implements SandboxProvider {
  readonly containerName = "host";
  constructor(readonly profile: string) {}

  ensureRunning(): Promise<SandboxStatus> {
    return this.status();
  }

  /** The host cannot be stopped: mode "none" has no sandbox to manage. */
  stop(): Promise<SandboxStatus> {
    return Promise.reject(new SandboxError("usage", 'Sandbox mode "none" has no sandbox to stop'));
  }

  start(): Promise<SandboxStatus> {
    return this.status();
  }

  execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
    const child = spawn(argv, spawnOptions(options, argv));
    return execStreamOf(child, async () => {
      const ended = await child.finished;
      if (ended.timedOut) {
        throw new SandboxError("timeout", `Command timed out after ${options.timeoutMs} ms`);
      }
      if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
      return {
        exitCode: ended.exitCode,
        durationMs: ended.durationMs,
        timedOut: false,
        oomKilled: false,
        stderrTail: ended.stderrTail,
      };
    });
  }

  execBytes(argv: readonly string[], options: ExecOptions = {}): ExecBytes {
    const child = spawn(argv, spawnOptions(options, argv));
    const outcome = child.finished.then((ended) => {
      if (ended.timedOut) {
        throw new SandboxError("timeout", `Command timed out after ${options.timeoutMs} ms`);
      }
      if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
      return {
        exitCode: ended.exitCode,
        durationMs: ended.durationMs,
        timedOut: false,
        oomKilled: false,
        stderrTail: ended.stderrTail,
      };
    });
    return execBytesOf(child, outcome);
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    const result = await run(argv, spawnOptions(options, argv));
    if (result.aborted) throw new SandboxError("interrupted", "Command interrupted");
    return {
      exitCode: result.timedOut ? 124 : result.exitCode,
      stdout: result.stdout,
      stderr: result.stderr,
      durationMs: result.durationMs,
      timedOut: result.timedOut,
      oomKilled: false,
    };
  }

  async readFile(path: string): Promise<Uint8Array> {
    try {
      return await Deno.readFile(path);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) throw fileNotFound(path, "the host (mode none)");
      throw error;
    }
  }

  async writeFile(
    path: string,
    data: Uint8Array | string,
    options: { mode?: number } = {},
  ): Promise<void> {
    assertNoSecrets("the host process (sandbox mode none)", { file: { path, data } });
    await Deno.mkdir(path.replace(/\/[^/]*$/, "") || "/", { recursive: true, mode: 0o700 });
    const mode = options.mode ?? 0o600;
    if (typeof data === "string") await Deno.writeTextFile(path, data, { mode });
    else await Deno.writeFile(path, data, { mode });
  }

  async copyIn(hostPath: string, sandboxPath: string): Promise<void> {
    await this.#copy(hostPath, sandboxPath);
  }

  async copyOut(sandboxPath: string, hostPath: string): Promise<void> {
    // Asked first, so that a missing source is told by its error type, not by cp's message.
    await Deno.lstat(sandboxPath).catch((error: unknown) => {
      if (error instanceof Deno.errors.NotFound) {
        throw fileNotFound(sandboxPath, "the host (mode none)");
      }
      throw error;
    });
    await this.#copy(sandboxPath, hostPath);
  }

  async #copy(from: string, to: string): Promise<void> {
    const result = await run(["cp", "-R", "--", from, to]);
    if (result.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot copy "${from}" to "${to}": ${result.stderr.trim()}`,
      );
    }
  }

  stats(): Promise<SandboxStats> {
    return Promise.resolve({
      profile: this.profile,
      name: "host",
      memoryBytes: 0,
      memoryLimitBytes: 0,
      cpuPercent: 0,
      pids: 0,
      pidsLimit: 0,
    });
  }

  status(): Promise<SandboxStatus> {
    return Promise.resolve({
      profile: this.profile,
      name: "host",
      id: "",
      image: "",
      state: "running",
      health: "unknown",
      createdAt: "",
      startedAt: null,
      stoppedAt: null,
      workspacePath: Deno.cwd(),
      current: true,
      kind: "run",
      repo: null,
    });
  }

  healthCheck(): Promise<boolean> {
    return Promise.resolve(true);
  }

  teardown(): Promise<TeardownReport> {
    return Promise.resolve({ containers: [], networks: [], volumes: [] });
  }
}

/**
 * Mode none's lifecycle: every run "acquires" this machine itself. It is NOT isolated (`isolated`
 * is false, and runs say so): nothing separates one run from the next or from the user's files,
 * there is no pool to fill and nothing to reap, release or keep.
 */
export class HostLifecycle implements SandboxLifecycle {
  readonly isolated = false;
  constructor(readonly profile: string) {}

  acquire(): Promise<RunSandbox> {
    return Promise.resolve({
      provider: new HostProvider(this.profile),
      name: "host",
      fromPool: false,
      relay: undefined,
      attachWorker: () => Promise.resolve(undefined),
      watchDisk: () => ({ close: () => Promise.resolve() }),
      updateCache: () =>
        Promise.reject(
          new SandboxError("unsupported", 'Sandbox mode "none" has no object cache to update'),
        ),
      startTerminal: () =>
        Promise.reject(
          new SandboxError(
            "unsupported",
            'Sandbox mode "none" has no terminals: a shell needs mode "container"',
          ),
        ),
      stoppedFromOutside: () => Promise.resolve(undefined),
      release: () => Promise.resolve(),
      keep: () => Promise.resolve(),
    });
  }

  fill(): Promise<string[]> {
    return Promise.resolve([]);
  }

  ready(): Promise<string[]> {
    return Promise.resolve([]);
  }

  reapOrphans(): Promise<string[]> {
    return Promise.resolve([]);
  }
}
