/**
 * The host end of the relay: how a sandbox with no network reaches the proxies of its session.
 *
 * The relay inside the sandbox (relay/main.ts) listens on fixed loopback ports and carries each
 * connection as a stream over the stdio of one long-lived exec (lib/proxy/mux.ts). Here, each
 * stream the relay opens for a service we serve is piped to that proxy's Unix socket; nothing
 * else is reachable through it. The relay is untrusted (it runs in the agent's container; as a uid
 * of its own, which the agent cannot ptrace or signal, but the agent can start relays of its own,
 * and its input is the agent's): every frame is checked by the mux, and anything malformed ends the
 * mux — and with it that relay — never this process.
 *
 * With `sandboxSocketDir` (a local engine, whose sandbox has the proxies' socket directory
 * bind-mounted read-only at that path), the relay is asked to carry connections to those sockets
 * itself instead (`--sockets`); it does when it can reach them, and says which in READY
 * (`transport`). The stream is then only the relay's lifetime; the proxies check every
 * connection the same way, whichever path it came by.
 *
 * When the exec ends for any reason (relay killed, container restarted, exec client killed,
 * protocol error), every connection it carried fails at once and a new relay is started on the
 * same ports, so the URLs the sandbox was given keep working.
 */
import { Mux, type MuxStream, pipeStream, type RelayTransport } from "./mux.ts";
import { SandboxError } from "../errors.ts";
import { type Child, spawn, type SpawnOptions } from "../process.ts";

/** The services a relay may carry, and their port offsets from the session's base port. */
export const RELAY_SERVICES = { llm: 0, egress: 1, git: 2 } as const;
export type RelayService = keyof typeof RELAY_SERVICES;
/** Ports inside the sandbox: 19080 credential proxy, 19081 egress proxy, 19082 git proxy. */
export const DEFAULT_RELAY_BASE_PORT = 19080;
/** When a base is taken (another session's relay in the same container), the next is this far up. */
export const BASE_PORT_STEP = 100;
const BASE_PORT_ATTEMPTS = 20;
export const READY_TIMEOUT_MS = 60_000;
/** Relay exit code for "a port stayed in use". */
const EXIT_PORT_IN_USE = 75;
/** Delays before successive restart attempts; the last one repeats. */
const RESTART_DELAYS_MS = [0, 100, 250, 500, 1_000];
/** Bytes buffered on their way into the relay's stdin (each side of the copy into the pipe). */
const STDIN_BUFFER_BYTES = 512 * 1024;
/** How long a closed relay gets to exit on its own before its exec is killed. */
const CLOSE_GRACE_MS = 2_000;

/** One started relay process, as the host sees it. */
export interface RelayProcess {
  /** The relay's stdout: frames from it. */
  input: AsyncIterable<Uint8Array>;
  /** Write to the relay's stdin; resolves when taken. */
  output(bytes: Uint8Array): Promise<void>;
  /** End the relay's stdin (it exits when it sees the end). */
  closeInput(): Promise<void>;
  /** Resolves when the process (the exec) has ended. */
  finished: Promise<{ exitCode: number; stderrTail: string }>;
  /** Stop it now (the exec client, and what it ran). */
  kill(): Promise<void>;
}

/**
 * Deno's permission flags for a relay started with `args`: loopback; FFI, to make the pipe on its
 * stdin bigger (relay/main.ts; the relay runs only the image's code: its program and Deno cache are
 * the read-only image's, scripts/sandbox-exec); and with
 * `--sockets DIR` each service's socket there (Deno asks for net access to each socket's exact
 * path, and read and write access to it). A `--spare` relay also watches DIR for its control
 * socket, connects to it, and reads (then forgets) its key from the environment.
 */
export function relayPermissions(args: readonly string[]): string[] {
  const at = args.indexOf("--sockets");
  if (at < 0) return ["--allow-net=127.0.0.1", "--allow-ffi"];
  const dir = args[at + 1];
  const spare = args.includes("--spare");
  const sockets = [
    ...args.flatMap((arg) => /^([a-z]{1,16})=\d+$/.exec(arg)?.[1] ?? []),
    ...(spare ? ["control"] : []),
  ].map((service) => `${dir}/${service}.sock`);
  return [
    `--allow-net=${["127.0.0.1", ...sockets.map((path) => `unix:${path}`)].join(",")}`,
    `--allow-read=${(spare ? [dir] : sockets).join(",")}`,
    `--allow-write=${sockets.join(",")}`,
    ...(spare ? [`--allow-env=${SPARE_KEY_ENV}`] : ["--allow-ffi"]),
  ];
}

/** Where the image keeps the relay (Dockerfile). */
export const RELAY_PATH = "/opt/sandbox/relay.js";

