/**
 * A command in a pod's container over the API server's exec stream (`@kubernetes/client-node`'s
 * `Exec`: the WebSocket protocol `v5.channel.k8s.io`, v4 where the server has no v5), as a
 * `Child` of lib/process.ts, so that everything built on children (exec streams, the relay
 * process) works on it unchanged.
 *
 * The exec API has neither a working directory nor an environment, and its command line is
 * recorded by the API server's audit log: so every command starts as a small perl prelude that
 * reads the variables from the head of its stdin (`LENGTH\n` then `NAME=VALUE` entries separated
 * by NUL), enters the working directory, and execs the image's wrapper, `sandbox-exec ID CMD…`
 * (scripts/sandbox-exec), which gives them to CMD and ends CMD's whole tree when stopped
 * (`sandbox-exec --kill ID`, in the same container, as the same uid).
 */
import { Exec, type V1Status } from "@kubernetes/client-node";
import { PassThrough, Writable } from "node:stream";
import { Buffer } from "node:buffer";
import type { Child, ProcessOutcome, SpawnOptions } from "../../process.ts";
import { LineTooLongError, readLines } from "../../lines.ts";
import { type Cluster, clusterError } from "./cluster.ts";

const PRELUDE = [
  'my ($n, $c) = ("", "");',
  'while (1) { sysread(STDIN, $c, 1) == 1 or exit 126; last if $c eq "\\n"; $n .= $c }',
  "$n =~ /^\\d{1,9}$/ or exit 126;",
  'my $e = ""; while (length($e) < $n) { sysread(STDIN, $e, $n - length($e), length($e)) > 0 or exit 126 }',
  'for (split /\\0/, $e) { /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/s or exit 126; $ENV{"SANDBOX_EXEC_ENV_$1"} = $2 }',
  "my $cwd = shift;",
  'if (length $cwd) { chdir $cwd or do { print STDERR "sandbox: cannot enter $cwd: $!\\n"; exit 126 } }',
  'exec { $ARGV[0] } @ARGV or do { print STDERR "sandbox: cannot run $ARGV[0]: $!\\n"; exit 127 };',
].join("\n");

/** The head of a command's stdin that carries its variables to the prelude. */
export function envHeader(env: Record<string, string> = {}): Uint8Array {
  const body = new TextEncoder().encode(
    Object.entries(env).map(([name, value]) => `${name}=${value}`).join("\0"),
  );
  const head = new TextEncoder().encode(`${body.byteLength}\n`);
  const out = new Uint8Array(head.byteLength + body.byteLength);
  out.set(head);
  out.set(body, head.byteLength);
  return out;
}

/**
 * The argv the pod runs for `argv` as exec `id`: the prelude, then the wrapper; with no `id`,
 * `argv` itself (the wrapper's own `--kill`).
 */
export function preludeArgv(id: string, argv: readonly string[], cwd = ""): string[] {
  return ["perl", "-e", PRELUDE, cwd, ...(id ? ["sandbox-exec", id] : []), ...argv];
}

/** The exit code a finished exec's `Status` reports (126: it could not start). */
export function exitCodeOf(status: V1Status): { exitCode: number; message?: string } {
  if (status.status === "Success") return { exitCode: 0 };
  const cause = status.details?.causes?.find((each) => each.reason === "ExitCode");
  const code = Number(cause?.message);
  if (status.reason === "NonZeroExitCode" && Number.isInteger(code)) return { exitCode: code };
  return { exitCode: 126, message: status.message ?? "the exec failed" };
}

export interface PodExecOptions extends SpawnOptions {
  pod: string;
  container: string;
  /** The exec's id for the wrapper (`sandbox-exec ID`). */
  id: string;
  /** Stop the command's tree inside (`sandbox-exec --kill ID`), for a timeout, abort or kill. */
  stopInside: () => Promise<void>;
}

const STDERR_TAIL_CHARS = 8_192;

/**
 * Where an exec's output goes: stdout as a stream for the caller (what comes after the caller
 * cancelled it is dropped), stderr to the caller's callbacks and a bounded tail for the outcome.
 */
