/**
 * The relay (DESIGN.md targets: ≤ 1 ms p50 added per LLM request over the relay vs today's path;
 * egress through the relay ≥ 0.8× a direct container download; 64 concurrent connections with
 * fair progress).
 *
 * Four paths from inside a container, to one server (a process of its own):
 * - direct: an ordinary container on a network the bench creates, straight to the server at the
 *   host's address on that network (no proxy);
 * - TCP proxy (the transport before the relay): the same container through the credential and
 *   egress proxies listening on TCP at that address (`startHostProxies`);
 * - socket: a real sandbox (network none) through its session (`openSession`): the relay inside
 *   connects to the proxies' Unix sockets, bind-mounted into the sandbox (a local engine);
 * - stream: the same sandbox through a second session kept to the exec stream
 *   (`relayTransport: "stream"`, what a remote engine gets): relay inside, `docker exec` stdio,
 *   the proxies on Unix sockets.
 * Baselines: the socket path against direct (the download target), the stream path against raw
 * `docker exec -i` stdio (its own transport's ceiling). The same client runs in each (a Deno
 * script for requests, curl for downloads), rounds interleaved so that drift hits every path
 * alike.
 */
import { relayTransportFor } from "../lib/sandbox/providers.ts";
import type { BenchContext, Benchmark, BenchResult, Figure } from "./main.ts";
import { parseConfig, resolveProfile } from "../lib/config.ts";
import { KeyStore } from "../lib/keys.ts";
import { Redactor } from "../lib/redact.ts";
import { openSession, type SandboxSession, startHostProxies } from "../lib/proxy/session.ts";
import { DockerSandboxProvider } from "../lib/sandbox/docker_provider.ts";
import { imageTagFor } from "../lib/sandbox/image.ts";
import { run, spawn } from "../lib/process.ts";
import { removeProfile } from "../tests/_helpers.ts";

const LATENCY_WARMUP = 30;
const LATENCY_ROUNDS = 6;
const LATENCY_PER_ROUND = 50;
const DOWNLOAD_BYTES = 256 * 1024 * 1024;
const DOWNLOAD_ROUNDS = 3;
const CONCURRENT = 64;
const CONCURRENT_BYTES = 16 * 1024 * 1024;
const ADDED_P50_TARGET_MS = 1;
const DOWNLOAD_RATIO_TARGET = 0.8;
/** The stream path against its own transport, raw `docker exec -i` stdio. */
const STREAM_RATIO_TARGET = 0.8;
const FAIRNESS_TARGET = 0.9;

const KEY_ENV = "SANDBOX_BENCH_RELAY_KEY";
const KEY = `sk-bench-${crypto.randomUUID().replaceAll("-", "")}`;
const COMPLETION = new TextEncoder().encode(JSON.stringify({
  id: "chatcmpl-bench",
  object: "chat.completion",
  created: 0,
  model: "bench-model",
  choices: [{
    index: 0,
    message: { role: "assistant", content: "Hello from the bench upstream." },
    finish_reason: "stop",
  }],
  usage: { prompt_tokens: 12, completion_tokens: 7, total_tokens: 19 },
}));
const BLOCK = new Uint8Array(1024 * 1024).fill(97);

/** The in-container client: `latency URL TOKEN N` prints the N request times in ms as JSON. */
const CLIENT = `
const [mode, url, token, count] = Deno.args;
const body = JSON.stringify({ model: "bench-model", messages: [{ role: "user", content: "List the files and summarise the README." }] });
const times = [];
for (let i = 0; i < Number(count); i++) {
  const started = performance.now();
  const response = await fetch(url, { method: "POST", body, headers: { authorization: "Bearer " + token, "content-type": "application/json" } });
  await response.arrayBuffer();
  if (response.status !== 200) { console.error("status " + response.status); Deno.exit(1); }
  times.push(performance.now() - started);
}
console.log(JSON.stringify(times));
`;

/**
 * The upstream server: `/file?bytes=N` streams N bytes, anything else is an LLM completion for
 * the key in `$KEY`. It runs in a process of its own, as an upstream does: in this one, its work
 * would compete with the host proxies' for one JavaScript thread, a cost a real upstream never
 * puts on the sandbox's host (and the direct path would not pay, its proxies being idle).
 */
