/**
 * The `docker` CLI as a function: what the `DockerEngine` port (engine.ts) does not cover, and the
 * port itself on an engine the API cannot reach directly.
 *
 * Docker is reached the way the user's own `docker` commands reach it, so that `DOCKER_HOST` and
 * docker contexts work as they do for them. An `exec` goes straight to the engine's socket when it
 * is the very engine the CLI would reach (engine_api.ts says when): the same request, without
 * starting the CLI each time. The CLI's stderr is never read to decide anything: a failure is
 * classified by asking again in a form with a structured answer (`reachable`, `exists`).
 */
import { CommandExitError, SandboxError, type SandboxErrorCode } from "../errors.ts";
import {
  type Child,
  ProgramNotFoundError,
  run,
  type RunResult,
  spawn,
  type SpawnOptions,
} from "../process.ts";
import { EngineExec, engineRequest, engineSocket, execRequestOf } from "./engine_api.ts";
import { EngineError, type ExecChild, type ExecOutcome, type ExecRequest } from "./engine.ts";

/** Label keys on every object this tool creates. Teardown selects by `OWNER`, nothing else. */
export const LABEL = {
  owner: "dev.sandbox.owner",
  profile: "dev.sandbox.profile",
  kind: "dev.sandbox.kind",
  configHash: "dev.sandbox.config-hash",
  contentHash: "dev.sandbox.content-hash",
  /** The repository a container and its workspace serve (`name-hash`), absent for runs without one. */
  repo: "dev.sandbox.repo",
} as const;
export const OWNER = "sandbox";
export const OWNER_FILTER = `label=${LABEL.owner}=${OWNER}`;

/** A CLI call's result; for an `exec`, `failure` when the engine, not the command, failed. */
export type DockerResult = RunResult & { failure?: EngineError };

/** The docker CLI, at a path (tests put a fake first on PATH or pass its path). */
export class DockerCli {
  constructor(readonly program = "docker") {}

  /**
   * Run `docker ARGS`; a non-zero exit is returned, an absent CLI or an engine it cannot reach
   * (asked again with `docker version` after a failure: the CLI says why only in prose) is thrown.
   * An `exec` goes through the engine's API where it may (`execChild`).
   */
  async run(args: readonly string[], options?: SpawnOptions): Promise<DockerResult> {
    const result = await this.#guard(() => this.#run(args, options));
    if (result.exitCode !== 0 && !result.timedOut && !result.aborted) {
      const failure = result.failure;
      if (failure ? failure.kind === "engine-unreachable" : !await this.reachable()) {
        throw daemonDown(result.stderr);
      }
    }
    return result;
  }

