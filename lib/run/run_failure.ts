/**
 * What a failed run failed of: the one error its closing record, its metadata, its stderr line and
 * its exit code all say. What happened first decides, not whichever step noticed:
 * 1. the user's interrupt (Ctrl-C, SIGTERM): whatever it cut short (an engine call killed mid-way,
 *    a branch import whose `git` was stopped) is an interrupt, as the process exits 130;
 * 2. the run's container stopped from outside (`docker kill`, `docker rm`, the engine): named so,
 *    rather than as what noticed it (the disk watch, whose log ends with the container; the worker);
 * 3. a limit watched while the run is live (`resources.disk`): its own error;
 * 4. anything else: the error, as a `SandboxError`.
 */
import { SandboxError } from "../errors.ts";
import type { RunSandbox } from "../sandbox/provider.ts";

/** What a failure needs of the run's sandbox: its name, and whether it was stopped from outside. */
export type RunFailureSandbox = Pick<RunSandbox, "name" | "stoppedFromOutside">;

export const INTERRUPTED = "The run was interrupted";

/** The errors that say the run's sandbox stopped under it (made by stoppedSandbox). */
const STOPPED = new WeakSet<SandboxError>();

/** Whether `failure` (from runFailure) is the run's sandbox stopped or removed from outside. */
export function isContainerStopped(failure: SandboxError): boolean {
  return STOPPED.has(failure);
}

/** Codes that a stopped container produces in whatever was talking to it. */
const CONTAINER_SYMPTOMS = new Set([
  "disk_limit",
  "docker_failed",
  "exec_failed",
  "worker_failed",
  "container_not_found",
  "invalid_state",
]);

export async function runFailure(
  error: unknown,
  context: {
    /** The user's interrupt. */
    interrupt?: AbortSignal;
    /** Aborted, with the reason, when the run passed a watched limit. */
    limits: AbortSignal;
    /** The run's sandbox, once it had one. */
    sandbox?: RunFailureSandbox;
  },
): Promise<SandboxError> {
  if (context.interrupt?.aborted) {
    return error instanceof SandboxError && error.message === INTERRUPTED
      ? error
      : new SandboxError("interrupted", INTERRUPTED, { cause: error });
  }
  const failure = context.limits.aborted
    ? context.limits.reason as SandboxError
    : !(error instanceof SandboxError)
    ? new SandboxError("worker_failed", (error as Error)?.message ?? String(error), {
      cause: error,
    })
    : error.code === "interrupted" && error.message !== INTERRUPTED
    ? new SandboxError("interrupted", INTERRUPTED, { cause: error })
    : error;
  if (!context.sandbox || !CONTAINER_SYMPTOMS.has(failure.code)) return failure;
  return await stoppedSandbox(context.sandbox, failure) ?? failure;
}

/** The error for `sandbox` stopped under the run, or undefined when it still runs. */
async function stoppedSandbox(
  sandbox: RunFailureSandbox,
  symptom: SandboxError,
): Promise<SandboxError | undefined> {
  const how = await sandbox.stoppedFromOutside();
  if (how === undefined) return undefined;
  const stopped = new SandboxError(
    "docker_failed",
    `The run's sandbox "${sandbox.name}" stopped during the run: ${how}`,
    {
      cause: symptom,
      detail:
        `Killed or removed from outside the run (docker kill, docker rm, an engine restart); what noticed it: ${symptom.message}`,
    },
  );
  STOPPED.add(stopped);
  return stopped;
}
