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
 * Exit codes: 0 the host closed the stream; 1 the stream broke; 2 usage; 75 a port is in use.
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

function parseArgs(
  args: string[],
): { wait: boolean; sockets?: string; services: [string, number][] } {
  let rest = args;
  const wait = rest[0] === "--wait";
  if (wait) rest = rest.slice(1);
  let sockets: string | undefined;
  if (rest[0] === "--sockets") {
    sockets = rest[1];
    if (!sockets || !/^\/[A-Za-z0-9._/-]{1,200}$/.test(sockets)) {
      fail(`invalid socket directory "${sockets}"`, 2);
    }
    rest = rest.slice(2);
  }
  return { wait, sockets, services: parseServices(rest) };
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

/** Socket path: each accepted connection gets its own connection to the service's socket. */
async function serveSocket(listener: Deno.TcpListener, path: string): Promise<void> {
  for await (const conn of listener) {
    conn.setNoDelay(true);
    Deno.connect({ transport: "unix", path }).then(
      (upstream) => splice(conn, upstream),
      () => close(conn),
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
    pipeStream(stream, conn).catch(() => {});
  }
}

async function main(args: string[]): Promise<never> {
  if (args[0] === "--check") Deno.exit(0);
  const { wait, sockets, services } = parseArgs(args);
  const transport: RelayTransport = sockets !== undefined &&
      await socketsAnswer(sockets, services.map(([service]) => service))
    ? "socket"
    : "stream";
  const listeners = await Promise.all(services.map(([, port]) => listen(port, wait)));
  const input = new ChunkReader((buffer) => Deno.stdin.read(buffer), STDIN_READ_BYTES);
  const mux = new Mux({ role: "relay", input, output: writeStdout });
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