  async #run(args: readonly string[], options?: SpawnOptions): Promise<DockerResult> {
    const request = execRequestOf(args, options?.env);
    if (!request) return await run([this.program, ...args], options);
    // As process.run(), with the exec made through the engine.
    let stderr = "";
    const child = this.execChild(request, {
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

  /** Run `docker ARGS` and require success; the error carries `code` and the stderr tail. */
  async ok(
    args: readonly string[],
    code: SandboxErrorCode,
    message: string,
    options?: SpawnOptions,
  ): Promise<string> {
    const result = await this.run(args, options);
    if (result.timedOut) throw new SandboxError("timeout", `${message}: timed out`);
    if (result.aborted) throw new SandboxError("interrupted", `${message}: interrupted`);
    if (result.exitCode !== 0) {
      throw new CommandExitError(
        code,
        `${message}: ${firstLine(result.stderr) || `docker exited with ${result.exitCode}`}`,
        result,
      );
    }
    return result.stdout;
  }

  /** Start `docker ARGS` streaming (an `exec` through the engine's API where it may). */
  spawn(args: readonly string[], options: SpawnOptions = {}): ExecChild {
    const request = execRequestOf(args, options.env);
    if (request) return this.execChild(request, options);
    return this.#spawnCli(args, options);
  }

  /**
   * A command run in a container: through the engine's API where it may, else `docker exec`, whose
   * failure is then told from the command's own exit code by asking the engine about the container
   * (gone, stopped: the outcome's `failure`).
   */
  execChild(request: ExecRequest, options: SpawnOptions = {}): ExecChild {
    const socket = this.#engine(options);
    const cli = () => this.#execCli(request, options);
    if (!socket) return cli();
    return new EngineExec(
      socket,
      [this.program, "exec", request.container, ...request.cmd],
      request,
      options,
      cli,
    );
  }

  #execCli(request: ExecRequest, options: SpawnOptions): ExecChild {
    const names = request.env.map((entry) => entry.slice(0, entry.indexOf("=")));
    const values = Object.fromEntries(
      request.env.map((entry) => [
        entry.slice(0, entry.indexOf("=")),
        entry.slice(
          entry.indexOf("=") + 1,
        ),
      ]),
    );
    const child = this.#spawnCli([
      "exec",
      ...(request.detach ? ["--detach"] : []),
      ...(request.interactive ? ["--interactive"] : []),
      ...(request.user ? ["--user", request.user] : []),
      ...(request.workdir ? ["--workdir", request.workdir] : []),
      // By name: the values go in the CLI's environment, off its command line.
      ...names.flatMap((name) => ["--env", name]),
      request.container,
      ...request.cmd,
    ], { ...options, env: { ...options.env, ...values } });
    if (request.detach) return child;
    const finished = child.finished.then(async (outcome): Promise<ExecOutcome> => {
      if (outcome.exitCode === 0 || outcome.timedOut || outcome.aborted) return outcome;
      const failure = await this.#containerFailure(request.container);
      return failure ? { ...outcome, failure } : outcome;
    });
    return {
      argv: child.argv,
      stdout: child.stdout,
      finished,
      lines: () => child.lines(),
      kill: (graceMs) => child.kill(graceMs),
    };
  }

  /** Why an exec in `container` failed, if not for its command's own reasons. */
  async #containerFailure(container: string): Promise<EngineError | undefined> {
    const state = await this.run(
      ["container", "inspect", "--format", "{{.State.Running}}", container],
    ).catch((error) => error as Error);
    if (state instanceof Error) {
      if (!(state instanceof SandboxError) || state.code !== "daemon_down") throw state;
      return new EngineError("engine-unreachable", "exec", state.message);
    }
    if (state.exitCode === 0) {
      return state.stdout.trim() === "true"
        ? undefined
        : new EngineError("not-running", "exec", `Container ${container} is not running`);
    }
    return (await this.exists("container", container))
      ? undefined
      : new EngineError("not-found", "exec", `No such container: ${container}`);
  }

  /**
   * Whether an engine answers: the API's `/_ping` on its socket, else `docker version` (whose
   * server part fails when the CLI reaches no engine).
   */
  async reachable(): Promise<boolean> {
    const socket = this.#engine();
    if (socket) {
      try {
        return (await engineRequest(socket, "GET", "/_ping")).status === 200;
      } catch {
        // The socket refused: the CLI below says whether another way reaches an engine.
      }
    }
    const version = await this.#guard(() =>
      run([this.program, "version", "--format", "{{.Server.Version}}"], { timeoutMs: 30_000 })
    );
    return version.exitCode === 0;
  }

  /** Whether a `kind` object named `name` exists, from a listing filtered by its name. */
  async exists(kind: "container" | "volume" | "image", name: string): Promise<boolean> {
    const args = kind === "container"
      ? ["ps", "--all", "--no-trunc", "--filter", `name=${name}`, "--format", "{{.ID}} {{.Names}}"]
      : kind === "volume"
      ? ["volume", "ls", "--filter", `name=${name}`, "--format", "{{.Name}}"]
      : ["image", "ls", "--no-trunc", "--filter", `reference=${name}`, "--format", "{{.ID}}"];
    const listed = await this.#guard(() => run([this.program, ...args], { timeoutMs: 30_000 }));
    // A listing that fails says nothing of the object: taken as there (the failure stands as is).
    if (listed.exitCode !== 0) return true;
    const words = listed.stdout.split(/\s+/).filter(Boolean);
    if (kind === "image") return words.length > 0 || name.startsWith("sha256:");
    return words.some((word) =>
      word === name ||
      (kind === "container" && /^[0-9a-f]{64}$/.test(word) && word.startsWith(name))
    );
  }

  #spawnCli(args: readonly string[], options?: SpawnOptions): Child {
    try {
      return spawn([this.program, ...args], options);
    } catch (error) {
      throw mapSpawnError(error, this.program);
    }
  }

  /** The engine's socket when calls go there (see `#engine`), for the port (engine.ts). */
  engineSocket(): string | undefined {
    return this.#engine();
  }

  /**
   * The engine's socket when this call may go there: the CLI is the one on PATH (not a program
   * a caller named), and the call changes nothing the CLI reads from its own environment.
   */
  #engine(options?: SpawnOptions): string | undefined {
    if (this.program !== "docker" || options?.clearEnv || options?.cwd) return undefined;
    if (Object.keys(options?.env ?? {}).some((name) => /^DOCKER_/i.test(name))) return undefined;
    return engineSocket();
  }

  async #guard<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (error) {
      throw mapSpawnError(error, this.program);
    }
  }
}

function mapSpawnError(error: unknown, program: string): unknown {
  if (error instanceof ProgramNotFoundError) {
    return new SandboxError("docker_missing", `Cannot find the docker CLI ("${program}")`, {
      cause: error,
      detail: provisionHint() ??
        "Install Docker (on Debian: apt-get install docker.io) or put docker on PATH",
    });
  }
  return error;
}

/** `daemon_down`, with what the CLI said and how to start an engine. */
export function daemonDown(stderr: string): SandboxError {
  return new SandboxError("daemon_down", "Cannot reach the Docker engine", {
    detail: `${firstLine(stderr)}\n${
      provisionHint() ??
        "Start it (e.g. sudo dockerd, or systemctl start docker) or set DOCKER_HOST"
    }`,
  });
}

/**
 * Run from a checkout (`./sandbox`), the provisioning script installs and starts what is missing;
 * the launcher checks only what costs nothing, so the fix for an engine that is down is named here.
 */
function provisionHint(): string | undefined {
  const script = Deno.env.get("SANDBOX_PROVISION");
  return script
    ? `Install or start it with: bash ${script} (or set DOCKER_HOST to another engine)`
    : undefined;
}

function firstLine(text: string): string {
  return text.trim().split("\n").find((l) => l.trim() !== "")?.trim() ?? "";
}

/** Labels as `--label k=v` pairs. */
export function labelArgs(labels: Record<string, string>): string[] {
  return Object.entries(labels).flatMap(([k, v]) => ["--label", `${k}=${v}`]);
}
