/**
 * The connector to a worker that waits, loaded, in a pooled container (`worker serve --socket`,
 * worker/serve.ts; lib/sandbox/pool.ts): one `docker exec` of scripts/sandbox-attach joins the
 * host to it, and the host hands it the job. Its first event then comes in tens of milliseconds
 * instead of the ~0.4 s a worker takes to load.
 */
import { SandboxError } from "../errors.ts";
import type { ExecStream, SandboxProvider } from "./provider.ts";
import { hostInput, type WorkerProcess, workerProcess } from "../run/worker_process.ts";

/** The connector in the image (scripts/sandbox-attach). */
export const SANDBOX_ATTACH = "/usr/local/bin/sandbox-attach";
/** What the connector says on stderr once it reached the worker. */
const CONNECTED = "sandbox-attach: connected";
/** The connector's exit code when there is no worker to connect to. */
const EXIT_NO_WORKER = 75;

export interface AttachOptions {
  /** The worker's deadline (the run's timeout). */
  timeoutMs?: number;
  signal?: AbortSignal;
  onStderrLine?: (line: string) => void;
}

/**
 * Attach to the worker listening on `socket` in `provider`'s container: the worker, once the
 * connector reached it, or undefined when nothing listens there (nothing was sent to anyone). The
 * connector runs like any command (under the exec wrapper: killed at the deadline or on a stop;
 * killing it closes the worker's connection, and the worker stops).
 */
export async function attachWorker(
  provider: Pick<SandboxProvider, "execStream">,
  socket: string,
  options: AttachOptions = {},
): Promise<WorkerProcess | undefined> {
  const input = hostInput();
  let connected!: () => void;
  const attached = new Promise<"attached">((resolve) => connected = () => resolve("attached"));
  const stream = provider.execStream([SANDBOX_ATTACH, socket], {
    stdin: input.stream,
    signal: options.signal,
    timeoutMs: options.timeoutMs,
    onStderrLine: (line) => line === CONNECTED ? connected() : options.onStderrLine?.(line),
  });
  const lines = stream[Symbol.asyncIterator]();
  // The first line comes only after the job is sent: before that, the stream ends only if the
  // connector found no worker.
  const first = lines.next();
  const which = await Promise.race([
    attached,
    first.then(() => "ended" as const, () => "ended" as const),
  ]);
  if (which === "ended") {
    input.close();
    const line = await first;
    if (line.done) {
      const outcome = await stream.outcome;
      if (outcome.exitCode === EXIT_NO_WORKER) return undefined;
      throw new SandboxError(
        "exec_failed",
        `Cannot reach the worker waiting in the sandbox: the connector exited with code ${outcome.exitCode}`,
        {
          detail: outcome.stderrTail || undefined,
        },
      );
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
