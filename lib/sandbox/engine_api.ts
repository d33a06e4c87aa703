/**
 * The Docker Engine API over its Unix socket, for the few `docker` calls on every run's path
 * (`exec`, `container inspect`, `volume inspect`, `image inspect`): made here, they cost a
 * connection and a few milliseconds instead of starting the docker CLI (tens of milliseconds of
 * CPU each, six or seven times a run, and for concurrent runs all at once).
 *
 * Only where it reaches the very engine the CLI would, with the same request the CLI makes for
 * the same argv (DockerCli decides per call, see docker.ts):
 *
 * - the `docker` on PATH is a program, not a script (a wrapper such as podman's `docker` shim, or
 *   a test's fake, is always run as it is);
 * - `DOCKER_HOST` is unset or `unix://PATH`, and no other context is chosen (`DOCKER_CONTEXT`, or
 *   `currentContext` in the CLI's config.json); `DOCKER_API_VERSION` is unset;
 * - `SANDBOX_DOCKER_API` is not `0` (which keeps every call to the CLI);
 * - the socket accepts the connection. Anything else, and a socket that cannot be reached (an
 *   engine that is down, no permission), goes to the CLI, which reports it as the user knows it.
 *
 * Environment values travel in the request body over the socket, as the CLI sends them: never on
 * a command line.
 */
import {
  type Child,
  collectStderr,
  linesOrStop,
  type SpawnOptions,
  stopOnAbortOrTimeout,
} from "../process.ts";
import { writeAll } from "../conn.ts";
import { SandboxError } from "../errors.ts";
import {
  type ContainerInspect,
  type DockerEngine,
  EngineError,
  type EngineErrorKind,
  type ExecChild,
  type ExecOutcome,
  type ExecRequest,
  type ImageInspect,
  type ObjectKind,
  type VolumeInspect,
} from "./engine.ts";
import type { DockerCli } from "./docker.ts";
import { MAX_LINE_CHARS } from "../lines.ts";
import { trace, tracing } from "../trace.ts";

/** The engine's socket when no DOCKER_HOST says otherwise (Linux). */
const DEFAULT_SOCKET = "/var/run/docker.sock";
/** Exit code of a client the caller stopped (as the CLI killed by SIGTERM). */
const EXIT_KILLED = 143;
/** How long an exec whose stream has ended may still say it runs before it is taken as gone. */
const EXIT_WAIT_MS = 2_000;
/** Bytes of stdout held for a reader that has not read yet (a pipe's buffer, as with the CLI). */
const STDOUT_BUFFER_BYTES = 64 * 1024;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

let resolved: { socket?: string } | undefined;

/**
 * The socket of the engine the `docker` CLI would reach, when the calls may go there directly
 * (see the module comment); undefined: use the CLI. Decided once per process.
 */
/** Whether the engine says exec `id` is running; true when it cannot be asked (a wait decides). */
export async function execRunning(id: string | undefined): Promise<boolean> {
  const socket = engineSocket();
  if (!id || !socket) return true;
  try {
    const response = await engineRequest(socket, "GET", `/exec/${id}/json`);
    if (response.status === 404) return false;
    if (response.status !== 200) return true;
    return (JSON.parse(response.body) as { Running?: boolean }).Running === true;
  } catch {
    // Cannot be asked: "running", so that the caller's own wait decides (never a false "gone").
    return true;
  }
}

export function engineSocket(): string | undefined {
  resolved ??= { socket: resolveSocket() };
  return resolved.socket;
}

/** After a failed connection: every later call goes to the CLI. */
function giveUpSocket(): void {
  resolved = {};
}

/** For tests: decide again (after changing the environment). */
export function resetEngineSocket(): void {
  resolved = undefined;
}

