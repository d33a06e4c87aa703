/**
 * The `docker` CLI as a function, with its failures mapped to typed errors.
 *
 * Docker is reached the way the user's own `docker` commands reach it, so that `DOCKER_HOST` and
 * docker contexts work as they do for them: through the CLI, except for the calls on every run's
 * path (`exec`, and inspecting a container, volume or image), which go straight to the engine's
 * socket when it is the very engine the CLI would reach (engine_api.ts says when): the same
 * request, without starting the CLI each time.
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
import {
  EngineExec,
  engineSocket,
  execRequestOf,
  inspectRequestOf,
  inspectViaEngine,
} from "./engine_api.ts";

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

const DAEMON_DOWN = [
  "Cannot connect to the Docker daemon",
  "Is the docker daemon running",
  "error during connect",
  "permission denied while trying to connect to the Docker daemon",
];

/** The docker CLI, at a path (tests put a fake first on PATH or pass its path). */
export class DockerCli {
  constructor(readonly program = "docker") {}

  /** Run `docker ARGS`; non-zero exit is returned, daemon/CLI absence is thrown. */
  async run(args: readonly string[], options?: SpawnOptions): Promise<RunResult> {
    const result = await this.#guard(() => this.#run(args, options));
    throwIfUnreachable(result.stderr);
    return result;
  }

  async #run(args: readonly string[], options?: SpawnOptions): Promise<RunResult> {
    const socket = this.#engine(options);
    const inspect = socket ? inspectRequestOf(args) : undefined;
    if (socket && inspect) {
      const answered = await inspectViaEngine(socket, [this.program, ...args], inspect, options);
      if (answered) return answered;
    } else if (socket && execRequestOf(args, options?.env)) {
      // As process.run(), with the exec made through the engine.
      let stderr = "";
      const child = this.spawn(args, {
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
    return await run([this.program, ...args], options);
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
        isNoSuchObject(result.stderr) ? "container_not_found" : code,
        `${message}: ${firstLine(result.stderr) || `docker exited with ${result.exitCode}`}`,
        result,
      );
    }
    return result.stdout;
  }

  /** Start `docker ARGS` streaming; spawn failure is mapped like `run`. */
  spawn(args: readonly string[], options: SpawnOptions = {}): Child {
    const socket = this.#engine(options);
    const request = socket ? execRequestOf(args, options.env) : undefined;
    if (socket && request) {
      return new EngineExec(
        socket,
        [this.program, ...args],
        request,
        options,
        () => this.#spawnCli(args, options),
      );
    }
    return this.#spawnCli(args, options);
  }

  #spawnCli(args: readonly string[], options?: SpawnOptions): Child {
    try {
      return spawn([this.program, ...args], options);
    } catch (error) {
      throw mapSpawnError(error, this.program);
    }
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

/** Throw `daemon_down` when docker's stderr says it could not reach an engine. */
export function throwIfUnreachable(stderr: string): void {
  if (DAEMON_DOWN.some((needle) => stderr.includes(needle))) {
    throw new SandboxError("daemon_down", "Cannot reach the Docker engine", {
      detail: `${firstLine(stderr)}\n${
        provisionHint() ??
          "Start it (e.g. sudo dockerd, or systemctl start docker) or set DOCKER_HOST"
      }`,
    });
  }
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

/** docker's way of saying the named object does not exist. */
export function isNoSuchObject(stderr: string): boolean {
  return /No such (container|object|image|network|volume)/i.test(stderr);
}

/** docker's way of saying an object with that name exists (a concurrent creator won). */
export function isAlreadyExists(stderr: string): boolean {
  return /already in use|already exists|Conflict/i.test(stderr);
}

function firstLine(text: string): string {
  return text.trim().split("\n").find((l) => l.trim() !== "")?.replace(
    /^Error response from daemon:\s*/,
    "",
  ) ??
    "";
}

/** Labels as `--label k=v` pairs. */
export function labelArgs(labels: Record<string, string>): string[] {
  return Object.entries(labels).flatMap(([k, v]) => ["--label", `${k}=${v}`]);
}
