/**
 * `DockerEngine`: the one port through which the sandbox layer acts on Docker, with typed results
 * and typed failures (`EngineError` and its `kind`). Nothing above it reads docker's stderr to
 * decide what happened.
 *
 * Two implementations (`dockerEngine` gives the first, which hands a call to the second where it
 * must):
 * - `ApiEngine` (engine_api.ts): the Engine HTTP API on the engine's Unix socket, when it is the
 *   very engine the `docker` CLI would reach (engine_api.ts says when). Failures come from the
 *   HTTP status (404 not found, 409 conflict / not running) with the engine's own message.
 * - `CliEngine` (here): the `docker` CLI, for every other engine (`DOCKER_HOST=tcp://…`, a context,
 *   a wrapper such as podman's shim). The CLI says why it failed only in prose, so a failure is
 *   classified by asking again in a form with a structured answer: `docker version` (reachable?)
 *   and a listing filtered by name (does the object exist?).
 *
 * What the port does not cover goes through `cli` (a `DockerCli`) on both, because its API form is
 * not built: creating a container (`docker create` with the hardening flags: their translation to
 * the API's HostConfig would be a second, unchecked copy of the security-relevant argv, and it
 * runs once per container, not per command; the start goes through the port), building, pulling
 * and removing images, `stop`/`restart`, `stats`, `logs`, listings by label, networks. Those
 * callers decide on the exit code and structured stdout only; where they need to know why a call
 * failed, they ask the port (does the container exist now?). Execs are made through the API (the
 * CLI only where the API cannot be reached), the outcome's `failure` typed as above.
 */
import { SandboxError, type SandboxErrorCode } from "../errors.ts";
import type { Child, ProcessOutcome, RunResult, SpawnOptions } from "../process.ts";
import { daemonDown, DockerCli } from "./docker.ts";
import { ApiEngine } from "./engine_api.ts";

/** What went wrong, as far as the engine says. */
export type EngineErrorKind =
  /** The named container, volume or exec does not exist. */
  | "not-found"
  /** The image does not exist on this engine. */
  | "image-missing"
  /** An object of that name exists, or the object is being changed by another request. */
  | "conflict"
  /** The container exists but is not running (stopped, paused, restarting). */
  | "not-running"
  /** The engine cannot be reached (down, no permission, wrong DOCKER_HOST). */
  | "engine-unreachable"
  /** An exec was created but its process never started (the wrapper missing, say). */
  | "exec-failed"
  /** Anything else the engine refused; `engineMessage` says what. */
  | "refused";

/** A failure of one engine operation: its kind, the operation and the engine's own message. */
export class EngineError extends Error {
  override name = "EngineError";
  constructor(
    readonly kind: EngineErrorKind,
    readonly operation: string,
    readonly engineMessage: string,
    options?: ErrorOptions,
  ) {
    super(`${operation}: ${engineMessage}`, options);
  }
}

/** Whether `error` is an `EngineError` of one of `kinds`. */
export function isEngineError(error: unknown, ...kinds: EngineErrorKind[]): error is EngineError {
  return error instanceof EngineError && (kinds.length === 0 || kinds.includes(error.kind));
}

/** The fields of a container's inspect this tool reads. */
export interface ContainerInspect {
  Id: string;
  Name: string;
  Created: string;
  Image: string;
  State: {
    Status: string;
    Running: boolean;
    Pid?: number;
    OOMKilled?: boolean;
    Health?: { Status: string };
    StartedAt?: string;
    FinishedAt?: string;
  };
  Config: { Image: string; Labels: Record<string, string> | null };
  HostConfig: { PidsLimit?: number | null; Memory?: number };
  Mounts?: { Type: string; Source: string; Destination: string }[];
}

export interface VolumeInspect {
  Name: string;
  Options?: Record<string, string> | null;
  Labels?: Record<string, string> | null;
}

