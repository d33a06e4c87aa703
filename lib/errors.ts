/**
 * The typed error tree. Callers branch on `code`, never on `message`.
 *
 * `cli.ts` maps codes to exit codes (see `exitCodeFor`); `lib/` only throws.
 */

/** Every reason the engine can fail, as a closed union callers can switch on. */
export type SandboxErrorCode =
  /** Bad command-line usage. */
  | "usage"
  /** The configuration file is missing, unreadable or invalid. */
  | "config_invalid"
  /** The `docker` CLI is not installed or not on PATH. */
  | "docker_missing"
  /** The `docker` CLI is present but cannot reach an engine. */
  | "daemon_down"
  /** Building the sandbox image (or its local base) failed. */
  | "image_build_failed"
  /** The sandbox container does not exist. */
  | "container_not_found"
  /** A file or directory named in the sandbox (read, copied out) does not exist. */
  | "file_not_found"
  /** The sandbox exists but is in the wrong state for the operation (exec on a stopped one). */
  | "invalid_state"
  /** `docker exec` itself failed, or the command inside could not be started. */
  | "exec_failed"
  /** Any other failed docker operation (run, network, volume, inspect). */
  | "docker_failed"
  /** The Kubernetes API server is unreachable, refused a request, or a pod cannot run. */
  | "cluster_failed"
  /** An operation ran past its deadline. */
  | "timeout"
  /** An operation was cancelled by its AbortSignal (Ctrl-C, SIGTERM). */
  | "interrupted"
  /** A command inside the sandbox was killed for exceeding the memory limit. */
  | "out_of_memory"
  /** The sandbox's workspace grew past `resources.disk` (or its size could not be watched). */
  | "disk_limit"
  /** A requested sandbox mode is not implemented by this build. */
  | "unsupported"
  /** The agent worker broke its contract: bad output, no result, a result not matching the schema. */
  | "worker_failed"
  /** The run store (the state directory) could not be written, or holds a torn record: a full or failing disk. */
  | "store_failed"
  /** `sandbox doctor` found a defence that should hold broken. */
  | "defence_broken"
  /** A run passed one of its budgets (tokens, cost, requests, egress), or its profile's budget for the period is used up. */
  | "budget_exceeded";

export interface SandboxErrorOptions extends ErrorOptions {
  /** Extra lines for a human: a hint on how to fix it, a log tail. */
  detail?: string;
}

/** Base of all errors the engine raises on purpose. */
export class SandboxError extends Error {
  override name = "SandboxError";
  readonly code: SandboxErrorCode;
  readonly detail?: string;

  constructor(code: SandboxErrorCode, message: string, options?: SandboxErrorOptions) {
    super(message, options);
    this.code = code;
    this.detail = options?.detail;
  }
}

/** A process exited non-zero. Carries what is needed to explain why. */
export class CommandExitError extends SandboxError {
  override name = "CommandExitError";
  readonly argv: readonly string[];
  readonly exitCode: number;
  readonly stderrTail: string;

  constructor(
    code: SandboxErrorCode,
    message: string,
    init: { argv: readonly string[]; exitCode: number; stderrTail: string },
    options?: SandboxErrorOptions,
  ) {
    super(code, message, { detail: init.stderrTail || undefined, ...options });
    this.argv = init.argv;
    this.exitCode = init.exitCode;
    this.stderrTail = init.stderrTail;
  }
}

/**
 * A sandbox passed a resource limit: `out_of_memory` or `disk_limit`, with the limit and the use
 * that passed it, in bytes, for callers to read without parsing the message (which names both).
 */
export class ResourceLimitError extends SandboxError {
  override name = "ResourceLimitError";
  readonly resource: "memory" | "disk";
  /** The limit, in bytes. */
  readonly limit: number;
  /** The use that passed it, in bytes. */
  readonly actual: number;

  constructor(
    init: { resource: "memory" | "disk"; limit: number; actual: number },
    message: string,
    options?: SandboxErrorOptions,
  ) {
    super(init.resource === "memory" ? "out_of_memory" : "disk_limit", message, options);
    this.resource = init.resource;
    this.limit = init.limit;
    this.actual = init.actual;
  }
}

/** The sandbox has no file or directory at `path`. */
export function fileNotFound(path: string, where: string): SandboxError {
  return new SandboxError("file_not_found", `No file "${path}" in ${where}`);
}

/** One problem found in a configuration file, with the path to the offending value. */
export interface ConfigIssue {
  path: string;
  message: string;
}

/** The configuration is invalid; `issues` lists every problem found, not just the first. */
export class ConfigError extends SandboxError {
  override name = "ConfigError";
  readonly file: string | undefined;
  readonly issues: readonly ConfigIssue[];

  constructor(file: string | undefined, issues: readonly ConfigIssue[]) {
    const where = file ? `"${file}"` : "the built-in defaults";
    super("config_invalid", `Invalid configuration in ${where}`, {
      detail: issues.map((i) => (i.path ? `${i.path}: ${i.message}` : i.message)).join("\n"),
    });
    this.file = file;
    this.issues = issues;
  }
}

/** Exit codes, in the conventions of `docker run` and `timeout(1)`. */
export const EXIT = {
  ok: 0,
  failure: 1,
  usage: 2,
  timeout: 124,
  infrastructure: 125,
  interrupted: 130,
  /** The run's record could not be written in full (EX_IOERR of sysexits.h). */
  storeFailed: 74,
  /** `sandbox doctor`: a defence that should hold is broken. */
  defenceBroken: 3,
  /** A run passed a budget, or would start over its profile's budget for the period. */
  budget: 4,
} as const;

/** The process exit code for an error that reached the CLI. */
export function exitCodeFor(error: unknown): number {
  if (!(error instanceof SandboxError)) return EXIT.failure;
  switch (error.code) {
    case "usage":
    case "config_invalid":
    case "file_not_found":
      return EXIT.usage;
    case "timeout":
      return EXIT.timeout;
    case "interrupted":
      return EXIT.interrupted;
    case "out_of_memory":
      return 137;
    case "store_failed":
      return EXIT.storeFailed;
    case "defence_broken":
      return EXIT.defenceBroken;
    case "budget_exceeded":
      return EXIT.budget;
    default:
      return EXIT.infrastructure;
  }
}

/** Text of the last `maxLines` lines of `text`, for error messages. */
export function tail(text: string, maxLines = 20): string {
  const lines = text.trimEnd().split("\n");
  return lines.slice(-maxLines).join("\n");
}