const SERVER = `
const BLOCK = new Uint8Array(1024 * 1024).fill(97);
const COMPLETION = new TextEncoder().encode(Deno.env.get("COMPLETION"));
const KEY = Deno.env.get("KEY");
const handler = async (req) => {
  const url = new URL(req.url);
  if (url.pathname === "/file") {
    const total = Number(url.searchParams.get("bytes"));
    let sent = 0;
    // The same block each time (never written to), so that the server's own cost stays small:
    // a fresh megabyte per chunk (page faults, zeroing, a copy) made it the bottleneck.
    return new Response(
      new ReadableStream({
        pull(controller) {
          const size = Math.min(BLOCK.length, total - sent);
          if (size <= 0) return controller.close();
          controller.enqueue(size === BLOCK.length ? BLOCK : BLOCK.subarray(0, size));
          sent += size;
        },
      }),
      { headers: { "content-length": String(total) } },
    );
  }
  if (req.headers.get("authorization") !== "Bearer " + KEY) return new Response("bad key", { status: 401 });
  await req.arrayBuffer();
  return new Response(COMPLETION, { headers: { "content-type": "application/json" } });
};
let port = 0;
for (const hostname of Deno.args) port = Deno.serve({ hostname, port, onListen: () => {} }, handler).addr.port;
console.log(port);
`;

/** One server process, two addresses: loopback (for the proxies) and the bench network's gateway (direct). */
async function benchServer(
  hostnames: string[],
  dir: string,
): Promise<{ port: number } & AsyncDisposable> {
  await Deno.writeTextFile(`${dir}/server.js`, SERVER);
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--no-config",
      `--allow-net=${hostnames.join(",")}`,
      "--allow-env=KEY,COMPLETION",
      `${dir}/server.js`,
      ...hostnames,
    ],
    env: { KEY, COMPLETION: new TextDecoder().decode(COMPLETION) },
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let line = "";
  while (!line.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the bench server exited before listening");
    line += value;
  }
  reader.releaseLock();
  return {
    port: Number(line.trim()),
    [Symbol.asyncDispose]: async () => {
      child.kill("SIGTERM");
      await child.status;
      await child.stdout.cancel().catch(() => {});
    },
  };
}

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

function median(values: number[]): number {
  return percentile(values, 50);
}

/** Jain's fairness index of per-connection throughputs: 1 when all are equal, 1/n when one has all. */
function jain(values: number[]): number {
  const sum = values.reduce((a, b) => a + b, 0);
  const squares = values.reduce((a, b) => a + b * b, 0);
  return (sum * sum) / (values.length * squares);
}

type Path = "direct" | "tcp" | "socket" | "stream";
const SANDBOX_PATHS = ["socket", "stream"] as const;

/** p50 time for one byte to go into `docker exec -i CONTAINER cat` and come back. */
async function execRoundTrip(container: string, signal: AbortSignal): Promise<number> {
  const feed = new TransformStream<Uint8Array, Uint8Array>();
  const child = spawn(["docker", "exec", "-i", container, "cat"], { stdin: feed.readable, signal });
  const writer = feed.writable.getWriter();
  const reader = child.stdout.getReader();
  const times: number[] = [];
  for (let i = 0; i < 220; i++) {
    const started = performance.now();
    await writer.write(new Uint8Array([i & 0xff]));
    const { done } = await reader.read();
    if (done) throw new Error("cat ended early");
    if (i >= 20) times.push(performance.now() - started);
  }
  reader.releaseLock();
  await writer.close();
  await child.finished;
  return median(times);
}

/**
 * MB/s of raw `docker exec -i` stdio from this process into the container (the direction a
 * download takes through the stream): `bytes` written here, counted by `wc -c` inside.
 */
async function rawExecRate(container: string, bytes: number, signal: AbortSignal): Promise<number> {
  const feed = new TransformStream<Uint8Array, Uint8Array>();
  const child = spawn(["docker", "exec", "-i", container, "sh", "-c", "exec wc -c"], {
    stdin: feed.readable,
    signal,
  });
  const counted = new Response(child.stdout).text();
  const writer = feed.writable.getWriter();
  const started = performance.now();
  for (let sent = 0; sent < bytes; sent += BLOCK.length) await writer.write(BLOCK.slice());
  await writer.close();
  const received = Number((await counted).trim());
  const rate = received / ((performance.now() - started) * 1000);
  await child.finished;
  if (received !== bytes) throw new Error(`raw docker exec carried ${received} of ${bytes} bytes`);
  return rate;
}

