/**
 * The worker that waits, loaded, in a pooled container (`worker serve --await-job`, worker/serve.ts;
 * lib/sandbox/pool.ts), and how the run that claims the container hands it its job.
 *
 * The worker waits for `job.sock` in a directory of the container's socket directory, which the
 * host bind-mounts read-only (proxy_mount.ts): nothing in the sandbox can make that socket, only
 * the host. The claiming run makes it, and the first connection is the worker's: a pooled container
 * has run nothing but our own programs (the worker, the relay, the exec wrapper) before its run's
 * job, so nothing else is there to connect first. The listener then closes (one job per worker).
 * The job goes on that connection, and the worker's framed lines come back on it: `o` an event,
 * `e` a diagnostic line, `x` its exit code. No `docker exec` stands between the run and its first
 * event.
 *
 * Closing the connection is the host's leaving: the worker stops, and its exec wrapper ends the
 * worker's whole process tree. At a deadline or an interrupt the tree is also killed by its exec id
 * (a worker the agent stopped with SIGSTOP reads nothing), as for any command.
 */
import { SandboxError } from "../errors.ts";
import { readLines } from "../lines.ts";
import { JOB_SOCKET, WARM_SOCKET } from "../../worker/serve.ts";
import { hostInput, type WorkerProcess, workerProcess } from "../run/worker_process.ts";
import type { ExecStream, ExecStreamOutcome } from "./provider.ts";

/** The pooled worker's directory in the container's socket directory. */
export const POOL_WORKER_DIR = "worker";
/** The pooled worker's exec id (one per container): how its tree is killed, and its OOM read. */
export const POOL_WORKER_EXEC_ID = "worker-pool";
/** How long a claimed container's worker may take to connect: it may still be loading its code. */
const CONNECT_WAIT_MS = 15_000;
/** How long a pool's filler waits for a new worker to load and warm up (two cores, eight at once). */
const WARM_WAIT_MS = 120_000;
/** Diagnostic lines kept for the outcome's `stderrTail`. */
const STDERR_TAIL_LINES = 20;

export interface PooledWorkerOptions {
  /** The worker's deadline (the run's timeout). */
  timeoutMs?: number;
  signal?: AbortSignal;
  onStderrLine?: (line: string) => void;
  /** Kill the worker's whole process tree (by POOL_WORKER_EXEC_ID). */
  stop: () => Promise<void>;
  /** Whether the container's memory limit killed something since the worker started. */
  oomKilled: () => Promise<boolean>;
  /** What the sandbox is called in messages. */
  sandboxName: string;
  /** How long to wait for the worker to connect (tests). */
  connectWaitMs?: number;
}

/**
 * Make `hostDir/job.sock` and take the worker's connection: the worker, its job not sent yet; or
 * undefined when none came in time (its tree is then stopped, and the run starts a worker itself).
 */
export async function claimPooledWorker(
  hostDir: string,
  options: PooledWorkerOptions,
): Promise<WorkerProcess | undefined> {
  const conn = await firstConnection(
    hostDir,
    JOB_SOCKET,
    options.connectWaitMs ?? CONNECT_WAIT_MS,
    options.signal,
  );
  if (!conn) {
    await options.stop().catch(() => {}); // a worker that never came carries nothing: best effort
    return undefined;
  }
  const input = hostInput();
  void pump(input.stream, conn);
  return workerProcess(framedStream(conn, options), input);
}

/**
 * While `start()` starts the pooled worker: wait until it says it is warm (worker/serve.ts
 * `sayWarm`), so that the container is recorded ready only once a run claiming it starts at once.
 * False when it did not within `waitMs`.
 */
export async function startedWarm(
  hostDir: string,
  start: () => Promise<void>,
  waitMs = WARM_WAIT_MS,
): Promise<boolean> {
  const heard = firstConnection(hostDir, WARM_SOCKET, waitMs);
  await start();
  const conn = await heard;
  conn?.close();
  return conn !== undefined;
}

/**
 * Listen on `hostDir/name` and take the first connection (then stop listening), or undefined after
 * `waitMs` or an abort. The socket is made under another name, opened to every uid (the worker's
 * is the sandbox's, whatever it maps to here), then renamed: the worker, woken by the name, never
 * finds it closed to it.
 */
