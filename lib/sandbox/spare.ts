/**
 * The next run's worker, ready before the run: a shared container keeps one worker that has
 * loaded its code and waits, holding no secret, on a Unix socket inside the container
 * (`worker serve --socket`, worker/serve.ts) — a "spare". The run that leases the container
 * attaches to it with one `docker exec` of the connector (scripts/sandbox-attach) and hands it the
 * job; its first event then comes in tens of milliseconds instead of the ~0.4 s a worker takes to
 * load.
 *
 * The connector needs a command of its own in the container: a run that holds the lease runs it
 * on the container's waiting wrapper when it has one (`attachSpareOn`, lib/sandbox/waiting_exec.ts),
 * which it then passes on to the next command or run, as `sandbox exec` does: each warm run then
 * costs the engine one `docker exec` (its lease), not two (~55 ms of the machine's CPU each).
 *
 * A spare is started only by the lease of a run that has ended, after that run's leftovers were
 * killed (scripts/sandbox-exec: `--lease` … `spare`): so it never shares the container with
 * another run's processes, and nothing of one run lives on into the next. When there is none (a
 * new container, or a spare a concurrent run took), the run starts its own worker.
 */
import { SandboxError } from "../errors.ts";
import type { ExecOptions, ExecStream, SandboxProvider } from "./provider.ts";
import type { DockerSandboxProvider } from "./docker_provider.ts";
import { passOnWaitingExec, releaseWaitingExec, type WaitingConnections } from "./waiting_exec.ts";
import { hostInput, type WorkerProcess, workerProcess } from "../run/worker_process.ts";
import { WORKER_COMMAND } from "../run/container_driver.ts";

/** Where the spare listens inside the container (the sandbox's /tmp, a tmpfs). */
export const SPARE_SOCKET = "/tmp/.sandbox-spare.sock";
/** The connector in the image (scripts/sandbox-attach). */
export const SANDBOX_ATTACH = "/usr/local/bin/sandbox-attach";
/** What the connector says on stderr once it reached the spare. */
const CONNECTED = "sandbox-attach: connected";
/** How long a run's end waits for its connector to be over before it lets the wrapper go (see attachSpareOn). */
const HAND_BACK_WITHIN_MS = 5_000;
/** The connector's exit code when there is no spare to connect to. */
const EXIT_NO_SPARE = 75;

/**
 * What a released lease starts as the container's spare: the socket that says it is ready (it
 * listens once its code is loaded and warm), then the command.
 */
export function spareCommand(): string[] {
  return [SPARE_SOCKET, ...WORKER_COMMAND, "serve", "--socket", SPARE_SOCKET];
}

/**
 * Leave a waiting worker in a container that has none (just made by `up`): take its lease and
 * release it at once, asking for the spare — as the end of a run does. Nothing when a run holds
 * the container (it leaves one itself).
 */
export async function readyWorker(provider: Pick<DockerSandboxProvider, "lease">, signal?: AbortSignal): Promise<void> {
  const release = await provider.lease(`up-${crypto.randomUUID()}`, 60, signal).catch(() => undefined);
  await release?.({ spare: spareCommand(), spareAtOnce: true });
}

export interface AttachOptions {
  /** The worker's deadline (the run's timeout). */
  timeoutMs?: number;
  signal?: AbortSignal;
  onStderrLine?: (line: string) => void;
}

/**
 * Attach to the spare waiting in `provider`'s container: the worker, once the connector reached
 * it, or undefined when the container has none (nothing was sent to anyone). The connector runs
 * like any command (under the exec wrapper: killed at the deadline or on a stop; killing it closes
 * the worker's connection, and the worker stops).
 */
export async function attachSpare(provider: Pick<SandboxProvider, "execStream">, options: AttachOptions = {}): Promise<WorkerProcess | undefined> {
  const input = hostInput();
  let connected!: () => void;
  const attached = new Promise<"attached">((resolve) => connected = () => resolve("attached"));
  const stream = provider.execStream([SANDBOX_ATTACH, SPARE_SOCKET], {
    stdin: input.stream,
    signal: options.signal,
    timeoutMs: options.timeoutMs,
    onStderrLine: (line) => line === CONNECTED ? connected() : options.onStderrLine?.(line),
  });
  const lines = stream[Symbol.asyncIterator]();
  // The first line comes only after the job is sent: before that, the stream ends only if the
  // connector found no worker.
  const first = lines.next();
  const which = await Promise.race([attached, first.then(() => "ended" as const, () => "ended" as const)]);
  if (which === "ended") {
    input.close();
    const line = await first;
    if (line.done) {
      const outcome = await stream.outcome;
      if (outcome.exitCode === EXIT_NO_SPARE) return undefined;
      throw new SandboxError("exec_failed", `Cannot reach the worker waiting in the sandbox: the connector exited with code ${outcome.exitCode}`, {
        detail: outcome.stderrTail || undefined,
      });
    }
  }
  const joined: ExecStream = {
    outcome: stream.outcome,
    [Symbol.asyncIterator]: async function* () {
      try {
        for (let next = await first; !next.done; next = await lines.next()) yield next.value;
      } finally {
        await lines.return?.(undefined);
      }
    },
  };
  return workerProcess(joined, input);
}

/**
 * `attachSpare`, the connector run by the container's waiting wrapper (`wrapper`, claimed and
 * connected) instead of a `docker exec`. Only for a run that holds the lease: a waiting wrapper
 * that runs a command counts against every lease (scripts/sandbox-exec), so run before the grant
 * it would make the run's own lease busy. Once the connector is over, the wrapper is passed on to
 * the next command (or ended, when it did not see its command to the end); `passedOn` settles then.
 *
 * The run's lease is released only after that (a wrapper running a command would count against
 * the next lease), so the wait is bounded: a connector not over within `handBackWithinMs` of the
 * run's end (the agent stopped it: it is the sandbox user's, like the agent) is let go, its wrapper
 * ended; the lease's release then kills the worker it serves, and with it the connector.
 */
export async function attachSpareOn(
  provider: Pick<DockerSandboxProvider, "execStreamOn">,
  wrapper: WaitingConnections,
  options: AttachOptions & { handBackWithinMs?: number } = {},
): Promise<{ worker: WorkerProcess | undefined; passedOn: () => Promise<void> }> {
  let connector: ExecStream | undefined;
  const execStream = (argv: readonly string[], execOptions: ExecOptions = {}) => connector = provider.execStreamOn(wrapper, argv, execOptions);
  const handBack = async () => {
    if (wrapper.reported) await passOnWaitingExec(wrapper);
    else await releaseWaitingExec(wrapper);
  };
  let worker: WorkerProcess | undefined;
  try {
    worker = await attachSpare({ execStream }, options);
  } catch (error) {
    await (connector?.outcome.catch(() => {}) ?? Promise.resolve());
    await releaseWaitingExec(wrapper);
    throw error;
  }
  const over: Promise<unknown> = connector?.outcome.catch(() => {}) ?? Promise.resolve();
  let handedBack: Promise<void> | undefined;
  const passedOn = () =>
    handedBack ??= (async () => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = new Promise<void>((resolve) => timer = setTimeout(resolve, options.handBackWithinMs ?? HAND_BACK_WITHIN_MS));
      await Promise.race([over, late]).finally(() => clearTimeout(timer));
      await handBack();
    })();
  return { worker, passedOn };
}
