/**
 * `worker serve`: the worker takes its job (worker/job.ts) from its input instead of argv and
 * files, so that the prompt touches neither.
 *
 * - `worker serve`: the job is the first line of stdin; events go to stdout, diagnostics to
 *   stderr, as in the argv form.
 * - `worker serve --await-job DIR`: a worker started ahead of its run, in a pooled container that
 *   no run has touched (lib/sandbox/pool.ts). It loads its code (the agent's libraries, what makes
 *   a worker slow to start), then waits, holding no secret, for `DIR/job.sock`: DIR is in the
 *   container's socket directory, which the host bind-mounts read-only (proxy_mount.ts), so only
 *   the host can make that socket — the host of the run that claimed the container. The worker
 *   connects, reads its job there and writes framed lines back: `o` + an event (its stdout),
 *   `e` + a diagnostic line (its stderr), and last `x` + its exit code
 *   (lib/sandbox/pooled_worker.ts reads them).
 *
 * Either way, the input staying open is the host's presence: when it ends after the job (the host
 * stopped, was killed, or the run was cut short), the worker exits at once instead of working on
 * for nobody.
 */
import { MAX_JOB_BYTES, parseJob, type WorkerJob } from "./job.ts";

/** Exit code when the host went away before the worker finished. */
export const EXIT_HOST_GONE = 130;
const encoder = new TextEncoder();

/** A byte stream the worker reads its job from, and writes to. */
export interface Channel {
  /** The job's line, then the rest of the input (its end means the host is gone). */
  readable: ReadableStream<Uint8Array>;
  /** Events: one message per line. */
  events: { write(bytes: Uint8Array): Promise<number> };
  /** Diagnostics, line by line. */
  diagnostic(line: string): void;
  /** Say how the worker ends, then close. */
  finish(code: number): Promise<void>;
}

/**
 * Read the first line of `readable` (the job), leaving the reader positioned after it. Raises
 * `TypeError` when the input ends first or the line is too long.
 */
export async function readJob(
  reader: ReadableStreamDefaultReader<Uint8Array>,
): Promise<{ job: WorkerJob; rest: Uint8Array }> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  while (true) {
    const { value, done } = await reader.read();
    if (done) throw new TypeError("The input ended before a whole job line");
    const newline = value.indexOf(0x0a);
    if (newline === -1) {
      chunks.push(value);
      size += value.byteLength;
      if (size > MAX_JOB_BYTES) {
        throw new TypeError(`The job line is longer than ${MAX_JOB_BYTES} bytes`);
      }
      continue;
    }
    chunks.push(value.subarray(0, newline));
    const line = new TextDecoder().decode(concat(chunks));
    return { job: parseJob(line), rest: value.subarray(newline + 1) };
  }
}

/** Resolves when the input ends (or breaks): the host is gone. */
export async function inputEnded(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<void> {
  try {
    while (!(await reader.read()).done) {
      // Nothing more is expected after the job; whatever comes is ignored.
    }
  } catch {
    // A broken input is an ended one.
  }
}

/** The process's own stdio: `worker serve` without a socket. */
export function stdioChannel(): Channel {
  return {
    readable: Deno.stdin.readable,
    events: Deno.stdout,
    diagnostic: (line) => Deno.stderr.writeSync(encoder.encode(line + "\n")),
    finish: () => Promise.resolve(),
  };
}

/** The socket the host of the claiming run makes in a pooled worker's directory. */
export const JOB_SOCKET = "job.sock";
/** The socket the host filling the pool makes there, to hear that the worker is warm. */
export const WARM_SOCKET = "warm.sock";

/** Tell the host that filled the pool (if it listens in `dir`) that this worker is warm. */
export async function sayWarm(dir: string): Promise<void> {
  try {
    (await Deno.connect({ transport: "unix", path: `${dir}/${WARM_SOCKET}` })).close();
  } catch {
    // Nobody listens (the filler gave up waiting, or went): the container is ready all the same.
  }
}

/**
 * Run `ready` (the worker loads its code), then wait for `dir/job.sock` (inotify: an idle worker
 * costs nothing) and connect to it: the channel of that connection. Raises when `dir` goes first.
 */
export async function jobChannel(dir: string, ready: () => Promise<void>): Promise<Channel> {
  await ready();
  const path = `${dir}/${JOB_SOCKET}`;
  const connect = () =>
    Deno.connect({ transport: "unix", path }).catch((error: Error) => {
      // Not made yet, not listening yet, or not yet opened to this uid (the host makes it, then
      // changes its mode): the watch below says when to try again.
      if (
        error instanceof Deno.errors.NotFound || error instanceof Deno.errors.ConnectionRefused ||
        error instanceof Deno.errors.PermissionDenied
      ) return undefined;
      throw error;
    });
  const watcher = Deno.watchFs(dir, { recursive: false });
  try {
    // Made before the watch began: no event will say so.
    let conn = await connect();
    for await (const event of conn ? [] : watcher) {
      if (event.kind === "remove" && event.paths.includes(dir)) break;
      if (event.paths.some((p) => p.endsWith(`/${JOB_SOCKET}`)) && (conn = await connect())) break;
    }
    if (!conn) throw new Error(`${dir} went away before a job came`);
    return framedChannel(conn);
  } finally {
    watcher.close();
  }
}

/** Framed lines on one connection: `o` events, `e` diagnostics, `x` the exit code. */
export function framedChannel(conn: Deno.Conn): Channel {
  // One frame at a time: an event and a diagnostic written at once must not interleave.
  let queue: Promise<unknown> = Promise.resolve();
  let broken = false;
  const send = (tag: string, text: string): Promise<void> => {
    const bytes = encoder.encode(frame(tag, text));
    const sent = queue.then(async () => {
      if (broken) throw new Deno.errors.BrokenPipe("The host is gone");
      try {
        for (let done = 0; done < bytes.byteLength;) done += await conn.write(bytes.subarray(done));
      } catch (error) {
        broken = true;
        throw error;
      }
    });
    // The queue only orders the writes: a failed one is the caller's to see, through `sent`.
    queue = sent.catch(() => {});
    return sent;
  };
  let pending = "";
  return {
    readable: conn.readable,
    events: {
      // Events arrive as whole lines (the emitter writes one per call); a partial one waits.
      async write(bytes: Uint8Array): Promise<number> {
        pending += new TextDecoder().decode(bytes);
        const end = pending.lastIndexOf("\n");
        if (end !== -1) {
          const lines = pending.slice(0, end);
          pending = pending.slice(end + 1);
          for (const line of lines.split("\n")) await send("o", line);
        }
        return bytes.byteLength;
      },
    },
    // Diagnostics and the exit frame have nowhere else to go when the host is gone.
    diagnostic: (line) => void send("e", line).catch(() => {}),
    async finish(code: number): Promise<void> {
      // As for diagnostics: a host that is gone cannot be told how the job ended.
      await send("x", String(code)).catch(() => {});
      await queue;
      try {
        conn.close();
      } catch {
        // Already closed by the host.
      }
    },
  };
}

/** `tag` + each line of `text`, newline-terminated (a diagnostic may span lines). */
export function frame(tag: string, text: string): string {
  return text.split("\n").map((line) => `${tag}${line}\n`).join("");
}

function concat(chunks: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.byteLength, 0));
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.byteLength;
  }
  return out;
}