function resolveSocket(): string | undefined {
  try {
    const env = (name: string) => Deno.env.get(name) || undefined;
    if (env("SANDBOX_DOCKER_API") === "0" || env("DOCKER_API_VERSION")) return undefined;
    const context = env("DOCKER_CONTEXT");
    if (context && context !== "default") return undefined;
    const host = env("DOCKER_HOST");
    if (host && !host.startsWith("unix://")) return undefined;
    if (!dockerIsAProgram()) return undefined;
    if (!context && !host && otherContextConfigured()) return undefined;
    const socket = host ? host.slice("unix://".length) : DEFAULT_SOCKET;
    return socket.startsWith("/") ? socket : undefined;
  } catch {
    // No permission to look (a library user's narrower Deno permissions): the CLI it is.
    return undefined;
  }
}

/** The first `docker` on PATH exists and is not a script (`#!`): docker's own client. */
function dockerIsAProgram(): boolean {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    if (!dir) continue;
    const path = `${dir}/docker`;
    let info: Deno.FileInfo;
    try {
      info = Deno.statSync(path);
    } catch {
      // Not in this directory of PATH: the next one.
      continue;
    }
    if (!info.isFile || info.mode === null || (info.mode & 0o111) === 0) continue;
    const file = Deno.openSync(path);
    try {
      const head = new Uint8Array(2);
      const read = file.readSync(head);
      return read === 2 && !(head[0] === 0x23 && head[1] === 0x21);
    } finally {
      file.close();
    }
  }
  return false;
}

