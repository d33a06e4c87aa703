/**
 * The LLM credential proxy against a direct upstream (DESIGN.md target: ≤ 2 ms p50 added latency
 * per request on loopback, SSE chunks forwarded unbuffered).
 *
 * The proxy is wired as `sandbox proxy` wires it (`startHostProxies`: token check, the real key
 * from a `KeyStore`, an access log on disk). The upstream is a small purpose-built OpenAI-style
 * server on 127.0.0.1 that answers from precomputed bytes and records nothing, so that it costs
 * both paths the same and as little as possible. Client, proxy and upstream share this process;
 * every request is made twice, once straight to the upstream with the key and once through the
 * proxy with the token, interleaved so that drift hits both alike.
 */
import type { BenchContext, Benchmark, BenchResult, Figure } from "./main.ts";
import { parseConfig, resolveProfile } from "../lib/config.ts";
import { KeyStore } from "../lib/keys.ts";
import { Redactor } from "../lib/redact.ts";
import { startHostProxies } from "../lib/proxy/session.ts";
import { MAX_IDLE_UPSTREAMS, startEgressProxy } from "../lib/proxy/egress_proxy.ts";

/** Plain-HTTP requests through the egress proxy, each on a client connection of its own. */
const EGRESS_REQUESTS = 500;
const LATENCY_WARMUP = 50;
const LATENCY_REQUESTS = 500;
const FIRST_CHUNK_WARMUP = 10;
const FIRST_CHUNK_STREAMS = 200;
/** Small events, one per write, as an LLM sends them: per-event cost. */
const STREAM_EVENTS = 5_000;
/** Bulk: 8 MB in writes of 640 events (64,000 bytes): byte throughput. */
const BULK_EVENTS = 80_000;
const BULK_BATCH = 640;
const STREAM_ROUNDS = 5;
const ADDED_P50_TARGET_MS = 2;
/** How long the upstream holds the rest of a stream for the client to see its first event. */
const HOLD_TIMEOUT_MS = 2_000;

const KEY_ENV = "SANDBOX_BENCH_UPSTREAM_KEY";
const KEY = `sk-bench-${crypto.randomUUID().replaceAll("-", "")}`;

const encoder = new TextEncoder();
/** One SSE event of exactly 100 bytes, shaped like an OpenAI chat completion chunk. */
const EVENT = encoder.encode(
  `data: {"choices":[{"index":0,"delta":{"content":"${"x".repeat(44)}"}}]}\n\n`,
);
const DONE = encoder.encode("data: [DONE]\n\n");
const COMPLETION = encoder.encode(JSON.stringify({
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
const REQUEST = {
  model: "bench-model",
  messages: [
    { role: "system", content: "You are a coding agent working in a sandbox." },
    { role: "user", content: "List the files in the repository and summarise the README." },
  ],
};

if (EVENT.byteLength !== 100) {
  throw new Error(`unreachable: a bench event is ${EVENT.byteLength} bytes`);
}

/** What the bench asks the upstream for, in the request body next to the OpenAI fields. */
interface BenchRequest {
  stream?: boolean;
  /** Number of 100-byte events before `[DONE]`. */
  bench_events?: number;
  /** Events per write (default 1). */
  bench_batch?: number;
  /** Hold the stream after the first event until the client releases this id. */
  bench_hold?: string;
}

/** A hold on a stream: the client releases it once it has the first event. */
interface Hold {
  release(): void;
  released: Promise<void>;
  /** True once the upstream gave up waiting: the first event did not reach the client in time. */
  timedOut: boolean;
}

/** A fast OpenAI-style upstream on 127.0.0.1: checks the key, answers from precomputed bytes. */
class BenchUpstream implements AsyncDisposable {
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #holds = new Map<string, Hold>();
  readonly #stopping = new AbortController();

  constructor() {
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (req) => this.#handle(req),
    );
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.#server.addr.port}/v1`;
  }

  /** The hold named `id`, created by whichever side asks first. */
  hold(id: string): Hold {
    let hold = this.#holds.get(id);
    if (hold === undefined) {
      let release!: () => void;
      const released = new Promise<void>((resolve) => (release = resolve));
      hold = { release, released, timedOut: false };
      this.#holds.set(id, hold);
    }
    return hold;
  }

  forget(id: string): void {
    this.#holds.delete(id);
  }

  async #handle(req: Request): Promise<Response> {
    if (req.headers.get("authorization") !== `Bearer ${KEY}`) {
      await req.body?.cancel();
      return Response.json(
        { error: { message: "invalid api key", type: "invalid_request_error" } },
        { status: 401 },
      );
    }
    if (req.method !== "POST" || new URL(req.url).pathname !== "/v1/chat/completions") {
      await req.body?.cancel();
      return Response.json({ error: { message: "no such route" } }, { status: 404 });
    }
    const request = await req.json() as BenchRequest;
    if (!request.stream) {
      return new Response(COMPLETION, { headers: { "content-type": "application/json" } });
    }
    const stream = this.#stream(
      request.bench_events ?? 1,
      request.bench_batch ?? 1,
      request.bench_hold,
    );
    return new Response(stream, {
      headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
    });
  }

  /** `events` events, `batch` per write (one write per pull), then `[DONE]`. */
  #stream(events: number, batch: number, holdId: string | undefined): ReadableStream<Uint8Array> {
    let sent = 0;
    let waited = holdId === undefined;
    const stopping = this.#stopping.signal;
    const batchBytes = new Uint8Array(EVENT.byteLength * batch);
    for (let i = 0; i < batch; i++) batchBytes.set(EVENT, i * EVENT.byteLength);
    return new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        if (sent > 0 && !waited) {
          waited = true;
          await this.#waitForRelease(this.hold(holdId!), stopping);
        }
        if (sent < events) {
          const count = Math.min(batch, events - sent);
          controller.enqueue(batchBytes.slice(0, count * EVENT.byteLength));
          sent += count;
        } else {
          controller.enqueue(DONE.slice());
          controller.close();
        }
      },
    });
  }

  async #waitForRelease(hold: Hold, stopping: AbortSignal): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onStop: (() => void) | undefined;
    const gaveUp = new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        hold.timedOut = true;
        resolve();
      }, HOLD_TIMEOUT_MS);
      onStop = () => resolve();
      if (stopping.aborted) resolve();
      else stopping.addEventListener("abort", onStop, { once: true });
    });
    try {
      await Promise.race([hold.released, gaveUp]);
    } finally {
      clearTimeout(timer);
      stopping.removeEventListener("abort", onStop!);
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#stopping.abort();
    await this.#server.shutdown();
  }
}

