/**
 * The relay: runs inside the sandbox, which has no network of its own (only `lo`).
 *
 * ```
 * deno run --allow-net=127.0.0.1 --no-config relay.js [--wait] [--sockets DIR] llm=19080 egress=19081 [git=19082]
 * ```
 *
 * It listens on 127.0.0.1 at the given ports, one per host service, and carries every connection
 * it accepts as a stream over its own stdin/stdout (the stdio of the one `docker exec -i` the host
 * keeps open for the session), framed by lib/proxy/mux.ts. It holds no secret and decides nothing:
 * the proxies on the host check every request. When its stdin ends (the host went away) it exits
 * at once, which closes every connection it carried.
 *
 * With `--sockets DIR` (a local engine: the host bind-mounted its proxies' socket directory into
 * the sandbox, read-only), it first connects once to `DIR/SERVICE.sock` of every service; when all
 * answer, it carries each connection to its service's socket itself, one socket connection per
 * TCP connection, and says so in READY (`socket`): no framing, no copy through the exec stream,
 * which then only keeps the relay's lifetime. When any does not (a remote engine, a VM between
 * the engine and this machine, a container made without the mount), it uses the stream as above.
 * Deno asks for net, read and write access to each socket's path (relay_host.ts `relayPermissions`).
 *
 * With `--spare` (socket path only, started detached ahead of the session that will use it:
 * lib/proxy/spare_relay.ts), it listens at once and carries connections to `DIR`'s sockets as
 * above, but its stdin is nothing: it waits for `DIR/control.sock` to appear (the session that
 * claims it made its sockets there), connects to it and says the key it was given in
 * `$SANDBOX_RELAY_KEY` (which no process of the sandbox user can read: the relay is another uid),
 * and serves until the host closes that connection. The session's first relay is then ready in a
 * millisecond instead of the ~100 ms a relay takes to start. When the host's last words on it were
 * `again` (the session passed the relay on to the container's next one), it closes every
 * connection it carried for that session and waits for the next control socket; otherwise it exits.
 *
 * Exit codes: 0 the host closed the stream (or the control connection); 1 the stream broke; 2
 * usage; 75 a port is in use.
 * With `--wait`, a port in use is retried for a moment first: a relay restarted by the host may
 * race its predecessor's exit.
 * `--check` loads the module and exits 0 (the image build warms Deno's cache with it).
 */
import { ChunkReader, Mux, pipeStream, type RelayTransport } from "../lib/proxy/mux.ts";

/** How long a port in use is retried with `--wait`. */
const LISTEN_RETRY_MS = 2_000;
const EXIT_TEMPFAIL = 75;
/**
 * The stream from the host is read in chunks of up to this much. A pipe holds 64 KiB unless it is
 * made bigger (below), and every read of stdin costs Deno a thread hop and three system calls:
 * when the relay falls behind, a big pipe lets it catch up in a few large reads.
 */
const STDIN_READ_BYTES = 1024 * 1024;
/** `fcntl(2)`: set a pipe's capacity (Linux). */
const F_SETPIPE_SZ = 1031;
/** Socket path: reads start this big and double while they fill the buffer, up to the max. */
const PIPE_MIN_BYTES = 64 * 1024;
const PIPE_MAX_BYTES = 1024 * 1024;

function fail(message: string, code: number): never {
  Deno.stderr.writeSync(new TextEncoder().encode(`sandbox relay: ${message}\n`));
  Deno.exit(code);
}

/** The sockets' directory file the host makes when it claims a spare relay. */
const CONTROL_SOCKET = "control.sock";
/** The environment variable that carries a spare relay's key. */
const KEY_ENV = "SANDBOX_RELAY_KEY";

function parseArgs(
  args: string[],
): { wait: boolean; spare: boolean; sockets?: string; services: [string, number][] } {
  let rest = args;
  const wait = rest[0] === "--wait";
  if (wait) rest = rest.slice(1);
  const spare = rest[0] === "--spare";
  if (spare) rest = rest.slice(1);
  let sockets: string | undefined;
  if (rest[0] === "--sockets") {
    sockets = rest[1];
    if (!sockets || !/^\/[A-Za-z0-9._/-]{1,200}$/.test(sockets)) {
      fail(`invalid socket directory "${sockets}"`, 2);
    }
    rest = rest.slice(2);
  }
  if (spare && sockets === undefined) fail("--spare needs --sockets DIR", 2);
  return { wait, spare, sockets, services: parseServices(rest) };
}

function parseServices(args: string[]): [service: string, port: number][] {
  const services: [string, number][] = [];
  for (const arg of args) {
    const match = /^([a-z]{1,16})=(\d{1,5})$/.exec(arg);
    if (!match || Number(match[2]) < 1 || Number(match[2]) > 65_535) {
      fail(`invalid argument "${arg}"`, 2);
    }
    services.push([match[1], Number(match[2])]);
  }
  if (services.length === 0) fail("usage: relay.js SERVICE=PORT...", 2);
  return services;
}

