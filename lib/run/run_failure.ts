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
import { DockerCli } from "../sandbox/docker.ts";

export const INTERRUPTED = "The run was interrupted";

/** The errors that say the run's container stopped under it (made by stoppedContainer). */
const STOPPED = new WeakSet<SandboxError>();

/** Whether `failure` (from runFailure) is the run's container stopped or removed from outside. */
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
]);

export async function runFailure(
  error: unknown,
  context: {
    /** The user's interrupt. */
    interrupt?: AbortSignal;
    /** Aborted, with the reason, when the run passed a watched limit. */
    limits: AbortSignal;
    /** The run's container, once it had one. */
    container?: string;
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
  if (!context.container || !CONTAINER_SYMPTOMS.has(failure.code)) return failure;
  return await stoppedContainer(context.container, failure) ?? failure;
}

/** How many times, `STOP_SETTLE_STEP_MS` apart, a container that still runs is asked again. */
const STOP_SETTLE_ASKS = 15;
const STOP_SETTLE_STEP_MS = 200;

interface ContainerState {
  Running?: boolean;
  Status?: string;
  ExitCode?: number;
  OOMKilled?: boolean;
}

/** What the engine says of `container`'s state; undefined when it cannot say. */
async function containerState(container: string): Promise<ContainerState | "removed" | undefined> {
  const inspected = await new DockerCli().run(
    ["container", "inspect", "--format", "{{json .State}}", container],
    { timeoutMs: 30_000 },
  ).catch(() => undefined);
  if (!inspected) return undefined;
  return inspected.exitCode !== 0 ? "removed" : JSON.parse(inspected.stdout) as ContainerState;
}

/** The error for `container` stopped under the run, or undefined when it still runs. */
async function stoppedContainer(
  container: string,
  symptom: SandboxError,
): Promise<SandboxError | undefined> {
  let how: string | undefined;
  // A killed container's processes die before the engine marks it exited (a moment later, more
  // under load): one that still reads as running is asked again, for a bounded while.
  for (let ask = 0; how === undefined; ask++) {
    if (ask > 0) await new Promise((resolve) => setTimeout(resolve, STOP_SETTLE_STEP_MS));
    const state = await containerState(container);
    if (state === undefined) return undefined; // the engine cannot say: what noticed it stands
    if (state === "removed") how = "it was removed";
    else if (!state.Running) {
      how = `it is ${state.Status ?? "stopped"} (exit code ${state.ExitCode ?? "unknown"}${
        state.OOMKilled ? ", killed for memory" : ""
      })`;
    } else if (ask === STOP_SETTLE_ASKS) return undefined;
  }
  const stopped = new SandboxError(
    "docker_failed",
    `The run's sandbox "${container}" stopped during the run: ${how}`,
    {
      cause: symptom,
      detail:
        `Killed or removed from outside the run (docker kill, docker rm, an engine restart); what noticed it: ${symptom.message}`,
    },
  );
  STOPPED.add(stopped);
  return stopped;
}