/** Everything the measurements use, made by `setUp`; each piece is undone by `cleanups`. */
interface Rig {
  provider: DockerSandboxProvider;
  gateway: string;
  port: number;
  /** A shell command in the container of `path`, with that path's proxy variables; its stdout. */
  sh(path: Path, script: string): Promise<string>;
  /** The LLM endpoint and the token to present, per path. */
  llm: Record<Path, { url: string; token: string }>;
}

const PATHS: Path[] = ["direct", "tcp", "socket", "stream"];

function byPath<T>(make: (path: Path) => T): Record<Path, T> {
  return Object.fromEntries(PATHS.map((p) => [p, make(p)])) as Record<Path, T>;
}

async function run_(context: BenchContext): Promise<BenchResult> {
  const stateDir = await Deno.makeTempDir({ prefix: "sandbox-bench-relay-" });
  // Undone last to first, each whatever happened to the others.
  const cleanups: (() => Promise<unknown>)[] = [() => Deno.remove(stateDir, { recursive: true })];
  try {
    const rig = await setUp(context, stateDir, cleanups);
    const latency = await measureLatency(rig, context);
    const downloads = await measureDownloads(rig, context);
    const many = await measureConcurrent(rig, context);
    return {
      figures: relayFigures(latency, downloads, many),
      notes: relayNotes(latency, downloads, many),
    };
  } finally {
    // A bench that fails to clean up leaves a container or network named sandbox-bench-*; the
    // measurement it reported (or the error it raised) is what counts here.
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
  }
}

/**
 * The bench network, the upstream server on its gateway and loopback, the sandbox with its two
 * sessions (socket, stream), the TCP proxies, and the ordinary container on the network.
 */
async function setUp(
  context: BenchContext,
  stateDir: string,
  cleanups: (() => Promise<unknown>)[],
): Promise<Rig> {
  const { signal } = context;
  const suffix = crypto.randomUUID().slice(0, 8);
  const network = `sandbox-bench-${suffix}`;
  const ordinary = `sandbox-bench-direct-${suffix}`;
  const profileName = `bench-relay-${suffix}`;
  const docker = async (...args: string[]) => {
    const result = await run(["docker", ...args], { signal, timeoutMs: 600_000 });
    if (result.exitCode !== 0) {
      throw new Error(`docker ${args.slice(0, 3).join(" ")} failed: ${result.stderr}`);
    }
    return result.stdout.trim();
  };
  await docker("network", "create", network);
  cleanups.push(() => run(["docker", "network", "rm", network]));
  const gateway = await docker(
    "network",
    "inspect",
    network,
    "--format",
    "{{(index .IPAM.Config 0).Gateway}}",
  );
  const server = await benchServer(["127.0.0.1", gateway], stateDir);
  cleanups.push(async () => await server[Symbol.asyncDispose]());
  const port = server.port;
  const profile = benchProfile(profileName, port);
  const redactor = new Redactor();
  const keys = new KeyStore({ redactor, env: (name) => (name === KEY_ENV ? KEY : undefined) });
  const provider = new DockerSandboxProvider(profile, { onProgress: context.progress });
  cleanups.push(() => removeProfile(profileName));
  context.progress("starting the sandbox and its two sessions (socket, stream)");
  await provider.ensureRunning({ signal });
  const accessLogPath = `${stateDir}/access.ndjson`;
  const sessions = {} as Record<typeof SANDBOX_PATHS[number], SandboxSession>;
  for (const path of SANDBOX_PATHS) {
    sessions[path] = await openSession(profile, relayTransportFor(provider), {
      keys,
      redactor,
      accessLogPath,
      relayTransport: path === "stream" ? "stream" : "auto",
    });
    cleanups.push(() => sessions[path].close());
    if (sessions[path].relay.transport !== path) {
      throw new Error(
        `the ${path} session's relay uses the ${sessions[path].relay.transport} path`,
      );
    }
  }
  const tcp = await startHostProxies(profile, [gateway], { keys, redactor, accessLogPath });
  cleanups.push(() => tcp.close());

  const image = await imageTagFor(profile.sandbox.image);
  await docker(
    ...["run", "--detach", "--name", ordinary, "--network", network],
    ...["--user", "10001:10001", image, "sleep", "infinity"],
  );
  cleanups.push(() => run(["docker", "rm", "--force", ordinary]));
  await run(["docker", "exec", "-i", ordinary, "sh", "-c", "cat >/tmp/bench-client.js"], {
    stdin: CLIENT,
  });
  await provider.writeFile("/tmp/bench-client.js", CLIENT);
  const tcpEnv = tcp.envFor(gateway);

  const sh = (path: Path, script: string) =>
    shellIn(path, script, { provider, sessions, ordinary, tcpEnv, signal });
  const llm = llmEndpoints(
    `http://${gateway}:${port}/v1`,
    tcp.llmUrl(gateway),
    tcp.token,
    sessions,
  );
  return { provider, gateway, port, sh, llm };
}