export interface ImageInspect {
  Id: string;
  Config?: { Labels?: Record<string, string> | null } | null;
}

/** A command to run in a container, as `docker exec` takes it. */
export interface ExecRequest {
  container: string;
  cmd: string[];
  user?: string;
  workdir?: string;
  /** `NAME=VALUE` entries: they travel in the request (API) or by name (CLI), never in argv. */
  env: string[];
  /** Feed `options.stdin` to the command. */
  interactive: boolean;
  /** Started, not attached to: stdout carries the exec's id (API) or nothing (CLI). */
  detach?: boolean;
}

/** How an exec ended; `failure` when the engine, not the command, decided the outcome. */
export interface ExecOutcome extends ProcessOutcome {
  failure?: EngineError;
}

/** A running exec: a `Child` whose outcome says whether the engine refused it. */
export interface ExecChild extends Child {
  readonly finished: Promise<ExecOutcome>;
}

export interface DockerEngine {
  /** The docker CLI, for what the port does not cover (see the module comment). */
  readonly cli: DockerCli;
  inspectContainer(name: string, signal?: AbortSignal): Promise<ContainerInspect>;
  inspectVolume(name: string, signal?: AbortSignal): Promise<VolumeInspect>;
  inspectImage(ref: string, signal?: AbortSignal): Promise<ImageInspect>;
  startContainer(name: string, signal?: AbortSignal): Promise<void>;
  /** Remove a container, running or not (`rm --force`), with its anonymous volumes if asked. */
  removeContainer(
    name: string,
    options?: { volumes?: boolean; signal?: AbortSignal; timeoutMs?: number },
  ): Promise<void>;
  removeVolume(name: string, options?: { signal?: AbortSignal; timeoutMs?: number }): Promise<void>;
  /** Create a volume; `driverOptions` e.g. `{size}` for a kernel quota. */
  createVolume(
    name: string,
    labels: Record<string, string>,
    driverOptions?: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<void>;
  /** Run a command in a container. */
  exec(request: ExecRequest, options?: SpawnOptions): ExecChild;
}

/** `fn()`, or undefined when it fails with one of `kinds` (e.g. an object that is not there). */
export async function unless<T>(
  kinds: EngineErrorKind[],
  fn: () => Promise<T>,
): Promise<T | undefined> {
  try {
    return await fn();
  } catch (error) {
    if (isEngineError(error, ...kinds)) return undefined;
    throw error;
  }
}

/**
 * The engine for `program` (default: `docker` on PATH): the API where it may, else the CLI,
 * decided at each call.
 */
export function dockerEngine(program?: string): DockerEngine {
  const cli = new DockerCli(program);
  return new ApiEngine(cli, new CliEngine(cli));
}

/**
 * `error` for callers: an `EngineError` as a `SandboxError` (absent container: container_not_found;
 * a stopped one: invalid_state;
 * unreachable engine: daemon_down; else `code` with `message` and the engine's message); any other
 * error as it is.
 */
export function sandboxErrorOf(error: unknown, code: SandboxErrorCode, message: string): unknown {
  if (!(error instanceof EngineError)) return error;
  if (error.kind === "engine-unreachable") return daemonDown(error.engineMessage);
  const kindCode: SandboxErrorCode = error.kind === "not-found"
    ? "container_not_found"
    : error.kind === "not-running"
    ? "invalid_state"
    : code;
  return new SandboxError(
    kindCode,
    message ? `${message}: ${error.engineMessage}` : error.engineMessage,
    {
      cause: error,
    },
  );
}

/** What kind of object a failed CLI call was about, for `failureOf`. */
export type ObjectKind = "container" | "volume" | "image";

/**
 * Why a CLI call about `name` failed, asked in a form whose answer is structured: the object
 * absent (a listing filtered by its name does not show it), or refused for another reason (the
 * CLI's first line as the engine's message). An unreachable engine was raised by `cli.run` already
 * (`daemon_down`, found out with `docker version`).
 */
export async function failureOf(
  cli: DockerCli,
  operation: string,
  what: ObjectKind | undefined,
  name: string,
  stderr: string,
): Promise<EngineError> {
  const message = firstLine(stderr) || `${operation} failed`;
  if (what && !await cli.exists(what, name)) {
    return new EngineError(what === "image" ? "image-missing" : "not-found", operation, message);
  }
  return new EngineError("refused", operation, message);
}

function firstLine(text: string): string {
  return text.trim().split("\n").find((line) => line.trim() !== "")?.trim() ?? "";
}

/** The port over the docker CLI (see the module comment). */
export class CliEngine implements DockerEngine {
  constructor(readonly cli: DockerCli) {}