async function listen(port: number, wait: boolean): Promise<Deno.TcpListener> {
  const deadline = Date.now() + (wait ? LISTEN_RETRY_MS : 0);
  while (true) {
    try {
      return Deno.listen({ hostname: "127.0.0.1", port });
    } catch (error) {
      if (!(error instanceof Deno.errors.AddrInUse) || Date.now() >= deadline) {
        fail(
          `cannot listen on 127.0.0.1:${port}: ${error instanceof Error ? error.name : error}`,
          EXIT_TEMPFAIL,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

/**
 * Make the pipe on stdin hold `STDIN_READ_BYTES` (Linux's limit for an unprivileged process),
 * through libc; best effort: without `--allow-ffi`, libc or a pipe, the relay works as it is.
 */
function enlargeStdinPipe(): void {
  try {
    const libc = Deno.dlopen("libc.so.6", {
      fcntl: { parameters: ["i32", "i32", "i32"], result: "i32" },
    });
    libc.symbols.fcntl(0, F_SETPIPE_SZ, STDIN_READ_BYTES);
    libc.close();
  } catch {
    // Not Linux, no libc.so.6, no permission: 64 KiB it is.
  }
}

async function writeStdout(bytes: Uint8Array): Promise<void> {
  let rest = bytes;
  while (rest.length > 0) rest = rest.subarray(await Deno.stdout.write(rest));
}

/** Every service's socket in `dir` takes a connection (then closed unused). */
async function socketsAnswer(dir: string, services: string[]): Promise<boolean> {
  for (const service of services) {
    try {
      (await Deno.connect({ transport: "unix", path: `${dir}/${service}.sock` })).close();
    } catch {
      return false;
    }
  }
  return true;
}

/**
 * The connections a spare relay carries for the session that holds it: all closed when that
 * session ends, so that nothing one session's agent opened is carried on into the next one's.
 */
class Carried {
  #session = 0;
  readonly #conns = new Set<Deno.Conn>();

  /** The session a connection accepted now belongs to. */
  get session(): number {
    return this.#session;
  }

  /** Track `conns` for `session`; false (and closed) when that session has ended meanwhile. */
  add(session: number, ...conns: Deno.Conn[]): boolean {
    if (session !== this.#session) {
      for (const conn of conns) close(conn);
      return false;
    }
    for (const conn of conns) this.#conns.add(conn);
    return true;
  }

  remove(...conns: Deno.Conn[]): void {
    for (const conn of conns) this.#conns.delete(conn);
  }

  /** End the session: close everything it carried; what is accepted from now on is the next's. */
  endSession(): void {
    this.#session++;
    for (const conn of this.#conns) close(conn);
    this.#conns.clear();
  }
}

/** Socket path: each accepted connection gets its own connection to the service's socket. */
async function serveSocket(
  listener: Deno.TcpListener,
  path: string,
  carried?: Carried,
): Promise<void> {
  for await (const conn of listener) {
    conn.setNoDelay(true);
    const session = carried?.session ?? 0;
    if (carried && !carried.add(session, conn)) continue;
    Deno.connect({ transport: "unix", path }).then(
      async (upstream) => {
        if (carried && !carried.add(session, upstream)) return;
        await splice(conn, upstream);
        carried?.remove(conn, upstream);
      },
      () => {
        close(conn);
        carried?.remove(conn);
      },
    );
  }
}

/** Copy both ways until both have ended; a half-close is passed on, a failure ends both. */
async function splice(a: Deno.Conn, b: Deno.Conn): Promise<void> {
  const copies = [copy(a, b), copy(b, a)];
  try {
    await Promise.all(copies);
  } catch {
    // One side failed: end both, so that the other direction does not wait for ever.
  }
  close(a);
  close(b);
  await Promise.allSettled(copies);
}

async function copy(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  let buffer = new Uint8Array(PIPE_MIN_BYTES);
  while (true) {
    const n = await from.read(buffer);
    if (n === null) break;
    let rest = buffer.subarray(0, n);
    while (rest.length > 0) rest = rest.subarray(await to.write(rest));
    // A full read: the next one takes more at once (a download), up to the max.
    if (n === buffer.length && n < PIPE_MAX_BYTES) buffer = new Uint8Array(n * 2);
  }
  await to.closeWrite();
}

function close(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // Already closed.
  }
}

async function serve(mux: Mux, listener: Deno.TcpListener, service: string): Promise<void> {
  for await (const conn of listener) {
    conn.setNoDelay(true);
    const stream = mux.open(service);
    if (!stream) {
      conn.close();
      continue;
    }
    // One connection's failure (its peer reset it, the session ended) ends that connection only.
    pipeStream(stream, conn).catch(() => {});
  }
}

/**
 * A spare relay's wait for its session: `dir/control.sock`, watched for (inotify: an idle spare
 * costs nothing), then connected to and told the key. The connection, or null when `dir` went
 * away (its container's sessions were cleaned up).
 */
async function awaitControl(dir: string, key: string): Promise<Deno.UnixConn | null> {
  const path = `${dir}/${CONTROL_SOCKET}`;
  const watcher = Deno.watchFs(dir, { recursive: false });
  try {
    // Made before the watch began: no event will say so.
    const tryConnect = async () => {
      try {
        return await Deno.connect({ transport: "unix", path });
      } catch {
        return undefined;
      }
    };
    let conn = await tryConnect();
    if (!conn) {
      for await (const event of watcher) {
        if (event.kind === "remove" && event.paths.includes(dir)) return null;
        if (!event.paths.some((p) => p.endsWith(`/${CONTROL_SOCKET}`))) continue;
        if ((conn = await tryConnect())) break;
      }
    }
    if (!conn) return null;
    let rest = new TextEncoder().encode(`${key}\n`);
    while (rest.length > 0) rest = rest.subarray(await conn.write(rest));
    return conn;
  } catch {
    return null;
  } finally {
    watcher.close();
  }
}

/** What the host says on a control connection, just before closing it, to keep the relay. */
const AGAIN = "again\n";

/**
 * Read `control` to its end: true when all the host said was `again` (serve the next session),
 * false for anything else, a reset included (the session closed without passing the relay on,
 * or its process is gone).
 */
async function controlEnd(control: Deno.UnixConn): Promise<boolean> {
  const said = new Uint8Array(AGAIN.length + 1);
  let filled = 0;
  const scratch = new Uint8Array(64);
  try {
    while (true) {
      const n = await control.read(scratch);
      if (n === null) break;
      const room = Math.min(n, said.length - filled);
      said.set(scratch.subarray(0, room), filled);
      filled += n;
    }
  } catch {
    return false;
  } finally {
    close(control);
  }
  return filled === AGAIN.length && new TextDecoder().decode(said.subarray(0, filled)) === AGAIN;
}

/** A spare relay: listen now, carry to the sockets, serve each session from its claim to its end. */
async function serveSpare(dir: string, services: [string, number][]): Promise<never> {
  const key = Deno.env.get(KEY_ENV) ?? "";
  if (!/^[0-9a-f]{32,128}$/.test(key)) fail(`no key in ${KEY_ENV}`, 2);
  // The key is not left where a child could inherit it (the relay starts none, but still).
  Deno.env.delete(KEY_ENV);
  // Started as the session before it ends: its relay may not have let go of the ports yet.
  const listeners = await Promise.all(services.map(([, port]) => listen(port, true)));
  const carried = new Carried();
  // A listener that fails is closed: the spare exits with its control socket (below).
  services.forEach(([service], i) =>
    void serveSocket(listeners[i], `${dir}/${service}.sock`, carried).catch(() => {})
  );
  while (true) {
    const control = await awaitControl(dir, key);
    if (!control) Deno.exit(0);
    const again = await controlEnd(control);
    carried.endSession();
    if (!again) Deno.exit(0);
  }
}

async function main(args: string[]): Promise<never> {
  // The image build's check: exit on the next turn, once this module's evaluation is complete,
  // so that Deno writes its V8 code cache into the image's cache (an exit inside the evaluation
  // leaves none, and every relay start would compile the relay again).
  if (args[0] === "--check") {
    setTimeout(() => Deno.exit(0), 0);
    return await new Promise<never>(() => {});
  }
  const { wait, spare, sockets, services } = parseArgs(args);
  if (spare) return await serveSpare(sockets!, services);
  const transport: RelayTransport = sockets !== undefined &&
      await socketsAnswer(sockets, services.map(([service]) => service))
    ? "socket"
    : "stream";
  const listeners = await Promise.all(services.map(([, port]) => listen(port, wait)));
  const input = new ChunkReader((buffer) => Deno.stdin.read(buffer), STDIN_READ_BYTES);
  const mux = new Mux({ role: "relay", input, output: writeStdout });
  // A listener that fails is closed: its service's connections are refused, which the agent sees.
  services.forEach(([service], i) =>
    void (transport === "socket"
      ? serveSocket(listeners[i], `${sockets}/${service}.sock`)
      : serve(mux, listeners[i], service)).catch(() => {})
  );
  mux.sendReady(transport);
  // Only the stream path carries the connections' bytes on stdin; the pipe is made bigger after
  // READY, which loading FFI would otherwise delay (~20 ms of every run's and exec's start).
  if (transport === "stream") enlargeStdinPipe();
  const error = await mux.done;
  if (error) fail(`the stream to the host broke: ${error.message}`, 1);
  Deno.exit(0);
}

await main(Deno.args);