/** Where a request goes and how it authenticates. */
interface Endpoint {
  url: string;
  headers: Record<string, string>;
}

/** Nearest-rank percentile of sorted values. */
function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

function sorted(values: readonly number[]): number[] {
  return [...values].sort((a, b) => a - b);
}

function median(values: readonly number[]): number {
  return percentile(sorted(values), 50);
}

async function expectOk(response: Response, what: string): Promise<void> {
  if (response.status === 200) return;
  const text = await response.text();
  throw new Error(`${what}: HTTP ${response.status}: ${text.slice(0, 300)}`);
}

/** One non-streaming request, read to the end; milliseconds. */
async function timeRequest(
  client: Deno.HttpClient,
  endpoint: Endpoint,
  body: string,
): Promise<number> {
  const started = performance.now();
  const response = await fetch(endpoint.url, {
    method: "POST",
    headers: endpoint.headers,
    body,
    client,
  });
  if (response.status !== 200) await expectOk(response, "chat completion");
  await response.arrayBuffer();
  return performance.now() - started;
}

/** A stream of `events` events read to the end, counting bytes and events as they arrive. */
async function readStream(
  client: Deno.HttpClient,
  endpoint: Endpoint,
  events: number,
  batch = 1,
): Promise<{ ms: number; bytes: number; events: number }> {
  const body = JSON.stringify({
    ...REQUEST,
    stream: true,
    bench_events: events,
    bench_batch: batch,
  });
  const started = performance.now();
  const response = await fetch(endpoint.url, {
    method: "POST",
    headers: endpoint.headers,
    body,
    client,
  });
  await expectOk(response, "chat completion stream");
  let bytes = 0;
  let received = 0;
  let previous = 0;
  for await (const chunk of response.body!) {
    bytes += chunk.byteLength;
    // An event ends with a blank line: count "\n\n", including across chunk boundaries.
    for (let i = 0; i < chunk.length; i++) {
      const byte = chunk[i];
      if (byte === 0x0a && previous === 0x0a) received++;
      previous = byte;
    }
  }
  const ms = performance.now() - started;
  if (received !== events + 1) {
    throw new Error(`stream: expected ${events + 1} events, got ${received}`);
  }
  return { ms, bytes, events: received };
}

