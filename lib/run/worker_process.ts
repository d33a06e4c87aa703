/**
 * A worker started with `worker serve` (worker/serve.ts): its output as an `ExecStream`, and its
 * input, which carries the job — prompt, run variables, options — as one line, and then stays open
 * while the host waits: ending it tells the worker the host is gone.
 *
 * It may be started before its job is known (while a run's session opens), and the job sent later.
 */
import { encodeJob, type WorkerJob } from "../../worker/job.ts";
import type { ExecOptions, ExecStream, SandboxProvider } from "../sandbox/provider.ts";

export interface WorkerProcess {
  readonly stream: ExecStream;
  /** Hand the worker its job. Once. */
  send(job: WorkerJob): void;
  /** End the worker's input (after its result, or to stop it). */
  close(): void;
}

/** An input stream the host writes to, and ends when it chooses. */
export function hostInput(): {
  stream: ReadableStream<Uint8Array>;
  write(text: string): void;
  close(): void;
} {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  let closed = false;
  const stream = new ReadableStream<Uint8Array>({ start: (c) => void (controller = c) });
  return {
    stream,
    write(text: string) {
      if (!closed) controller.enqueue(new TextEncoder().encode(text));
    },
    close() {
      if (closed) return;
      closed = true;
      try {
        controller.close();
      } catch {
        // The reader went away.
      }
    },
  };
}

/** Start `argv` (a `worker serve` command) in `provider`, its input held open for the job. */
export function startWorker(
  provider: SandboxProvider,
  argv: readonly string[],
  options: Omit<ExecOptions, "stdin" | "env"> = {},
): WorkerProcess {
  const input = hostInput();
  const stream = provider.execStream(argv, { ...options, stdin: input.stream });
  return workerProcess(stream, input);
}

/** A worker process from its output stream and the input it reads. */
export function workerProcess(
  stream: ExecStream,
  input: { write(text: string): void; close(): void },
): WorkerProcess {
  let sent = false;
  return {
    stream,
    send(job: WorkerJob) {
      if (sent) throw new Error("Internal error: a worker takes one job");
      sent = true;
      input.write(encodeJob(job));
    },
    close: () => input.close(),
  };
}
