/**
 * The relay: runs inside the sandbox, which has no network of its own (only `lo`).
 *
 * ```
 * deno run --allow-net=127.0.0.1 --no-config relay.js [--wait] llm=19080 egress=19081 [git=19082]
 * ```
 *
 * It listens on 127.0.0.1 at the given ports, one per host service, and carries every connection
 * it accepts as a stream over its own stdin/stdout (the stdio of the one `docker exec -i` the host
 * keeps open for the session), framed by lib/proxy/mux.ts. It holds no secret and decides nothing:
 * the proxies on the host check every request. When its stdin ends (the host went away) it exits
 * at once, which closes every connection it carried.
 *
 * Exit codes: 0 the host closed the stream; 1 the stream broke; 2 usage; 75 a port is in use.
 * With `--wait`, a port in use is retried for a moment first: a relay restarted by the host may
 * race its predecessor's exit.
 * `--check` loads the module and exits 0 (the image build warms Deno's cache with it).
 */
import { ChunkReader, Mux, pipeStream } from "../lib/proxy/mux.ts";

/** How long a port in use is retried with `--wait`. */
const LISTEN_RETRY_MS = 2_000;
const EXIT_TEMPFAIL = 75;

function fail(message: string, code: number): never {
  Deno.stderr.writeSync(new TextEncoder().encode(`sandbox relay: ${message}\n`));
  Deno.exit(code);
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

async function writeStdout(bytes: Uint8Array): Promise<void> {
  let rest = bytes;
  while (rest.length > 0) rest = rest.subarray(await Deno.stdout.write(rest));
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
  const wait = args[0] === "--wait";
  const services = parseServices(wait ? args.slice(1) : args);
  const listeners = await Promise.all(services.map(([, port]) => listen(port, wait)));
  const input = new ChunkReader((buffer) => Deno.stdin.read(buffer));
  const mux = new Mux({ role: "relay", input, output: writeStdout });
  services.forEach(([service], i) => void serve(mux, listeners[i], service).catch(() => {}));
  mux.sendReady();
  const error = await mux.done;
  if (error) fail(`the stream to the host broke: ${error.message}`, 1);
  Deno.exit(0);
}

await main(Deno.args);