/**
 * Time to the first event of a stream whose upstream holds everything after it until the client
 * has that event: a proxy that buffered would make the upstream give up waiting.
 */
async function firstEvent(
  client: Deno.HttpClient,
  upstream: BenchUpstream,
  endpoint: Endpoint,
): Promise<{ ms: number; unbuffered: boolean }> {
  const id = crypto.randomUUID();
  const hold = upstream.hold(id);
  try {
    const body = JSON.stringify({ ...REQUEST, stream: true, bench_events: 3, bench_hold: id });
    const started = performance.now();
    const response = await fetch(endpoint.url, {
      method: "POST",
      headers: endpoint.headers,
      body,
      client,
    });
    await expectOk(response, "held chat completion stream");
    const reader = response.body!.getReader();
    const first = await reader.read();
    const ms = performance.now() - started;
    if (first.done || first.value.byteLength === 0) {
      throw new Error("held stream: ended before its first event");
    }
    const unbuffered = !hold.timedOut;
    hold.release();
    while (!(await reader.read()).done) {
      // Drain, so that the connection goes back to the pool.
    }
    return { ms, unbuffered };
  } finally {
    upstream.forget(id);
  }
}

/**
 * 4. Upstream connections the egress proxy opens for EGRESS_REQUESTS sequential plain-HTTP
 * requests, each on a new client connection: with its pool of idle upstream connections, and with
 * the pool off (each client connection then has an upstream connection of its own).
 */
async function measureEgressConnections(
  context: BenchContext,
): Promise<{ unpooled: number; pooled: number }> {
  context.progress(
    `egress: ${EGRESS_REQUESTS} requests on new client connections, pool off and on`,
  );
  const count = async (maxIdleUpstreams: number) => {
    const connections = new Set<number>();
    await using server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (_request, info) => {
        connections.add((info.remoteAddr as Deno.NetAddr).port);
        return new Response("ok");
      },
    );
    const host = `bench.test:${server.addr.port}`;
    await using proxy = await startEgressProxy({
      hostnames: ["127.0.0.1"],
      mode: "allowlist",
      allow: [host],
      hosts: { "bench.test": "127.0.0.1" },
      profile: "bench",
      maxIdleUpstreams,
    });
    for (let i = 0; i < EGRESS_REQUESTS; i++) {
      context.signal.throwIfAborted();
      using client = Deno.createHttpClient({ proxy: { url: proxy.url("127.0.0.1") } });
      await (await fetch(`http://${host}/${i}`, { client })).text();
    }
    return connections.size;
  };
  return { unpooled: await count(0), pooled: await count(MAX_IDLE_UPSTREAMS) };
}

/** Run `measure` on both endpoints `count` times, alternating which goes first. */
async function interleaved<T>(
  count: number,
  signal: AbortSignal,
  measure: (endpoint: "direct" | "proxy") => Promise<T>,
): Promise<{ direct: T[]; proxy: T[] }> {
  const results = { direct: [] as T[], proxy: [] as T[] };
  for (let i = 0; i < count; i++) {
    signal.throwIfAborted();
    const order = i % 2 === 0 ? ["direct", "proxy"] as const : ["proxy", "direct"] as const;
    for (const which of order) results[which].push(await measure(which));
  }
  return results;
}

type Endpoints = Record<"direct" | "proxy", Endpoint>;
type Pair<T> = { direct: T[]; proxy: T[] };

async function run(context: BenchContext): Promise<BenchResult> {
  const { signal } = context;
  await using upstream = new BenchUpstream();
  const stateDir = await Deno.makeTempDir({ prefix: "sandbox-bench-" });
  const client = Deno.createHttpClient({});
  try {
    const redactor = new Redactor();
    const keys = new KeyStore({ redactor, env: (name) => (name === KEY_ENV ? KEY : undefined) });
    await using proxies = await startHostProxies(benchProfile(upstream.baseUrl), ["127.0.0.1"], {
      keys,
      redactor,
      accessLogPath: `${stateDir}/access.ndjson`,
      signal,
    });
    const endpoints: Endpoints = {
      direct: {
        url: `${upstream.baseUrl}/chat/completions`,
        headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      },
      proxy: {
        url: `${proxies.llmUrl("127.0.0.1")}/chat/completions`,
        headers: { authorization: `Bearer ${proxies.token}`, "content-type": "application/json" },
      },
    };
    const latency = await measureLatency(client, endpoints, context);
    const first = await measureFirstEvent(client, upstream, endpoints, context);
    const throughput = await measureThroughput(client, endpoints, context);
    const connections = await measureEgressConnections(context);
    return {
      figures: [
        ...latencyFigures(latency, first),
        ...throughputFigures(throughput),
        {
          name: `egress upstream connections opened for ${EGRESS_REQUESTS} requests`,
          unit: "connections",
          baseline: connections.unpooled,
          measured: connections.pooled,
          better: "lower",
        },
      ],
      notes: proxyNotes(),
    };
  } finally {
    client.close();
    // A temporary directory left behind is harmless; the figures (or the error) are what count.
    await Deno.remove(stateDir, { recursive: true }).catch(() => {});
  }
}