/** A shell command in the container of `path`, with that path's proxy variables; its stdout. */
async function shellIn(
  path: Path,
  script: string,
  where: {
    provider: DockerSandboxProvider;
    sessions: Record<typeof SANDBOX_PATHS[number], SandboxSession>;
    ordinary: string;
    tcpEnv: Record<string, string>;
    signal: AbortSignal;
  },
): Promise<string> {
  const { provider, sessions, ordinary, tcpEnv, signal } = where;
  const result = path === "socket" || path === "stream"
    ? await provider.exec(["sh", "-c", script], {
      env: sessions[path].env,
      signal,
      timeoutMs: 600_000,
    })
    : await run([
      "docker",
      "exec",
      ...(path === "tcp" ? Object.entries(tcpEnv).flatMap(([k, v]) => ["--env", `${k}=${v}`]) : []),
      ordinary,
      "sh",
      "-c",
      script,
    ], { signal, timeoutMs: 600_000 });
  if (result.exitCode !== 0) {
    throw new Error(
      `${path}: ${script.slice(0, 60)}… exited ${result.exitCode}: ${result.stderr}`,
    );
  }
  return result.stdout.trim();
}

/** The LLM endpoint and the token to present, per path. */
function llmEndpoints(
  directBase: string,
  tcpBase: string,
  tcpToken: string,
  sessions: Record<typeof SANDBOX_PATHS[number], SandboxSession>,
): Rig["llm"] {
  return {
    direct: { url: `${directBase}/chat/completions`, token: KEY },
    tcp: { url: `${tcpBase}/chat/completions`, token: tcpToken },
    socket: {
      url: `${sessions.socket.env.SANDBOX_LLM_BASE_URL}/chat/completions`,
      token: sessions.socket.token,
    },
    stream: {
      url: `${sessions.stream.env.SANDBOX_LLM_BASE_URL}/chat/completions`,
      token: sessions.stream.token,
    },
  };
}

/** The bench's profile: its LLM is the bench server, and its egress allows only that server. */
function benchProfile(profileName: string, port: number) {
  const loaded = parseConfig(
    [
      "profiles:",
      `  ${profileName}:`,
      `    llm: {provider: custom, base_url: "http://127.0.0.1:${port}/v1", key: {env: ${KEY_ENV}}}`,
      `    sandbox: {network: {mode: allowlist, allow: ["bench.test:${port}"], hosts: {bench.test: 127.0.0.1}}}`,
    ].join("\n"),
    "bench profile",
  );
  if (loaded.kind !== "ok") {
    throw new Error(`bench profile invalid: ${JSON.stringify(loaded.issues)}`);
  }
  return resolveProfile(loaded.config, profileName);
}

interface Latency {
  p50: Record<Path, number>;
  p90: Record<Path, number>;
}

/** 1. Latency per LLM request, keep-alive, sequential, rounds interleaved between the paths. */
async function measureLatency(rig: Rig, context: BenchContext): Promise<Latency> {
  const latencies = async (path: Path, count: number) =>
    JSON.parse(
      await rig.sh(
        path,
        `deno run -A --no-config /tmp/bench-client.js latency '${rig.llm[path].url}' '${
          rig.llm[path].token
        }' ${count}`,
      ),
    ) as number[];
  context.progress(`latency: ${LATENCY_ROUNDS} rounds × ${LATENCY_PER_ROUND} requests per path`);
  for (const path of PATHS) await latencies(path, LATENCY_WARMUP);
  const times = byPath((): number[] => []);
  for (let round = 0; round < LATENCY_ROUNDS; round++) {
    for (const path of PATHS) times[path].push(...await latencies(path, LATENCY_PER_ROUND));
  }
  return {
    p50: byPath((p) => median(times[p])),
    p90: byPath((p) => percentile(times[p], 90)),
  };
}

interface Downloads {
  /** Every round's rate per path, MB/s. */
  rates: Record<Path, number[]>;
  rawRates: number[];
  /** The median rate per path, MB/s. */
  rate: Record<Path, number>;
  rawRate: number;
  rawRoundTrip: number;
}