/** The CLI's config.json names a context other than the default. */
function otherContextConfigured(): boolean {
  const dir = Deno.env.get("DOCKER_CONFIG") || `${Deno.env.get("HOME") ?? ""}/.docker`;
  let text: string;
  try {
    text = Deno.readTextFileSync(`${dir}/config.json`);
  } catch {
    // No config.json: the CLI uses its default context too.
    return false;
  }
  try {
    const context = (JSON.parse(text) as { currentContext?: unknown }).currentContext;
    return typeof context === "string" && context !== "" && context !== "default";
  } catch {
    // A config the CLI itself may refuse: let it say so.
    return true;
  }
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;

/**
 * `exec [--interactive] [--user U] [--workdir D] [--env NAME[=VALUE]]... CONTAINER CMD...` as an
 * API request, or undefined for any other form (the CLI runs it). `--env NAME` takes the value
 * from `clientEnv`, else this process's environment, and is left out when neither has it (as the
 * CLI does).
 */
export function execRequestOf(
  args: readonly string[],
  clientEnv: Record<string, string> = {},
): ExecRequest | undefined {
  if (args[0] !== "exec") return undefined;
  const request: ExecRequest = { container: "", cmd: [], env: [], interactive: false };
  let i = 1;
  for (; i < args.length && args[i].startsWith("-"); i++) {
    const arg = args[i];
    if (arg === "--interactive") {
      request.interactive = true;
      continue;
    }
    if (arg === "--detach") {
      request.detach = true;
      continue;
    }
    const value = args[i + 1];
    if (value === undefined) return undefined;
    i++;
    if (arg === "--user") request.user = value;
    else if (arg === "--workdir") request.workdir = value;
    else if (arg === "--env") {
      const eq = value.indexOf("=");
      if (eq === 0) return undefined;
      if (eq > 0) request.env.push(value);
      else {
        const given = Object.hasOwn(clientEnv, value) ? clientEnv[value] : Deno.env.get(value);
        if (given !== undefined) request.env.push(`${value}=${given}`);
      }
    } else return undefined;
  }
  const container = args[i];
  if (container === undefined || !NAME.test(container) || i + 1 >= args.length) return undefined;
  request.container = container;
  request.cmd = args.slice(i + 1);
  return request;
}

/** One HTTP response from the engine. */
interface Response {
  status: number;
  body: string;
}

/** Raised when the socket cannot be reached: the caller goes to the CLI. */
class Unreachable extends Error {}

async function connect(socket: string): Promise<Deno.UnixConn> {
  try {
    return await Deno.connect({ transport: "unix", path: socket });
  } catch (error) {
    giveUpSocket();
    throw new Unreachable(`Cannot connect to ${socket}`, { cause: error });
  }
}

export function requestHead(method: string, path: string, body: string, extra = ""): Uint8Array {
  return encoder.encode(
    `${method} ${path} HTTP/1.1\r\nHost: docker\r\nUser-Agent: sandbox\r\n${extra}` +
      (body
        ? `Content-Type: application/json\r\nContent-Length: ${encoder.encode(body).byteLength}\r\n`
        : "") +
      `\r\n${body}`,
  );
}

/**
 * Reads a response's head from `conn`: the status, the headers (lower-case names), and the bytes
 * already read past the head.
 */
export async function readHead(
  conn: Deno.Conn,
): Promise<{ status: number; headers: Map<string, string>; rest: Uint8Array }> {
  let buffered: Uint8Array = new Uint8Array(0);
  const chunk = new Uint8Array(16 * 1024);
  while (true) {
    const end = indexOfHeadEnd(buffered);
    if (end !== -1) {
      const lines = decoder.decode(buffered.subarray(0, end)).split("\r\n");
      const status = Number(lines[0].split(" ")[1]);
      const headers = new Map<string, string>();
      for (const line of lines.slice(1)) {
        const colon = line.indexOf(":");
        if (colon > 0) {
          headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
        }
      }
      return { status, headers, rest: buffered.subarray(end + 4) };
    }
    if (buffered.byteLength > 64 * 1024) throw new Error("The engine's response head is too long");
    const n = await conn.read(chunk);
    if (n === null) throw new Error("The engine closed the connection before answering");
    buffered = concat([buffered, chunk.subarray(0, n)]);
  }
}

function indexOfHeadEnd(bytes: Uint8Array): number {
  for (let i = 0; i + 3 < bytes.byteLength; i++) {
    if (bytes[i] === 13 && bytes[i + 1] === 10 && bytes[i + 2] === 13 && bytes[i + 3] === 10) {
      return i;
    }
  }
  return -1;
}

/** One request on a connection of its own (closed after it); the whole body as text. */
export async function engineRequest(
  socket: string,
  method: string,
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<Response> {
  const conn = await connect(socket);
  const abort = () => conn.close();
  signal?.addEventListener("abort", abort, { once: true });
  try {
    signal?.throwIfAborted();
    await writeAll(
      conn,
      requestHead(
        method,
        path,
        body === undefined ? "" : JSON.stringify(body),
        "Connection: close\r\n",
      ),
    );
    const head = await readHead(conn);
    const rest = [head.rest];
    const chunk = new Uint8Array(64 * 1024);
    const length = head.headers.get("content-length");
    let size = head.rest.byteLength;
    while (length === undefined || size < Number(length)) {
      const n = await conn.read(chunk);
      if (n === null) break;
      rest.push(chunk.slice(0, n));
      size += n;
    }
    const raw = concat(rest);
    const text = /chunked/i.test(head.headers.get("transfer-encoding") ?? "")
      ? dechunk(raw)
      : decoder.decode(raw);
    return { status: head.status, body: text };
  } catch (error) {
    signal?.throwIfAborted();
    throw error;
  } finally {
    signal?.removeEventListener("abort", abort);
    try {
      conn.close();
    } catch {
      // Closed by an abort.
    }
  }
}

function dechunk(raw: Uint8Array): string {
  const parts: Uint8Array[] = [];
  let at = 0;
  while (at < raw.byteLength) {
    let lineEnd = at;
    while (lineEnd + 1 < raw.byteLength && !(raw[lineEnd] === 13 && raw[lineEnd + 1] === 10)) {
      lineEnd++;
    }
    const size = parseInt(decoder.decode(raw.subarray(at, lineEnd)), 16);
    if (!Number.isFinite(size) || size === 0) break;
    parts.push(raw.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
  return decoder.decode(concat(parts));
}

function concat(chunks: Uint8Array[]): Uint8Array {
  if (chunks.length === 1) return chunks[0];
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.byteLength, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

/**
 * The engine's refusal as an `EngineError`: 404 is the object's absence (an image's own kind), 409
 * a conflict unless `statuses` says otherwise for the operation, anything else `refused`.
 */
function errorOf(
  response: Response,
  operation: string,
  what: ObjectKind | undefined,
  statuses: Partial<Record<number, EngineErrorKind>> = {},
): EngineError {
  const kind: EngineErrorKind = statuses[response.status] ??
    (response.status === 404
      ? what === "image" ? "image-missing" : "not-found"
      : response.status === 409
      ? "conflict"
      : "refused");
  return new EngineError(kind, operation, daemonMessage(response));
}

/** The daemon's error message in an error answer (`{"message": …}`), else the raw body. */
function daemonMessage(response: Response): string {
  try {
    const message = (JSON.parse(response.body) as { message?: unknown }).message;
    if (typeof message === "string") return message;
  } catch {
    // Not JSON.
  }
  return response.body.trim() || `HTTP ${response.status}`;
}

/**
 * A `docker exec` through the API, behaving as the CLI child it replaces: stdout as a stream,
 * stderr to the callbacks and its tail, stdin fed from `options.stdin` (its end closes the
 * command's input), the command's exit code, and `kill()` ending the client's side (which, as
 * with the CLI, leaves the command itself to the exec wrapper's own stop). When the socket cannot
 * be reached, `fallback()` (the CLI) runs instead, with the same options.
 */
export class EngineExec implements Child {
  readonly argv: readonly string[];
  readonly stdout: ReadableStream<Uint8Array>;
  readonly finished: Promise<ExecOutcome>;
  readonly #options: SpawnOptions;
  readonly #maxLineChars: number;
  #stdout!: ReadableStreamDefaultController<Uint8Array>;
  #room: (() => void) | undefined;
  #cancelled = false;
  #conn: Deno.UnixConn | undefined;
  #input: ReadableStreamDefaultReader<Uint8Array> | undefined;
  #fallback: Child | undefined;
  #killed = false;
  #ended = false;

  constructor(
    socket: string,
    argv: readonly string[],
    request: ExecRequest,
    options: SpawnOptions,
    fallback: () => Child,
  ) {
    this.argv = argv;
    this.#options = options;
    this.#maxLineChars = options.maxLineChars ?? MAX_LINE_CHARS;
    this.stdout = new ReadableStream<Uint8Array>({
      start: (controller) => void (this.#stdout = controller),
      pull: () => this.#makeRoom(),
      cancel: () => {
        // The reader is gone: what the command still writes is dropped, as on a closed pipe.
        this.#cancelled = true;
        this.#makeRoom();
      },
    }, new ByteLengthQueuingStrategy({ highWaterMark: STDOUT_BUFFER_BYTES }));
    this.finished = this.#run(socket, request, fallback);
  }

  /** stdout as lines; a line over the cap raises `LineTooLongError` (and the exec is stopped). */
  lines(): AsyncGenerator<string> {
    return linesOrStop(this.stdout, this.#maxLineChars, () => this.kill());
  }

  /** End the client's side now (the CLI's SIGTERM). */
  kill(): void {
    if (this.#fallback) return this.#fallback.kill();
    if (this.#ended || this.#killed) return;
    this.#killed = true;
    this.#makeRoom();
    try {
      this.#conn?.close();
    } catch {
      // Already closed.
    }
  }

  async #run(socket: string, request: ExecRequest, fallback: () => Child): Promise<ExecOutcome> {
    const started = performance.now();
    const options = this.#options;
    const stop = stopOnAbortOrTimeout(options, () => this.kill());
    let stderr:
      | { write(bytes: Uint8Array): void; close(): void; tail: Promise<string> }
      | undefined;
    try {
      let exitCode: number;
      let failure: EngineError | undefined;
      let id: string | EngineError;
      try {
        id = await this.#create(socket, request);
      } catch (error) {
        if (!(error instanceof Unreachable) || this.#killed) throw error;
        stop.release();
        return await this.#runFallback(fallback);
      }
      stderr = stderrSink(options);
      if (typeof id !== "string") {
        // The engine refused the exec (no such container, not running): its message on stderr.
        failure = id;
        stderr.write(encoder.encode(`${id.engineMessage}\n`));
        exitCode = 1;
      } else {
        ({ exitCode, failure } = await this.#start(socket, id, request, stderr));
      }
      this.#ended = true;
      stderr.close();
      this.#closeStdout();
      const tail = await stderr.tail;
      const stopped = this.#killed;
      if (tracing()) {
        trace(
          `docker api: exec ${label(request.cmd)} ended ${stopped ? "(stopped)" : exitCode} (${
            (performance.now() - started).toFixed(1)
          } ms)`,
        );
      }
      return {
        argv: this.argv,
        exitCode: stopped ? EXIT_KILLED : exitCode,
        signal: stopped ? "SIGTERM" : null,
        durationMs: performance.now() - started,
        timedOut: stop.timedOut,
        aborted: stop.aborted && !stop.timedOut,
        stderrTail: tail,
        ...(failure && !stopped ? { failure } : {}),
      };
    } catch (error) {
      this.#ended = true;
      stderr?.close();
      this.#closeStdout();
      // The tail is only the report's detail: a failure to read it leaves it empty.
      const tail = stderr ? await stderr.tail.catch(() => "") : "";
      const stopped = this.#killed;
      return {
        argv: this.argv,
        exitCode: stopped ? EXIT_KILLED : 125,
        signal: stopped ? "SIGTERM" : null,
        durationMs: performance.now() - started,
        timedOut: stop.timedOut,
        aborted: stop.aborted && !stop.timedOut,
        stderrTail: stopped ? tail : `${tail}${(error as Error).message}\n`,
        ...(stopped ? {} : {
          failure: new EngineError("engine-unreachable", "exec", (error as Error).message, {
            cause: error,
          }),
        }),
      };
    } finally {
      stop.release();
    }
  }

  /** No engine here after all: the CLI, with everything still unread. */
  async #runFallback(fallback: () => Child): Promise<ExecOutcome> {
    const child = this.#fallback = fallback();
    void child.stdout.pipeTo(
      new WritableStream({
        write: (chunk) => this.#push(chunk),
        close: () => this.#stdout.close(),
        abort: (reason) => this.#stdout.error(reason),
      }),
    ).catch(() => {}); // its end or failure shows in `finished`, awaited below
    if (this.#killed) child.kill();
    return await child.finished;
  }

  #makeRoom(): void {
    this.#room?.();
    this.#room = undefined;
  }

  #closeStdout(): void {
    try {
      this.#stdout.close();
    } catch {
      // Already closed (the reader cancelled).
    }
  }

  /** Create the exec: its id, or the engine's refusal. */
  async #create(socket: string, request: ExecRequest): Promise<string | EngineError> {
    const response = await engineRequest(socket, "POST", `/containers/${request.container}/exec`, {
      User: request.user ?? "",
      WorkingDir: request.workdir ?? "",
      Env: request.env,
      Cmd: request.cmd,
      AttachStdin: request.interactive && !request.detach,
      AttachStdout: !request.detach,
      AttachStderr: !request.detach,
      Tty: false,
    });
    if (response.status === 201 || response.status === 200) {
      return (JSON.parse(response.body) as { Id: string }).Id;
    }
    // 409: the container exists but is not running (stopped, paused, restarting).
    return errorOf(response, "exec", "container", { 409: "not-running" });
  }

  /** Start exec `id` attached, pump its streams until they end, and return its exit code. */
  async #start(
    socket: string,
    id: string,
    request: ExecRequest,
    stderr: { write(bytes: Uint8Array): void },
  ): Promise<{ exitCode: number; failure?: EngineError }> {
    if (request.detach) {
      const response = await engineRequest(socket, "POST", `/exec/${id}/start`, {
        Detach: true,
        Tty: false,
      });
      if (response.status !== 200 && response.status !== 204) {
        const failure = errorOf(response, "exec start", "container", { 409: "not-running" });
        stderr.write(encoder.encode(`${failure.engineMessage}\n`));
        return { exitCode: 126, failure };
      }
      if (tracing()) trace(`docker api: exec ${label(request.cmd)} detached`);
      await this.#push(encoder.encode(`${id}\n`));
      return { exitCode: 0 };
    }
    const conn = await connect(socket).catch((error) => {
      throw new Error((error as Error).message);
    });
    this.#conn = conn;
    if (this.#killed) conn.close();
    await writeAll(
      conn,
      requestHead(
        "POST",
        `/exec/${id}/start`,
        JSON.stringify({ Detach: false, Tty: false }),
        "Connection: Upgrade\r\nUpgrade: tcp\r\n",
      ),
    );
    const head = await readHead(conn);
    if (head.status !== 101 && head.status !== 200) {
      const failure = errorOf(
        { status: head.status, body: decoder.decode(head.rest) },
        "exec start",
        "container",
        { 409: "not-running" },
      );
      stderr.write(encoder.encode(`${failure.engineMessage}\n`));
      conn.close();
      return { exitCode: 126, failure };
    }
    if (tracing()) trace(`docker api: exec ${label(request.cmd)} attached`);
    const feeding = request.interactive && this.#options.stdin !== undefined
      ? this.#feed(conn, this.#options.stdin)
      : Promise.resolve();
    await this.#demux(conn, head.rest, stderr);
    // The command has ended: its input is no longer read (as the CLI exits, whatever is left).
    this.#ended = true;
    // The input stream may have ended or failed already: either way nothing more is read from it.
    await this.#input?.cancel().catch(() => {});
    await feeding;
    try {
      conn.close();
    } catch {
      // Closed by a kill.
    }
    if (this.#killed) return { exitCode: EXIT_KILLED };
    const ended = await this.#exitCode(socket, id);
    // A process that never got a pid never ran: the engine's failure (the runtime could not
    // start it), not the command's exit code.
    if (ended.exitCode !== 0 && ended.pid === 0) {
      return {
        exitCode: ended.exitCode,
        failure: new EngineError("exec-failed", "exec start", `exit code ${ended.exitCode}`),
      };
    }
    return { exitCode: ended.exitCode };
  }

  /** The command's input: the caller's bytes, then the end of input (half-close). */
  async #feed(
    conn: Deno.UnixConn,
    input: Uint8Array | string | ReadableStream<Uint8Array>,
  ): Promise<void> {
    const stream = typeof input === "string"
      ? ReadableStream.from([encoder.encode(input)])
      : input instanceof Uint8Array
      ? ReadableStream.from([input])
      : input;
    const reader = this.#input = stream.getReader();
    try {
      while (!this.#ended && !this.#killed) {
        const { done, value } = await reader.read();
        if (done) {
          if (!this.#ended && !this.#killed) await conn.closeWrite();
          return;
        }
        await writeAll(conn, value);
      }
      await reader.cancel();
    } catch {
      // The command stopped reading (it ended): as a broken pipe to the CLI, not an error.
      await reader.cancel().catch(() => {}); // cancelling an errored stream may throw: nothing to do
    }
  }

  /** The multiplexed stream: 8-byte headers (stream, size) and payloads, until it ends. */
  async #demux(
    conn: Deno.UnixConn,
    first: Uint8Array,
    stderr: { write(bytes: Uint8Array): void },
  ): Promise<void> {
    let pending = first;
    const chunk = new Uint8Array(64 * 1024);
    const more = async (): Promise<boolean> => {
      let n: number | null;
      try {
        n = await conn.read(chunk);
      } catch {
        // Closed by a kill or reset by the engine: the stream's end; the exit code says the rest.
        n = null;
      }
      if (n === null) return false;
      pending = pending.byteLength === 0
        ? chunk.slice(0, n)
        : concat([pending, chunk.subarray(0, n)]);
      return true;
    };
    while (true) {
      while (pending.byteLength < 8) if (!await more()) return;
      const kind = pending[0];
      const size = new DataView(pending.buffer, pending.byteOffset, 8).getUint32(4);
      while (pending.byteLength < 8 + size) if (!await more()) return;
      const payload = pending.slice(8, 8 + size);
      pending = pending.subarray(8 + size);
      if (kind === 1) await this.#push(payload);
      else if (kind === 2 || kind === 3) stderr.write(payload);
    }
  }

  /** Hand stdout bytes to the reader, waiting while its buffer is full (as a pipe would). */
  async #push(bytes: Uint8Array): Promise<void> {
    if (this.#cancelled) return;
    try {
      this.#stdout.enqueue(bytes);
    } catch {
      // The reader cancelled: its bytes are dropped, as on a closed pipe.
      return;
    }
    while ((this.#stdout.desiredSize ?? 1) <= 0 && !this.#killed && !this.#cancelled) {
      await new Promise<void>((resolve) => this.#room = resolve);
    }
  }

  /** The exec's exit code (and its process's pid, 0 if it never had one), once it has ended. */
  async #exitCode(socket: string, id: string): Promise<{ exitCode: number; pid?: number }> {
    const deadline = performance.now() + EXIT_WAIT_MS;
    while (true) {
      const response = await engineRequest(socket, "GET", `/exec/${id}/json`);
      if (response.status !== 200) return { exitCode: 125 };
      const state = JSON.parse(response.body) as {
        Running?: boolean;
        ExitCode?: number | null;
        Pid?: number;
      };
      if (!state.Running && typeof state.ExitCode === "number") {
        return { exitCode: state.ExitCode, pid: state.Pid };
      }
      if (performance.now() >= deadline) return { exitCode: 125 };
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
}

/** stderr bytes to the caller's callbacks and a kept tail, as the CLI's stderr would be read. */
function stderrSink(
  options: SpawnOptions,
): { write(bytes: Uint8Array): void; close(): void; tail: Promise<string> } {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  const stream = new ReadableStream<Uint8Array>({ start: (c) => void (controller = c) });
  const tail = collectStderr(stream, options, new AbortController().signal);
  let closed = false;
  return {
    write: (bytes) => {
      if (!closed) controller.enqueue(bytes);
    },
    close: () => {
      if (closed) return;
      closed = true;
      controller.close();
    },
    tail,
  };
}

/** A short name for an exec in traces (`relay.js`, `worker.js`), no values. */
function label(cmd: readonly string[]): string {
  if (cmd[0] === "sandbox-exec" && cmd[1]?.startsWith("--")) return cmd[1];
  const command = cmd[0] === "sandbox-exec" ? cmd.slice(2) : cmd;
  const script = command.find((arg) => arg.endsWith(".js"));
  return (script ?? command[0] ?? "").split("/").at(-1) ?? "";
}

/**
 * The `DockerEngine` port over the Engine API, on the socket of the engine the CLI would reach,
 * decided at each call (`DockerCli.engineSocket`). Where there is none (see the module comment),
 * and for a call whose connection is refused (the engine went away, the socket's permissions
 * changed), `fallback` (the CLI) answers instead, reporting the engine as the user knows it.
 */
export class ApiEngine implements DockerEngine {
  constructor(readonly cli: DockerCli, readonly fallback: DockerEngine) {}

  async #request(
    method: string,
    path: string,
    body: unknown,
    options: { signal?: AbortSignal; timeoutMs?: number },
  ): Promise<Response | undefined> {
    const signal = options.timeoutMs === undefined ? options.signal : AbortSignal.any([
      ...(options.signal ? [options.signal] : []),
      AbortSignal.timeout(options.timeoutMs),
    ]);
    const socket = this.cli.engineSocket();
    if (!socket) return undefined;
    const started = performance.now();
    try {
      const response = await engineRequest(socket, method, path, body, signal);
      if (tracing()) {
        trace(
          `docker api: ${method} ${path.split("?")[0]} ${response.status} (${
            (performance.now() - started).toFixed(1)
          } ms)`,
        );
      }
      return response;
    } catch (error) {
      if (error instanceof Unreachable) return undefined;
      if (signal?.aborted && !options.signal?.aborted) {
        throw new SandboxError("timeout", `docker ${method} ${path}: timed out`, { cause: error });
      }
      throw error;
    }
  }

  async #json<T>(
    path: string,
    operation: string,
    what: ObjectKind,
    signal: AbortSignal | undefined,
    fallback: () => Promise<T>,
  ): Promise<T> {
    const response = await this.#request("GET", path, undefined, { signal });
    if (!response) return await fallback();
    if (response.status !== 200) throw errorOf(response, operation, what);
    return JSON.parse(response.body) as T;
  }

  inspectContainer(name: string, signal?: AbortSignal): Promise<ContainerInspect> {
    return this.#json(
      `/containers/${encodeURIComponent(name)}/json`,
      "container inspect",
      "container",
      signal,
      () => this.fallback.inspectContainer(name, signal),
    );
  }

  inspectVolume(name: string, signal?: AbortSignal): Promise<VolumeInspect> {
    return this.#json(
      `/volumes/${encodeURIComponent(name)}`,
      "volume inspect",
      "volume",
      signal,
      () => this.fallback.inspectVolume(name, signal),
    );
  }

  inspectImage(ref: string, signal?: AbortSignal): Promise<ImageInspect> {
    return this.#json(
      `/images/${ref.split("/").map(encodeURIComponent).join("/")}/json`,
      "image inspect",
      "image",
      signal,
      () => this.fallback.inspectImage(ref, signal),
    );
  }

  async startContainer(name: string, signal?: AbortSignal): Promise<void> {
    const response = await this.#request(
      "POST",
      `/containers/${encodeURIComponent(name)}/start`,
      undefined,
      { signal },
    );
    if (!response) return await this.fallback.startContainer(name, signal);
    // 304: already running.
    if (response.status !== 204 && response.status !== 304) {
      throw errorOf(response, "start", "container");
    }
  }

  async removeContainer(
    name: string,
    options: { volumes?: boolean; signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<void> {
    const response = await this.#request(
      "DELETE",
      `/containers/${encodeURIComponent(name)}?force=1&v=${options.volumes ? 1 : 0}`,
      undefined,
      options,
    );
    if (!response) return await this.fallback.removeContainer(name, options);
    if (response.status !== 204) throw errorOf(response, "rm", "container");
  }

  async removeVolume(
    name: string,
    options: { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<void> {
    const response = await this.#request(
      "DELETE",
      `/volumes/${encodeURIComponent(name)}`,
      undefined,
      options,
    );
    if (!response) return await this.fallback.removeVolume(name, options);
    if (response.status !== 204) throw errorOf(response, "volume rm", "volume");
  }

  async createVolume(
    name: string,
    labels: Record<string, string>,
    driverOptions: Record<string, string> = {},
    signal?: AbortSignal,
  ): Promise<void> {
    const response = await this.#request(
      "POST",
      "/volumes/create",
      { Name: name, Labels: labels, DriverOpts: driverOptions },
      { signal },
    );
    if (!response) return await this.fallback.createVolume(name, labels, driverOptions, signal);
    if (response.status !== 201 && response.status !== 200) {
      throw errorOf(response, "volume create", undefined);
    }
  }

  exec(request: ExecRequest, options: SpawnOptions = {}): ExecChild {
    return this.cli.execChild(request, options);
  }
}