/** The bench's profile: its LLM is the bench upstream; no egress proxy (only one is measured). */
function benchProfile(baseUrl: string) {
  const loaded = parseConfig(
    [
      "profiles:",
      "  bench:",
      `    llm: {provider: custom, base_url: "${baseUrl}", key: {env: ${KEY_ENV}}}`,
      // Only the credential proxy is measured: no egress proxy.
      "    sandbox: {network: {mode: full}}",
    ].join("\n"),
    "bench profile",
  );
  if (loaded.kind !== "ok") {
    throw new Error(`bench profile invalid: ${JSON.stringify(loaded.issues)}`);
  }
  return resolveProfile(loaded.config, "bench");
}

/** 1. Added latency per request: each way's times, sorted. */
async function measureLatency(
  client: Deno.HttpClient,
  endpoints: Endpoints,
  context: BenchContext,
): Promise<{ direct: number[]; proxied: number[] }> {
  const body = JSON.stringify(REQUEST);
  context.progress(`latency: ${LATENCY_WARMUP} warm-up + ${LATENCY_REQUESTS} requests each way`);
  await interleaved(
    LATENCY_WARMUP,
    context.signal,
    (which) => timeRequest(client, endpoints[which], body),
  );
  const latency = await interleaved(
    LATENCY_REQUESTS,
    context.signal,
    (which) => timeRequest(client, endpoints[which], body),
  );
  return { direct: sorted(latency.direct), proxied: sorted(latency.proxy) };
}

/** 2. Time to first event, on streams held after it. */
async function measureFirstEvent(
  client: Deno.HttpClient,
  upstream: BenchUpstream,
  endpoints: Endpoints,
  context: BenchContext,
): Promise<Pair<{ ms: number; unbuffered: boolean }>> {
  context.progress(`first SSE event: ${FIRST_CHUNK_STREAMS} held streams each way`);
  const measure = (which: "direct" | "proxy") => firstEvent(client, upstream, endpoints[which]);
  await interleaved(FIRST_CHUNK_WARMUP, context.signal, measure);
  return await interleaved(FIRST_CHUNK_STREAMS, context.signal, measure);
}

type StreamRun = { ms: number; bytes: number; events: number };

/** 3. Streaming throughput: small events one per write, then bulk writes. */
async function measureThroughput(
  client: Deno.HttpClient,
  endpoints: Endpoints,
  context: BenchContext,
): Promise<{ streams: Pair<StreamRun>; bulk: Pair<StreamRun> }> {
  const { signal } = context;
  const bulkMegabytes = (BULK_EVENTS * EVENT.byteLength) / 1e6;
  context.progress(
    `SSE throughput: ${STREAM_ROUNDS} streams of ${STREAM_EVENTS} events and of ${bulkMegabytes} MB each way`,
  );
  await interleaved(1, signal, (which) => readStream(client, endpoints[which], STREAM_EVENTS));
  const streams = await interleaved(
    STREAM_ROUNDS,
    signal,
    (which) => readStream(client, endpoints[which], STREAM_EVENTS),
  );
  await interleaved(
    1,
    signal,
    (which) => readStream(client, endpoints[which], BULK_EVENTS, BULK_BATCH),
  );
  const bulk = await interleaved(
    STREAM_ROUNDS,
    signal,
    (which) => readStream(client, endpoints[which], BULK_EVENTS, BULK_BATCH),
  );
  return { streams, bulk };
}