function fileUrl(rig: Rig, path: Path, bytes: number): string {
  return path === "direct"
    ? `http://${rig.gateway}:${rig.port}/file?bytes=${bytes}`
    : `http://bench.test:${rig.port}/file?bytes=${bytes}`;
}

/**
 * 2. One large download: direct vs through the egress proxy (TCP, socket, stream), and raw
 * `docker exec -i` stdio into the sandbox (the stream path's own ceiling), interleaved.
 */
async function measureDownloads(rig: Rig, context: BenchContext): Promise<Downloads> {
  const { signal } = context;
  const download = async (path: Path) =>
    Number(
      await rig.sh(
        path,
        `curl -sS -o /dev/null -w '%{speed_download}' '${fileUrl(rig, path, DOWNLOAD_BYTES)}'`,
      ),
    ) / 1e6;
  context.progress(`download: ${DOWNLOAD_ROUNDS} × ${DOWNLOAD_BYTES / 1024 / 1024} MiB per path`);
  const rates = byPath((): number[] => []);
  const rawRates: number[] = [];
  for (let round = 0; round < DOWNLOAD_ROUNDS; round++) {
    for (const path of PATHS) rates[path].push(await download(path));
    rawRates.push(await rawExecRate(rig.provider.containerName, DOWNLOAD_BYTES, signal));
  }
  return {
    rates,
    rawRates,
    rate: byPath((p) => median(rates[p])),
    rawRate: median(rawRates),
    rawRoundTrip: await execRoundTrip(rig.provider.containerName, signal),
  };
}

interface Concurrent {
  /** All downloads' bytes over the wall time, MB/s. */
  aggregate: number;
  fairness: number;
  slowest: number;
  fastest: number;
}

/** 3. 64 downloads at once: aggregate throughput and fairness between them. */
async function measureConcurrent(
  rig: Rig,
  context: BenchContext,
): Promise<Record<"direct" | typeof SANDBOX_PATHS[number], Concurrent>> {
  context.progress(`${CONCURRENT} concurrent downloads of ${CONCURRENT_BYTES / 1024 / 1024} MiB`);
  const concurrent = async (path: Path): Promise<Concurrent> => {
    const script = `start=$(date +%s%N); for i in $(seq ${CONCURRENT}); do ` +
      `curl -sS -o /dev/null -w '%{size_download} %{time_total}\\n' '${
        fileUrl(rig, path, CONCURRENT_BYTES)
      }' & done; wait; ` +
      `echo "wall $(( ($(date +%s%N) - start) / 1000 ))"`;
    const lines = (await rig.sh(path, script)).split("\n");
    const wallUs = Number(lines.pop()!.split(" ")[1]);
    const each = lines.map((l) => l.split(" ").map(Number)).filter(([size]) =>
      size === CONCURRENT_BYTES
    );
    if (each.length !== CONCURRENT) {
      throw new Error(`${path}: ${each.length} of ${CONCURRENT} downloads completed`);
    }
    return {
      aggregate: (CONCURRENT * CONCURRENT_BYTES) / wallUs, // bytes per µs = MB/s
      fairness: jain(each.map(([size, seconds]) => size / seconds)),
      slowest: Math.max(...each.map(([, s]) => s)),
      fastest: Math.min(...each.map(([, s]) => s)),
    };
  };
  return {
    direct: await concurrent("direct"),
    socket: await concurrent("socket"),
    stream: await concurrent("stream"),
  };
}

function relayFigures(
  latency: Latency,
  downloads: Downloads,
  many: Record<"direct" | typeof SANDBOX_PATHS[number], Concurrent>,
): Figure[] {
  return [...latencyFigures(latency), ...downloadFigures(downloads), ...concurrentFigures(many)];
}

function latencyFigures({ p50, p90 }: Latency): Figure[] {
  const figures: Figure[] = [];
  for (const path of SANDBOX_PATHS) {
    figures.push({
      name: `LLM request p50, ${path} path vs today's TCP proxy`,
      unit: "ms",
      baseline: p50.tcp,
      measured: p50[path],
      better: "lower",
      target: {
        text: `≤ +${ADDED_P50_TARGET_MS} ms`,
        met: p50[path] - p50.tcp <= ADDED_P50_TARGET_MS,
      },
    });
  }
  figures.push(
    {
      name: "LLM request p50, socket path vs direct",
      unit: "ms",
      baseline: p50.direct,
      measured: p50.socket,
      better: "lower",
    },
    {
      name: "LLM request p90, socket path vs direct",
      unit: "ms",
      baseline: p90.direct,
      measured: p90.socket,
      better: "lower",
    },
  );
  return figures;
}