/** The image's relay with `args`, as the exec wrapper runs it (with the image's Deno cache). */
export function relayArgv(args: readonly string[]): string[] {
  return [
    "deno",
    "run",
    "--quiet",
    "--no-config",
    "--no-prompt",
    ...relayPermissions(args),
    RELAY_PATH,
    ...args,
  ];
}

/** The environment variable that carries a spare relay's key (relay/main.ts). */
export const SPARE_KEY_ENV = "SANDBOX_RELAY_KEY";

/** Starts a relay with these arguments (`[--wait] [--sockets DIR] SERVICE=PORT...`). */
export type RelayLauncher = (args: string[]) => RelayProcess;

/**
 * A relay run by `argv` (e.g. `docker exec -i … relay.js`, or `deno run relay/main.ts` in tests),
 * with its stdio as the stream. `kill` also runs `options.kill` (e.g. to end the process tree
 * inside the container, which killing the docker client does not).
 */
export function spawnRelayProcess(
  argv: string[],
  options: {
    kill?: () => Promise<void>;
    spawn?: (argv: string[], options: SpawnOptions) => Child;
  } = {},
): RelayProcess {
  // Some buffering between the mux and the pipe, so that the next batch is ready while one is
  // being written (a write into a pipe ends only when the reader took all of it).
  const stdin = new TransformStream<Uint8Array, Uint8Array>(
    undefined,
    new ByteLengthQueuingStrategy({ highWaterMark: STDIN_BUFFER_BYTES }),
    new ByteLengthQueuingStrategy({ highWaterMark: STDIN_BUFFER_BYTES }),
  );
  const writer = stdin.writable.getWriter();
  const child = (options.spawn ?? spawn)(argv, { stdin: stdin.readable });
  return {
    input: child.stdout,
    output: (bytes) => writer.write(bytes),
    closeInput: () => writer.close(),
    finished: child.finished.then((outcome) => ({
      exitCode: outcome.exitCode,
      stderrTail: outcome.stderrTail,
    })),
    async kill() {
      child.kill();
      await options.kill?.();
    },
  };
}

export interface RelayOptions {
  /** The Unix socket of each service to carry. */
  sockets: Partial<Record<RelayService, string>>;
  /**
   * Where the sandbox sees the directory of those sockets (`SERVICE.sock` in it), when it is
   * bind-mounted there: the relay then connects to them itself if it can.
   */
  sandboxSocketDir?: string;
  launch: RelayLauncher;
  /** First base port to try (default 19080). */
  basePort?: number;
  readyTimeoutMs?: number;
  /** A relay restart or failure, for diagnostics on stderr. */
  onEvent?: (message: string) => void;
  /** Names the sandbox in errors. */
  sandboxName?: string;
}

export interface RelayHost extends AsyncDisposable {
  /** The port of each carried service inside the sandbox (127.0.0.1). */
  readonly ports: Partial<Record<RelayService, number>>;
  /** How many relays have said READY so far (1 after start; more after restarts). */
  readonly starts: number;
  /** How the current relay carries connections: the exec stream, or the mounted sockets. */
  readonly transport: RelayTransport;
  /** Resolves the next time a relay says READY (after a restart). */
  nextReady(): Promise<void>;
  close(): Promise<void>;
}

type Attempt =
  | { kind: "ready"; process: RelayProcess; mux: Mux; transport: RelayTransport }
  | { kind: "ports_in_use" }
  | { kind: "failed"; message: string; detail: string };

/**
 * Start a relay and wait until it listens (READY), so that nothing in the sandbox races it.
 * Raises `SandboxError` when no relay could be started.
 */
export async function startRelay(options: RelayOptions): Promise<RelayHost> {
  const services = (Object.keys(RELAY_SERVICES) as RelayService[]).filter((s) =>
    options.sockets[s] !== undefined
  );
  if (services.length === 0) throw new TypeError("Cannot start a relay without a service");
  const name = options.sandboxName ?? "sandbox";
  let base = options.basePort ?? DEFAULT_RELAY_BASE_PORT;
  for (let attempt = 0;; attempt++) {
    const ports = portsFor(services, base);
    const outcome = await launchOnce(options, ports);
    if (outcome.kind === "ready") {
      return new LiveRelay(options, ports, launched(outcome), outcome.transport);
    }
    if (outcome.kind === "ports_in_use" && attempt + 1 < BASE_PORT_ATTEMPTS) {
      base += BASE_PORT_STEP;
      continue;
    }
    if (outcome.kind === "ports_in_use") {
      throw new SandboxError(
        "exec_failed",
        `Cannot start the relay in sandbox "${name}": its ports are in use`,
        {
          detail: `Tried ${BASE_PORT_ATTEMPTS} port ranges from ${
            options.basePort ?? DEFAULT_RELAY_BASE_PORT
          }`,
        },
      );
    }
    throw new SandboxError(
      "exec_failed",
      `Cannot start the relay in sandbox "${name}": ${outcome.message}`,
      {
        detail: outcome.detail,
      },
    );
  }
}