function latencyFigures(
  { direct, proxied }: { direct: number[]; proxied: number[] },
  first: Pair<{ ms: number; unbuffered: boolean }>,
): Figure[] {
  const firstDirect = sorted(first.direct.map((r) => r.ms));
  const firstProxy = sorted(first.proxy.map((r) => r.ms));
  const unbufferedShare = (results: { unbuffered: boolean }[]) =>
    (100 * results.filter((r) => r.unbuffered).length) / results.length;
  const addedP50 = percentile(proxied, 50) - percentile(direct, 50);
  return [
    {
      name: "request latency p50",
      unit: "ms",
      baseline: percentile(direct, 50),
      measured: percentile(proxied, 50),
      better: "lower",
      target: { text: `added ≤ ${ADDED_P50_TARGET_MS} ms`, met: addedP50 <= ADDED_P50_TARGET_MS },
    },
    {
      name: "request latency p99",
      unit: "ms",
      baseline: percentile(direct, 99),
      measured: percentile(proxied, 99),
      better: "lower",
    },
    {
      name: "time to first SSE event p50",
      unit: "ms",
      baseline: percentile(firstDirect, 50),
      measured: percentile(firstProxy, 50),
      better: "lower",
    },
    {
      name: "time to first SSE event p99",
      unit: "ms",
      baseline: percentile(firstDirect, 99),
      measured: percentile(firstProxy, 99),
      better: "lower",
    },
    {
      name: "first SSE event before the next is sent",
      unit: "%",
      baseline: unbufferedShare(first.direct),
      measured: unbufferedShare(first.proxy),
      better: "higher",
      target: { text: "unbuffered (100%)", met: unbufferedShare(first.proxy) === 100 },
    },
  ];
}

function throughputFigures(
  { streams, bulk }: { streams: Pair<StreamRun>; bulk: Pair<StreamRun> },
): Figure[] {
  const mbPerSecond = (runs: { ms: number; bytes: number }[]) =>
    median(runs.map((r) => r.bytes / 1e6 / (r.ms / 1000)));
  const eventsPerSecond = (runs: { ms: number; events: number }[]) =>
    median(runs.map((r) => r.events / (r.ms / 1000)));
  return [
    {
      name: "SSE throughput, 1 event per write",
      unit: "events/s",
      baseline: eventsPerSecond(streams.direct),
      measured: eventsPerSecond(streams.proxy),
      better: "higher",
    },
    {
      name: "SSE throughput, 1 event per write",
      unit: "MB/s",
      baseline: mbPerSecond(streams.direct),
      measured: mbPerSecond(streams.proxy),
      better: "higher",
    },
    {
      name: `SSE throughput, ${BULK_BATCH} events per write`,
      unit: "events/s",
      baseline: eventsPerSecond(bulk.direct),
      measured: eventsPerSecond(bulk.proxy),
      better: "higher",
    },
    {
      name: `SSE throughput, ${BULK_BATCH} events per write`,
      unit: "MB/s",
      baseline: mbPerSecond(bulk.direct),
      measured: mbPerSecond(bulk.proxy),
      better: "higher",
    },
  ];
}

function proxyNotes(): string[] {
  const megabytes = (STREAM_EVENTS * EVENT.byteLength) / 1e6;
  const bulkMegabytes = (BULK_EVENTS * EVENT.byteLength) / 1e6;
  return [
    `latency: ${LATENCY_REQUESTS} sequential non-streaming POST /chat/completions each way after ${LATENCY_WARMUP} warm-up, interleaved; keep-alive on both hops`,
    `first event: ${FIRST_CHUNK_STREAMS} streams each way; the upstream holds the rest until the client has the first event (gives up after ${HOLD_TIMEOUT_MS} ms)`,
    `throughput: median of ${STREAM_ROUNDS} streams each way of ${
      STREAM_EVENTS.toLocaleString("en-US")
    } events × ${EVENT.byteLength} B (${megabytes} MB) written one by one, and of ${
      BULK_EVENTS.toLocaleString("en-US")
    } events (${bulkMegabytes} MB) written ${BULK_BATCH} at a time; counted by the client; MB = 10^6 bytes`,
    `egress connections: ${EGRESS_REQUESTS} sequential GETs through the egress proxy, each from a new HTTP client, to a Deno.serve upstream that counts source ports; baseline with the proxy's pool of idle upstream connections off`,
    "client, proxy (startHostProxies: token, KeyStore key, access log on disk) and upstream share one process on 127.0.0.1",
  ];
}

export const benchmark: Benchmark = {
  name: "proxy",
  title: "LLM credential proxy vs direct upstream, loopback",
  baselineLabel: "direct",
  measuredLabel: "proxy",
  run,
};