function downloadFigures({ rate, rawRate }: Downloads): Figure[] {
  return [
    {
      name: `download ${DOWNLOAD_BYTES / 1024 / 1024} MiB via egress proxy, socket path vs direct`,
      unit: "MB/s",
      baseline: rate.direct,
      measured: rate.socket,
      better: "higher",
      target: {
        text: `≥ ${DOWNLOAD_RATIO_TARGET}x`,
        met: rate.socket >= DOWNLOAD_RATIO_TARGET * rate.direct,
      },
    },
    {
      name: "download, stream path vs raw docker exec -i stdio",
      unit: "MB/s",
      baseline: rawRate,
      measured: rate.stream,
      better: "higher",
      target: {
        text: `≥ ${STREAM_RATIO_TARGET}x`,
        met: rate.stream >= STREAM_RATIO_TARGET * rawRate,
      },
    },
    {
      name: "download, stream path vs direct",
      unit: "MB/s",
      baseline: rate.direct,
      measured: rate.stream,
      better: "higher",
    },
    {
      name: "download via egress proxy, socket path vs today's TCP",
      unit: "MB/s",
      baseline: rate.tcp,
      measured: rate.socket,
      better: "higher",
    },
  ];
}

function concurrentFigures(
  many: Record<"direct" | typeof SANDBOX_PATHS[number], Concurrent>,
): Figure[] {
  const figures: Figure[] = [];
  for (const path of SANDBOX_PATHS) {
    figures.push(
      {
        name: `${CONCURRENT} concurrent downloads, aggregate, ${path} path`,
        unit: "MB/s",
        baseline: many.direct.aggregate,
        measured: many[path].aggregate,
        better: "higher",
      },
      {
        name: `${CONCURRENT} concurrent downloads, fairness (Jain), ${path} path`,
        unit: "index",
        baseline: many.direct.fairness,
        measured: many[path].fairness,
        better: "higher",
        target: { text: `≥ ${FAIRNESS_TARGET}`, met: many[path].fairness >= FAIRNESS_TARGET },
      },
    );
  }
  return figures;
}

function relayNotes(
  { p50 }: Latency,
  { rates, rawRates, rawRoundTrip }: Downloads,
  many: Record<"direct" | typeof SANDBOX_PATHS[number], Concurrent>,
): string[] {
  const list = (values: number[]) => values.map((r) => r.toFixed(0)).join("/");
  return [
    `paths (one upstream server, in a process of its own): direct = ordinary container → server at the bench network's gateway; TCP proxy = same container → proxies on TCP at the gateway (before the relay); socket = sandbox (network none) → relay → the proxies' Unix sockets, mounted into the sandbox; stream = the same sandbox, a session kept to the exec stream → relay → docker exec stdio → the proxies' Unix sockets`,
    `LLM requests: keep-alive, sequential, ${
      LATENCY_ROUNDS * LATENCY_PER_ROUND
    } per path after ${LATENCY_WARMUP} warm-up, interleaved rounds; p50 direct ${
      p50.direct.toFixed(2)
    } ms, TCP proxy ${p50.tcp.toFixed(2)} ms, socket ${p50.socket.toFixed(2)} ms, stream ${
      p50.stream.toFixed(2)
    } ms`,
    `downloads: curl to /dev/null, median of ${DOWNLOAD_ROUNDS}, interleaved; direct ${
      list(rates.direct)
    }, TCP ${list(rates.tcp)}, socket ${list(rates.socket)}, stream ${
      list(rates.stream)
    }, raw docker exec -i stdio (written here, wc -c inside) ${list(rawRates)} MB/s`,
    `raw docker exec -i stdio round trip (1 byte through cat, p50 of 200): ${
      rawRoundTrip.toFixed(3)
    } ms`,
    `${CONCURRENT} at once: slowest/fastest connection ${many.direct.slowest.toFixed(2)}/${
      many.direct.fastest.toFixed(2)
    } s direct, ${many.socket.slowest.toFixed(2)}/${many.socket.fastest.toFixed(2)} s socket, ${
      many.stream.slowest.toFixed(2)
    }/${many.stream.fastest.toFixed(2)} s stream`,
  ];
}

export const benchmark: Benchmark = {
  name: "relay",
  title: "in-container requests and downloads: sandbox over the relay vs an ordinary container",
  baselineLabel: "baseline",
  measuredLabel: "sandbox",
  run: run_,
};