function outputSinks(options: PodExecOptions) {
  let out!: ReadableStreamDefaultController<Uint8Array>;
  const stdout = new ReadableStream<Uint8Array>({ start: (c) => void (out = c) });
  const state = { stderrTail: "", stderrLine: "" };
  const decoder = new TextDecoder();
  const stdoutSink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      // A consumer that went away cancelled the stream: what still comes is dropped.
      try {
        out.enqueue(new Uint8Array(chunk));
      } catch { /* cancelled by its reader (see above) */ }
      done();
    },
  });
  const stderrSink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      const text = decoder.decode(chunk, { stream: true });
      state.stderrTail = (state.stderrTail + text).slice(-STDERR_TAIL_CHARS);
      options.onStderrChunk?.(text);
      if (options.onStderrLine) {
        const lines = (state.stderrLine + text).split("\n");
        state.stderrLine = lines.pop()!;
        for (const line of lines) options.onStderrLine(line);
      }
      done();
    },
  });
  return {
    stdout,
    stdoutSink,
    stderrSink,
    /** The stderr tail, with `extra` (a message of our own) added. */
    tail: (extra = "") => `${state.stderrTail}${extra}`.slice(-STDERR_TAIL_CHARS),
    close() {
      // (Ended already when the consumer cancelled it.)
      try {
        out.close();
      } catch { /* see above */ }
    },
    error: (failure: Error) => out.error(failure),
  };
}

/** The exit code and message of an exec whose stream closed, with its status if one came. */
function closedWith(status: V1Status | undefined, stopped: boolean): [number, string] {
  if (!status) return [stopped ? 137 : 255, "the exec stream ended without an exit status\n"];
  const { exitCode, message } = exitCodeOf(status);
  return [exitCode, message ? `${message}\n` : ""];
}

/** `argv` in `options.container` of pod `options.pod`, started now. */
export function podSpawn(
  cluster: Cluster,
  argv: readonly string[],
  options: PodExecOptions,
): Child {
  const started = performance.now();
  const sinks = outputSinks(options);
  const stdin = new PassThrough();
  let timedOut = false;
  let aborted = false;
  let socket: { close(): void } | undefined;
  let stopping: Promise<void> | undefined;
  const stop = () => {
    socket?.close();
    // The tree inside is stopped by the wrapper; a failure to reach it shows in the outcome.
    stopping ??= options.stopInside().catch(() => {});
  };
  const finished = new Promise<ProcessOutcome>((resolve, reject) => {
    const end = (exitCode: number, extra = "") => {
      clearTimeout(timer);
      options.signal?.removeEventListener("abort", onAbort);
      sinks.close();
      resolve({
        argv,
        exitCode: timedOut ? 124 : exitCode,
        signal: null,
        durationMs: performance.now() - started,
        timedOut,
        aborted,
        stderrTail: sinks.tail(extra),
      });
    };
    const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => {
      timedOut = true;
      stop();
    }, options.timeoutMs);
    const onAbort = () => {
      aborted = true;
      stop();
    };
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener("abort", onAbort, { once: true });
    let status: V1Status | undefined;
    new Exec(cluster.config).exec(
      cluster.namespace,
      options.pod,
      options.container,
      [...argv],
      sinks.stdoutSink,
      sinks.stderrSink,
      stdin,
      false,
      (received) => void (status = received),
    ).then((ws) => {
      socket = ws;
      if (aborted || timedOut) ws.close();
      ws.addEventListener("close", async () => {
        await stopping;
        end(...closedWith(status, aborted || timedOut));
      });
    }, (error) => {
      clearTimeout(timer);
      const failure = clusterError(cluster, `run a command in pod "${options.pod}"`, error);
      sinks.error(failure);
      reject(failure);
    });
  });
  feedStdin(stdin, options.env, options.stdin);
  return {
    argv,
    stdout: sinks.stdout,
    finished,
    lines: () => linesOf(sinks.stdout, options.maxLineChars, stop),
    kill: stop,
  };
}

/** Write the variables' header, then the caller's stdin, then end it (v5: the close signal). */
async function feedStdin(
  stdin: PassThrough,
  env: Record<string, string> | undefined,
  input: SpawnOptions["stdin"],
): Promise<void> {
  stdin.write(Buffer.from(envHeader(env)));
  try {
    if (typeof input === "string") stdin.write(Buffer.from(new TextEncoder().encode(input)));
    else if (input instanceof Uint8Array) stdin.write(Buffer.from(input));
    else if (input) {
      for await (const chunk of input) {
        if (!stdin.write(Buffer.from(chunk))) {
          await new Promise((resolve) => stdin.once("drain", resolve));
        }
      }
    }
  } finally {
    stdin.end();
  }
}

async function* linesOf(
  stdout: ReadableStream<Uint8Array>,
  maxLineChars: number | undefined,
  stop: () => void,
): AsyncGenerator<string> {
  try {
    yield* readLines(stdout, maxLineChars);
  } catch (error) {
    if (error instanceof LineTooLongError) stop();
    throw error;
  }
}