  async #json<T>(
    args: string[],
    what: ObjectKind,
    name: string,
    signal?: AbortSignal,
  ): Promise<T> {
    const result = await this.cli.run(args, { signal });
    if (result.exitCode !== 0) {
      throw await failureOf(this.cli, args.slice(0, 2).join(" "), what, name, result.stderr);
    }
    return JSON.parse(result.stdout) as T;
  }

  async inspectContainer(name: string, signal?: AbortSignal): Promise<ContainerInspect> {
    return (await this.#json<ContainerInspect[]>(
      ["container", "inspect", name],
      "container",
      name,
      signal,
    ))[0];
  }

  async inspectVolume(name: string, signal?: AbortSignal): Promise<VolumeInspect> {
    return (await this.#json<VolumeInspect[]>(["volume", "inspect", name], "volume", name, signal))[
      0
    ];
  }

  async inspectImage(ref: string, signal?: AbortSignal): Promise<ImageInspect> {
    return (await this.#json<ImageInspect[]>(["image", "inspect", ref], "image", ref, signal))[0];
  }

  async #ok(
    args: string[],
    what: ObjectKind | undefined,
    name: string,
    options: { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<RunResult> {
    const result = await this.cli.run(args, options);
    if (result.timedOut) throw new SandboxError("timeout", `docker ${args[0]}: timed out`);
    if (result.aborted) throw new SandboxError("interrupted", `docker ${args[0]}: interrupted`);
    if (result.exitCode !== 0) {
      throw await failureOf(this.cli, args.slice(0, 2).join(" "), what, name, result.stderr);
    }
    return result;
  }

  async startContainer(name: string, signal?: AbortSignal): Promise<void> {
    await this.#ok(["start", name], "container", name, { signal });
  }

  async removeContainer(
    name: string,
    options: { volumes?: boolean; signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<void> {
    const result = await this.#ok(
      ["rm", "--force", ...(options.volumes ? ["--volumes"] : []), name],
      "container",
      name,
      options,
    );
    // `rm --force` of a missing container exits 0 on some versions, printing nothing: the CLI
    // prints the name of what it removed.
    if (result.stdout.trim() === "") throw new EngineError("not-found", "rm", name);
  }

  async removeVolume(
    name: string,
    options: { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<void> {
    // The CLI prints the name of what it removed: nothing printed, nothing was there.
    const result = await this.#ok(["volume", "rm", name], "volume", name, options);
    if (result.stdout.trim() === "") throw new EngineError("not-found", "volume rm", name);
  }

  async createVolume(
    name: string,
    labels: Record<string, string>,
    driverOptions: Record<string, string> = {},
    signal?: AbortSignal,
  ): Promise<void> {
    const args = [
      "volume",
      "create",
      ...Object.entries(labels).flatMap(([k, v]) => ["--label", `${k}=${v}`]),
      ...Object.entries(driverOptions).flatMap(([k, v]) => ["--opt", `${k}=${v}`]),
      name,
    ];
    await this.#ok(args, undefined, name, { signal });
  }

  exec(request: ExecRequest, options: SpawnOptions = {}): ExecChild {
    return this.cli.execChild(request, options);
  }
}