/** The ports of `services` from `base` (each at its offset). */
export function portsFor(
  services: RelayService[],
  base: number,
): Partial<Record<RelayService, number>> {
  return Object.fromEntries(services.map((s) => [s, base + RELAY_SERVICES[s]]));
}

/** Launch one relay and wait for READY, its exit, or the timeout. */
async function launchOnce(
  options: RelayOptions,
  ports: Partial<Record<RelayService, number>>,
  restart?: { signal: AbortSignal },
): Promise<Attempt> {
  const signal = restart?.signal;
  // A restart waits for its ports: the relay it replaces may not have released them yet.
  const args = [
    ...(restart ? ["--wait"] : []),
    ...(options.sandboxSocketDir === undefined ? [] : ["--sockets", options.sandboxSocketDir]),
    ...Object.entries(ports).map(([service, port]) => `${service}=${port}`),
  ];
  const process = options.launch(args);
  let transport: RelayTransport = "stream";
  let ready!: (said: RelayTransport) => void;
  const readied = new Promise<"ready">((resolve) => (ready = (said) => {
    transport = said;
    resolve("ready");
  }));
  const opening = new FirstBytes(process.input);
  const mux = new Mux({
    role: "host",
    input: opening,
    output: (bytes) => process.output(bytes),
    services: Object.keys(ports),
    onOpen: (stream, service) => void carry(stream, options.sockets[service as RelayService]!),
    onReady: ready,
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeoutMs = options.readyTimeoutMs ?? READY_TIMEOUT_MS;
  const timedOut = new Promise<"timeout">((
    resolve,
  ) => (timer = setTimeout(() => resolve("timeout"), timeoutMs)));
  let onAbort = () => {};
  const aborted = new Promise<"aborted">((resolve) => {
    onAbort = () => resolve("aborted");
    if (signal?.aborted) onAbort();
    else signal?.addEventListener("abort", onAbort, { once: true });
  });
  const first = await Promise.race([
    readied,
    mux.done.then(() => "ended" as const),
    timedOut,
    aborted,
  ]);
  clearTimeout(timer);
  signal?.removeEventListener("abort", onAbort);
  if (first === "ready") return { kind: "ready", process, mux, transport };
  const muxError = mux.ended ? await mux.done : undefined;
  mux.close();
  await stop(process);
  const ended = await process.finished;
  if (ended.exitCode === EXIT_PORT_IN_USE) return { kind: "ports_in_use" };
  const why = first === "aborted"
    ? "the session closed"
    : first === "timeout"
    ? `it did not answer within ${timeoutMs} ms`
    : muxError
    ? opening.asText() !== undefined
      // Before its first frame, text: what said it was not the relay (the engine, that it could not
      // start it, say), and those words are the reason, not the frame they made no sense as.
      ? `it did not start: ${opening.asText()}`
      : `it broke the protocol (${muxError.message})`
    : `it exited with code ${ended.exitCode} before listening`;
  return { kind: "failed", message: why, detail: ended.stderrTail.trim() };
}

/** A relay's output, passed through, with its first bytes kept to tell text from frames. */
class FirstBytes implements AsyncIterable<Uint8Array> {
  static readonly KEPT = 512;
  #kept = new Uint8Array(0);

  constructor(private readonly input: AsyncIterable<Uint8Array>) {}

  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    for await (const chunk of this.input) {
      if (this.#kept.length < FirstBytes.KEPT) {
        const room = chunk.subarray(0, FirstBytes.KEPT - this.#kept.length);
        const kept = new Uint8Array(this.#kept.length + room.length);
        kept.set(this.#kept);
        kept.set(room, this.#kept.length);
        this.#kept = kept;
      }
      yield chunk;
    }
  }

  /** The first bytes as one line, when they are printable text (no relay frame is). */
  asText(): string | undefined {
    const text = new TextDecoder("utf-8", { fatal: false }).decode(this.#kept).trim();
    return text.length > 0 && /^[\P{Cc}\t\r\n]+$/u.test(text)
      ? text.replace(/\s+/g, " ").slice(0, 300)
      : undefined;
  }
}

/** Close the relay's stdin, give it a moment to exit, then kill it. */
async function stop(process: RelayProcess): Promise<void> {
  // An input that cannot be closed belongs to a relay that is gone already: `finished` says so.
  await process.closeInput().catch(() => {});
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"late">((
    resolve,
  ) => (timer = setTimeout(() => resolve("late"), CLOSE_GRACE_MS)));
  const outcome = await Promise.race([process.finished.then(() => "exited" as const), late]);
  clearTimeout(timer);
  // A kill that fails found the process gone: awaiting `finished` below is what counts.
  if (outcome === "late") await process.kill().catch(() => {});
  await process.finished;
}

/**
 * A relay that is running and serving, however it was started: it has ended when `ended` settles
 * (with the protocol error that ended it, if any); `stop` ends it and what it carried.
 */
export interface RunningRelay {
  ended: Promise<Error | undefined>;
  stop(): Promise<void>;
}

/** A relay this host launched (its exec's stdio the stream, or only its lifetime). */
function launched(outcome: { process: RelayProcess; mux: Mux }): RunningRelay {
  return {
    ended: Promise.race([outcome.mux.done, outcome.process.finished.then(() => undefined)]),
    async stop() {
      outcome.mux.close();
      await stop(outcome.process);
    },
  };
}

/**
 * A relay host whose first relay was started elsewhere and is already serving on `ports` over
 * the mounted sockets (a spare relay the session claimed: lib/proxy/spare_relay.ts). When it ends,
 * relays are launched as `options` says, on the same ports, as after any relay's end.
 */
export function adoptRelay(
  options: RelayOptions,
  ports: Partial<Record<RelayService, number>>,
  first: RunningRelay,
): RelayHost {
  return new LiveRelay(options, ports, first, "socket");
}

/** Pipe one stream to its service's socket; a socket that cannot be reached resets the stream. */
async function carry(stream: MuxStream, socketPath: string): Promise<void> {
  let conn: Deno.UnixConn;
  try {
    conn = await Deno.connect({ transport: "unix", path: socketPath });
  } catch {
    stream.resetStream("the service is not available");
    return;
  }
  // A failure ends this one connection only: pipeStream has reset the stream and closed the
  // socket by then, so the client in the sandbox sees a reset and nothing else is affected.
  await pipeStream(stream, conn).catch(() => {});
}

/** A relay that said READY, restarted on the same ports whenever it ends, until closed. */
class LiveRelay implements RelayHost {
  readonly ports: Partial<Record<RelayService, number>>;
  #starts = 1;
  #transport: RelayTransport;
  #current: RunningRelay | undefined;
  #closing = false;
  #closed: Promise<void> | undefined;
  #waiters: (() => void)[] = [];
  readonly #options: RelayOptions;
  readonly #wake = new AbortController();
  readonly #supervised: Promise<void>;

  constructor(
    options: RelayOptions,
    ports: Partial<Record<RelayService, number>>,
    first: RunningRelay,
    transport: RelayTransport,
  ) {
    this.#options = options;
    this.ports = ports;
    this.#current = first;
    this.#transport = transport;
    this.#supervised = this.#supervise();
  }

  get starts(): number {
    return this.#starts;
  }

  get transport(): RelayTransport {
    return this.#transport;
  }

  nextReady(): Promise<void> {
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /** Wait for the current relay to end; start another; repeat until closed. */
  async #supervise(): Promise<void> {
    let failures = 0;
    while (!this.#closing) {
      const current = this.#current;
      if (current) {
        const error = await current.ended;
        if (this.#closing) return;
        // Whatever ended first, end the rest: every carried connection fails now, not later.
        const stopping = current.stop();
        this.#options.onEvent?.(
          `relay ended${
            error ? ` (${error.message})` : ""
          }; its connections were closed; restarting it`,
        );
        await stopping;
        this.#current = undefined;
      }
      if (this.#closing) return;
      await this.#sleep(RESTART_DELAYS_MS[Math.min(failures, RESTART_DELAYS_MS.length - 1)]);
      if (this.#closing) return;
      const outcome = await launchOnce(this.#options, this.ports, { signal: this.#wake.signal });
      if (outcome.kind === "ready") {
        if (this.#closing) {
          outcome.mux.close();
          await stop(outcome.process);
          return;
        }
        failures = 0;
        this.#current = launched(outcome);
        this.#transport = outcome.transport;
        this.#starts++;
        const waiters = this.#waiters;
        this.#waiters = [];
        for (const wake of waiters) wake();
        continue;
      }
      failures++;
      if (failures === 1 || failures % 30 === 0) {
        this.#options.onEvent?.(
          `cannot restart the relay: ${
            outcome.kind === "failed" ? outcome.message : "its ports are in use"
          }; retrying`,
        );
      }
    }
  }

  #sleep(ms: number): Promise<void> {
    const signal = this.#wake.signal;
    if (ms === 0 || signal.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener("abort", done, { once: true });
    });
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing = true;
      this.#wake.abort();
      await this.#current?.stop();
      await this.#supervised;
    })();
    return this.#closed;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