async function firstConnection(
  hostDir: string,
  name: string,
  waitMs: number,
  signal?: AbortSignal,
): Promise<Deno.UnixConn | undefined> {
  const path = `${hostDir}/${name}`;
  const making = `${hostDir}/.${name}`;
  const listener = Deno.listen({ transport: "unix", path: making });
  try {
    await Deno.chmod(making, 0o666);
    await Deno.rename(making, path);
    return await acceptWithin(listener, waitMs, signal);
  } finally {
    listener.close();
    // One connection was wanted; the directory goes with the container's mount in any case.
    await Deno.remove(path).catch(() => {});
    await Deno.remove(making).catch(() => {});
  }
}

/** The first connection to `listener`, or undefined after `waitMs` or an abort. */
async function acceptWithin(
  listener: Deno.Listener<Deno.UnixConn>,
  waitMs: number,
  signal?: AbortSignal,
): Promise<Deno.UnixConn | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const given = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), waitMs);
    signal?.addEventListener("abort", () => resolve(undefined), { once: true });
  });
  try {
    // Closing the listener (in the caller) ends an accept still pending.
    return await Promise.race([listener.accept().catch(() => undefined), given]);
  } finally {
    clearTimeout(timer);
  }
}

/** The host's input to the worker: the job's line, then nothing until the host leaves. */
async function pump(input: ReadableStream<Uint8Array>, conn: Deno.UnixConn): Promise<void> {
  try {
    for await (const chunk of input) {
      for (let done = 0; done < chunk.byteLength;) done += await conn.write(chunk.subarray(done));
    }
    await conn.closeWrite();
  } catch {
    // The worker is gone: its end is read from the connection (no `x` frame).
  }
}

/** The worker's framed lines as an exec stream: events out, diagnostics aside, its exit code. */
function framedStream(conn: Deno.UnixConn, options: PooledWorkerOptions): ExecStream {
  const started = performance.now();
  let settle!: (outcome: Promise<ExecStreamOutcome>) => void;
  const outcome = new Promise<ExecStreamOutcome>((resolve) => settle = resolve);
  outcome.catch(() => {}); // the caller awaits it; this only keeps an unread one handled
  let ended: "timeout" | "interrupted" | undefined;
  const end = (why: "timeout" | "interrupted") => {
    ended ??= why;
    closeQuietly(conn);
  };
  const timer = options.timeoutMs === undefined
    ? undefined
    : setTimeout(() => end("timeout"), options.timeoutMs);
  const onAbort = () => end("interrupted");
  options.signal?.addEventListener("abort", onAbort, { once: true });
  const tail: string[] = [];
  let code: number | undefined;
  const finish = async (stoppedEarly: boolean): Promise<ExecStreamOutcome> => {
    clearTimeout(timer);
    options.signal?.removeEventListener("abort", onAbort);
    closeQuietly(conn);
    if (ended || stoppedEarly) await options.stop();
    if (ended === "timeout") {
      throw new SandboxError(
        "timeout",
        `Command timed out after ${options.timeoutMs} ms in sandbox "${options.sandboxName}"`,
      );
    }
    if (ended === "interrupted") throw new SandboxError("interrupted", "Command interrupted");
    // Gone without saying how it ended: killed (the memory limit, or the agent).
    const exitCode = code ?? 137;
    return {
      exitCode,
      durationMs: Math.round(performance.now() - started),
      timedOut: false,
      oomKilled: exitCode === 137 && await options.oomKilled().catch(() => false),
      stderrTail: tail.join("\n"),
    };
  };
  return {
    outcome,
    [Symbol.asyncIterator]: async function* () {
      let drained = false;
      try {
        for await (const line of readLines(conn.readable)) {
          const tag = line[0];
          const text = line.slice(1);
          if (tag === "o") yield text;
          else if (tag === "e") {
            tail.push(text);
            if (tail.length > STDERR_TAIL_LINES) tail.shift();
            options.onStderrLine?.(text);
          } else if (tag === "x" && /^\d+$/.test(text)) code = Number(text);
        }
        drained = true;
      } catch (error) {
        // The connection closed under the read at a deadline or an interrupt: `finish` says so.
        // Anything else (a line past the cap) is the caller's, the worker stopped.
        if (!ended) throw error;
        drained = true;
      } finally {
        settle(finish(!drained));
      }
      await outcome;
    },
  };
}

function closeQuietly(conn: Deno.UnixConn): void {
  try {
    conn.close();
  } catch {
    // Already closed.
  }
}
