/**
 * The LLM credential proxy: the sandbox calls it with a per-run token instead of an API key, and
 * the host attaches the real key on the way out. The key never enters the sandbox; the token is
 * useless anywhere but here and dies with the run.
 *
 * The sandbox uses stock SDKs, with the token as their "API key" and this proxy as base URL:
 * OpenAI SDKs with `http://host:port/proxy/v1`, Anthropic SDKs with `http://host:port/proxy`.
 *
 * Fails closed: no token, an unknown token, or a route not listed in `llm_policy.ts` never reaches
 * an upstream. Only the headers each API needs are forwarded, and a JSON body is parsed strictly
 * (one reading) and checked against the profile's policy (no server-side tools, optionally a list
 * of models) before the same bytes are forwarded. Responses are streamed through chunk by chunk
 * (SSE works) with every secret the host knows redacted, and a client that goes away cancels its
 * upstream request. Redirects are passed back, never followed: following one would carry the key
 * to wherever it points.
 */
import { trace } from "../trace.ts";
import type { AccessLog, AccessLogEntry } from "./access_log.ts";
import { assertListenOn, formatHostForUrl, type ListenAddress } from "./egress_proxy.ts";
import { closeOnAbort } from "../process.ts";
import { Redactor } from "../redact.ts";
import {
  DEFAULT_LLM_POLICY,
  forwardedHeaders,
  type LlmApi,
  type LlmPolicy,
  type RouteRule,
  ROUTES,
} from "./llm_policy.ts";
import { parseStrictJson } from "./strict_json.ts";
import { ResponseMeter, type RunBudget } from "./budget.ts";

export const PROXY_PATH_PREFIX = "/proxy/v1";
export const DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024;
/** Time allowed until the upstream's response headers; long generations stream after that. */
export const DEFAULT_UPSTREAM_TIMEOUT_MS = 10 * 60_000;
export const ANTHROPIC_VERSION = "2023-06-01";
export const TOKEN_PREFIX = "sbx_";

export interface UpstreamProvider {
  /** Shown in error messages, e.g. "openai". */
  name: string;
  kind: "openai" | "anthropic";
  /** Base URL the route suffix is appended to, e.g. "https://api.openai.com/v1". */
  baseUrl: string;
  /** The real API key; called per request (a `KeyStore` getter caches it). */
  key: () => Promise<string>;
  /**
   * "oauth": the key is a Claude subscription token, sent to an Anthropic-format upstream as
   * `Authorization: Bearer` with the `oauth-2025-04-20` beta flag (as Claude Code sends it).
   */
  auth?: "oauth";
}

/** The beta flag Anthropic's API wants beside a subscription (OAuth) token. */
export const OAUTH_BETA = "oauth-2025-04-20";

/** What a token entitles its holder to. */
export interface ProxyGrant {
  profile: string;
  runId: string | null;
  provider: UpstreamProvider;
  /** What the holder may ask of the provider; default: no server-side tools, any model. */
  policy?: LlmPolicy;
  /** What the holder may spend (lib/proxy/budget.ts); default: no limit. */
  budget?: RunBudget;
}

export interface TokenRegistryOptions {
  /** Every issued token is registered here, so that no log line can show it. */
  redactor?: Redactor;
}

/** The per-run tokens the proxy accepts. Tokens exist only in memory. */
export class TokenRegistry {
  readonly #grants = new Map<string, { bytes: Uint8Array; grant: ProxyGrant }>();
  readonly #redactor: Redactor | undefined;
  readonly #encoder = new TextEncoder();

  constructor(options: TokenRegistryOptions = {}) {
    this.#redactor = options.redactor;
  }

  /** A new token for `grant`: "sbx_" and 32 random bytes in base64url. */
  issue(grant: ProxyGrant): string {
    const token = TOKEN_PREFIX + base64Url(crypto.getRandomValues(new Uint8Array(32)));
    this.#grants.set(token, { bytes: this.#encoder.encode(token), grant });
    this.#redactor?.add(token);
    return token;
  }

  /** The token stops working immediately, including for requests that arrive later. */
  revoke(token: string): void {
    this.#grants.delete(token);
  }

  /** The grant for a presented token, or `undefined`. */
  lookup(token: string): ProxyGrant | undefined {
    // Every issued token is compared in constant time, without stopping at a match, so that
    // response timing says nothing about how much of a guess was right.
    const presented = this.#encoder.encode(token);
    let found: ProxyGrant | undefined;
    for (const { bytes, grant } of this.#grants.values()) {
      if (constantTimeEqual(presented, bytes)) found = grant;
    }
    return found;
  }

  get size(): number {
    return this.#grants.size;
  }
}

export interface CredentialProxyOptions {
  /** Addresses to listen on, all on the same port. Never "0.0.0.0" or "::". */
  hostnames: string[];
  /** 0 or absent: pick a free port. */
  port?: number;
  /** Listen on this Unix socket instead of TCP (`hostnames` must then be empty). */
  path?: string;
  tokens: TokenRegistry;
  maxBodyBytes?: number;
  upstreamTimeoutMs?: number;
  log?: AccessLog;
  /**
   * Keys and tokens are registered here as they are seen, and log entries pass through it.
   * Without one the proxy uses a private one: log entries are redacted either way.
   */
  redactor?: Redactor;
  /** Aborting closes the proxy, as `close()` does. */
  signal?: AbortSignal;
}

export interface CredentialProxy {
  /** The TCP port; 0 when listening on a Unix socket. */
  port: number;
  addresses: ListenAddress[];
  /** `http://hostname:port/proxy/v1`: the OpenAI-style base URL for the sandbox. */
  url(hostname: string): string;
  /** Stop listening, cancel upstream requests in flight, and wait for every connection to end. */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Start the proxy; raises `TypeError` for an all-interfaces address or no address at all. */
export async function startCredentialProxy(
  options: CredentialProxyOptions,
): Promise<CredentialProxy> {
  assertListenOn(options);
  const closing = new AbortController();
  const handler = createHandler(options, closing.signal);
  const servers: Deno.HttpServer<Deno.Addr>[] = [];
  try {
    if (options.path !== undefined) {
      servers.push(Deno.serve({
        path: options.path,
        onListen: () => {},
        onError: () => jsonError(500, "api_error", "sandbox credential proxy: internal error"),
      }, handler));
    }
    for (const hostname of options.hostnames) {
      const port = servers.length === 0
        ? options.port ?? 0
        : (servers[0].addr as Deno.NetAddr).port;
      servers.push(Deno.serve({
        hostname: hostname.replace(/^\[|\]$/g, ""),
        port,
        // lib/ never prints to stdout; Deno.serve would announce itself there.
        onListen: () => {},
        onError: () => jsonError(500, "api_error", "sandbox credential proxy: internal error"),
      }, handler));
    }
  } catch (error) {
    closing.abort();
    await Promise.all(servers.map((server) => server.shutdown()));
    throw error;
  }
  const port = options.path === undefined ? (servers[0].addr as Deno.NetAddr).port : 0;

  let closed: Promise<void> | undefined;
  // Set right below; a signal that has already aborted closes at once, before it is set.
  let detach = () => {};
  const close = () => {
    closed ??= (async () => {
      detach();
      // Aborting first ends streaming responses, which a graceful shutdown would wait for.
      closing.abort();
      await Promise.all(servers.map((server) => server.shutdown()));
      await Promise.all(servers.map((server) => server.finished));
    })();
    return closed;
  };
  detach = closeOnAbort(options.signal, close);

  return {
    port,
    addresses: options.hostnames.map((hostname) => ({ hostname, port })),
    url: (hostname) => `http://${formatHostForUrl(hostname)}:${port}${PROXY_PATH_PREFIX}`,
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** Response headers never passed back: hop-by-hop, and framing that no longer matches the body. */
const STRIPPED_RESPONSE_HEADERS = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  // The body we pass on was decoded by fetch, so its encoding and length headers no longer apply.
  "content-encoding",
  "content-length",
  // Upstream sessions are not the sandbox's business.
  "set-cookie",
]);

type LogFields = Omit<AccessLogEntry, "durationMs">;

/** Why the proxy answers a request itself: the status, the API's error type, and a message. */
class Refusal {
  constructor(readonly status: number, readonly type: string, readonly message: string) {}
}

/** Where a request goes once its route is known. */
interface Target {
  suffix: string;
  rule: RouteRule;
  api: LlmApi;
  policy: LlmPolicy;
  upstreamUrl: URL;
}

/**
 * One request's access-log entry and its two ends: `finish` logs it once the response is over
 * (streamed or not); `refuse` drops the request body, logs the refusal and answers with an error
 * body. Every entry passes through the redactor on its way to the log.
 */
interface Exchange {
  entry: LogFields;
  finish(status: number | undefined, reason?: string): void;
  refuse(refusal: Refusal): Response;
}

function openExchange(
  req: Request,
  url: URL,
  log: AccessLog | undefined,
  redactor: Redactor,
): Exchange {
  const started = performance.now();
  const entry: LogFields = {
    time: new Date().toISOString(),
    kind: "llm",
    decision: "deny",
    method: req.method,
    host: "",
    port: 0,
    // The query string is never logged: it is the usual place for stray credentials.
    path: url.pathname,
    bytesIn: 0,
    bytesOut: 0,
    profile: "",
    runId: null,
  };
  const finish = (status: number | undefined, reason?: string) => {
    entry.status = status;
    if (reason !== undefined) entry.reason = reason;
    const complete: AccessLogEntry = {
      ...entry,
      durationMs: Math.round(performance.now() - started),
    };
    log?.write(redactor.redactValue(complete));
  };
  const refuse = ({ status, type, message }: Refusal) => {
    // The body is not wanted; a client that already went away makes cancelling fail, harmlessly.
    void req.body?.cancel().catch(() => {});
    finish(status, message);
    return jsonError(status, type, `sandbox credential proxy: ${message}`);
  };
  return { entry, finish, refuse };
}

function createHandler(
  options: CredentialProxyOptions,
  closing: AbortSignal,
): (req: Request) => Promise<Response> {
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  // Redaction is not optional: a token pasted into a path must not reach the log.
  const redactor = options.redactor ?? new Redactor();
  const upstreamTimeoutMs = options.upstreamTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS;

  // Every step either yields what the next needs or refuses; nothing reaches an upstream unless
  // every step before it passed (fail closed).
  return async (req) => {
    trace("credential proxy: request");
    const url = new URL(req.url);
    const exchange = openExchange(req, url, options.log, redactor);
    const { entry } = exchange;

    // 1. Who is asking: the token alone decides the profile and the provider.
    const auth = authenticate(req.headers, options.tokens);
    if (auth.kind === "refused") {
      return exchange.refuse(new Refusal(401, "authentication_error", auth.message));
    }
    const { grant, token } = auth;
    redactor.add(token);
    Object.assign(entry, { profile: grant.profile, runId: grant.runId });

    // 2. Where to: only the listed routes, to the grant's provider.
    const target = targetFor(req.method, url, grant);
    if (target instanceof Refusal) return exchange.refuse(target);
    Object.assign(entry, {
      host: target.upstreamUrl.hostname,
      port: Number(target.upstreamUrl.port) ||
        (target.upstreamUrl.protocol === "https:" ? 443 : 80),
      path: target.upstreamUrl.pathname,
    });

    // 3. The body, capped: JSON requests are small, and the upstream needs a Content-Length.
    const body = await requestBody(req, maxBodyBytes);
    if (body instanceof Refusal) return exchange.refuse(body);
    entry.bytesOut = body.length;

    // 4. What it asks for, decided on one strict reading of the body; those same bytes go out.
    const checked = target.rule.method === "POST"
      ? checkBody(body, target.rule, target.policy, grant.profile)
      : undefined;
    if (checked instanceof Refusal) return exchange.refuse(checked);

    // 4b. What the run may still spend: a call that would start past its budget never starts.
    const meter = meterFor(grant.budget, target, checked, body.length);
    if (meter instanceof Refusal) return exchange.refuse(meter);

    // 5. The real key, attached on the way out. From here on the request was allowed: a failure
    // is the host's, not a refusal of what the sandbox asked.
    entry.decision = "allow";
    const headers = await headersWithKey(req.headers, target, grant.provider, redactor);
    if (headers instanceof Refusal) return exchange.refuse(headers);

    // 6. Forward; the timeout covers the wait for response headers only.
    const upstream = await forward(req, target.upstreamUrl, headers, body, {
      provider: grant.provider.name,
      upstreamTimeoutMs,
      closing,
    });
    if (upstream instanceof Refusal) return exchange.refuse(upstream);

    // 7. Back to the sandbox with every known secret redacted, metered against the budget.
    return respond(upstream, redactor, exchange, meter);
  };
}

/** The route, API, policy and upstream URL for a request, or why there is none. */
function targetFor(method: string, url: URL, grant: ProxyGrant): Target | Refusal {
  const route = findRoute(method, url.pathname);
  if (route === undefined) {
    return new Refusal(404, "not_found_error", `no route for ${method} ${url.pathname}`);
  }
  const { suffix, rule } = route;
  const api: LlmApi = rule.api ?? grant.provider.kind;
  const policy = grant.policy ?? DEFAULT_LLM_POLICY;
  let upstreamUrl: URL;
  try {
    upstreamUrl = new URL(grant.provider.baseUrl.replace(/\/+$/, "") + suffix + url.search);
  } catch {
    return new Refusal(
      500,
      "api_error",
      `provider "${grant.provider.name}" has an invalid base URL`,
    );
  }
  return { suffix, rule, api, policy, upstreamUrl };
}

/** The whole request body, refused past `maxBodyBytes` (declared or counted) or cut short. */
async function requestBody(
  req: Request,
  maxBodyBytes: number,
): Promise<Uint8Array<ArrayBuffer> | Refusal> {
  const tooLarge = () =>
    new Refusal(413, "request_too_large", `request body larger than ${maxBodyBytes} bytes`);
  const declared = req.headers.get("content-length");
  if (declared !== null && Number(declared) > maxBodyBytes) return tooLarge();
  const body = await readBodyCapped(req.body, maxBodyBytes);
  if (body === "too_large") return tooLarge();
  if (body === "aborted") {
    return new Refusal(400, "invalid_request_error", "the request body ended early");
  }
  return body;
}

/** Why a POST body is refused (not strict JSON, not an object, or against the policy), or its value. */
function checkBody(
  body: Uint8Array,
  rule: RouteRule,
  policy: LlmPolicy,
  profile: string,
): Refusal | Record<string, unknown> {
  const parsed = parseStrictJson(body);
  if (parsed.kind === "invalid") {
    const message = `the request body is not strict JSON: ${parsed.reason}`;
    return new Refusal(400, "invalid_request_error", message);
  }
  const value = parsed.value;
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return new Refusal(400, "invalid_request_error", "the request body is not a JSON object");
  }
  const refusal = rule.check?.(value, policy);
  if (refusal === undefined) return value as Record<string, unknown>;
  const why = refusal.rule === "models"
    ? `profile "${profile}" allows only the models in llm.models (${
      (policy.models ?? []).map((model) => JSON.stringify(model)).join(", ")
    })`
    : `profile "${profile}" does not let the provider reach the network or run code ` +
      `for the sandbox (llm.server_tools: allow would)`;
  return new Refusal(403, "permission_error", `${refusal.message}; ${why}`);
}

/** Calls that cost tokens: every POST route but counting them. */
function isMetered(target: Target): boolean {
  return target.rule.method === "POST" && target.suffix !== "/messages/count_tokens";
}

/**
 * A meter for the response of a metered call that its run's budget admits (counted from here), or
 * the refusal the agent sees: 403, which SDKs do not retry.
 */
function meterFor(
  budget: RunBudget | undefined,
  target: Target,
  body: Record<string, unknown> | undefined,
  bodyBytes: number,
): ((response: Response) => ResponseMeter) | undefined | Refusal {
  if (budget === undefined || !isMetered(target)) return undefined;
  const model = typeof body?.model === "string" ? body.model : null;
  const refused = budget.admitLlm();
  if (refused !== undefined) return new Refusal(403, "permission_error", refused);
  return (response) =>
    new ResponseMeter(budget, { model, bodyBytes }, {
      status: response.status,
      contentType: response.headers.get("content-type"),
    });
}

/** The upstream headers with the real key (registered with the redactor first), or why not. */
async function headersWithKey(
  incoming: Headers,
  target: Target,
  provider: UpstreamProvider,
  redactor: Redactor,
): Promise<Headers | Refusal> {
  let key: string;
  try {
    key = await provider.key();
  } catch {
    return new Refusal(
      502,
      "api_error",
      `the API key for provider "${provider.name}" is not available on the host`,
    );
  }
  redactor.add(key);
  try {
    return upstreamHeaders(incoming, { ...target, provider, key });
  } catch {
    // Only the key can make this fail (a newline in it, say); the error must not quote it.
    return new Refusal(
      502,
      "api_error",
      `the API key for provider "${provider.name}" is not a valid header value`,
    );
  }
}

/**
 * The upstream's response (its headers, at least), or why there is none. Redirects come back as
 * they are, never followed; the request is cancelled when the client goes away or the proxy
 * closes.
 */
async function forward(
  req: Request,
  upstreamUrl: URL,
  headers: Headers,
  body: Uint8Array<ArrayBuffer>,
  options: { provider: string; upstreamTimeoutMs: number; closing: AbortSignal },
): Promise<Response | Refusal> {
  const { provider, upstreamTimeoutMs, closing } = options;
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(), upstreamTimeoutMs);
  try {
    return await fetch(upstreamUrl, {
      method: req.method,
      headers,
      body: req.method === "GET" ? undefined : body,
      // A redirect would carry the key to wherever it points: pass it to the client instead.
      redirect: "manual",
      signal: AbortSignal.any([req.signal, timeout.signal, closing]),
    });
  } catch {
    // Messages are generic on purpose: fetch errors name the URL, which may carry credentials.
    if (timeout.signal.aborted) {
      return new Refusal(
        504,
        "timeout_error",
        `provider "${provider}" did not answer within ${upstreamTimeoutMs} ms`,
      );
    }
    if (req.signal.aborted) return new Refusal(499, "api_error", "the client went away");
    if (closing.aborted) return new Refusal(503, "api_error", "the proxy is shutting down");
    return new Refusal(502, "api_error", `cannot reach provider "${provider}"`);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The upstream's response as the sandbox gets it: every known secret redacted from its headers,
 * status text and body (an upstream, a malicious one or an error page, may echo the key anywhere),
 * and the exchange logged when the body ends.
 */
function respond(
  upstream: Response,
  redactor: Redactor,
  exchange: Exchange,
  meterFor?: (response: Response) => ResponseMeter,
): Response {
  const meter = meterFor?.(upstream);
  const responseHeaders = new Headers();
  for (const [name, value] of upstream.headers) {
    if (STRIPPED_RESPONSE_HEADERS.has(name)) continue;
    responseHeaders.append(name, redactor.redact(value));
  }
  const statusText = redactor.redact(upstream.statusText);
  if (upstream.body === null) {
    meter?.end();
    exchange.finish(upstream.status);
    return new Response(null, { status: upstream.status, statusText, headers: responseHeaders });
  }
  const streamed = relayBody(upstream.body, redactor, (bytes, reason) => {
    exchange.entry.bytesIn = bytes;
    exchange.finish(upstream.status, reason);
  }, meter);
  return new Response(streamed, {
    status: upstream.status,
    statusText,
    headers: responseHeaders,
  });
}

type AuthResult =
  | { kind: "ok"; grant: ProxyGrant; token: string }
  | { kind: "refused"; message: string };

/** The token from `Authorization: Bearer` or `x-api-key`; both present must agree. */
function authenticate(headers: Headers, tokens: TokenRegistry): AuthResult {
  const presented: string[] = [];
  const authorization = headers.get("authorization");
  if (authorization !== null) presented.push(authorization.replace(/^\s*Bearer\s+/i, "").trim());
  const apiKey = headers.get("x-api-key");
  if (apiKey !== null) presented.push(apiKey.trim());
  if (presented.length === 0 || presented.every((token) => token === "")) {
    return {
      kind: "refused",
      message: 'no proxy token; send it as "Authorization: Bearer <token>" or "x-api-key: <token>"',
    };
  }
  if (new Set(presented).size > 1) {
    return { kind: "refused", message: "Authorization and x-api-key carry different tokens" };
  }
  const grant = tokens.lookup(presented[0]);
  // Never echo the presented value: it may be a real key the agent found somewhere.
  if (grant === undefined) return { kind: "refused", message: "unknown or revoked proxy token" };
  return { kind: "ok", grant, token: presented[0] };
}

/** The route for `method` and `pathname`, with its suffix after `/proxy/v1`. */
function findRoute(
  method: string,
  pathname: string,
): { suffix: string; rule: RouteRule } | undefined {
  if (!pathname.startsWith(PROXY_PATH_PREFIX + "/")) return undefined;
  const suffix = pathname.slice(PROXY_PATH_PREFIX.length);
  const rule = Object.hasOwn(ROUTES, suffix) ? ROUTES[suffix] : undefined;
  return rule?.method === method ? { suffix, rule } : undefined;
}

/**
 * The upstream request's headers: only those the route's API needs (an allowlist; the sandbox's
 * token, cookies and anything else it sent stay behind), the JSON content type of the body that
 * was checked, and the real key in the form the provider expects.
 */
function upstreamHeaders(
  incoming: Headers,
  options: {
    api: LlmApi;
    rule: RouteRule;
    policy: LlmPolicy;
    provider: UpstreamProvider;
    key: string;
  },
): Headers {
  const headers = forwardedHeaders(options.api, incoming, options.policy);
  if (options.rule.method === "POST") headers.set("content-type", "application/json");
  if (options.api === "anthropic" && !headers.has("anthropic-version")) {
    headers.set("anthropic-version", ANTHROPIC_VERSION);
  }
  if (options.provider.kind === "openai") {
    headers.set("authorization", `Bearer ${options.key}`);
  } else if (options.provider.auth === "oauth") {
    headers.set("authorization", `Bearer ${options.key}`);
    const flags = (headers.get("anthropic-beta") ?? "").split(",").map((f) => f.trim());
    if (!flags.includes(OAUTH_BETA)) {
      headers.set("anthropic-beta", [...flags.filter(Boolean), OAUTH_BETA].join(","));
    }
  } else {
    headers.set("x-api-key", options.key);
  }
  return headers;
}

/** The whole body, or "too_large" as soon as it passes `maxBytes` (chunked bodies included). */
async function readBodyCapped(
  body: ReadableStream<Uint8Array> | null,
  maxBytes: number,
): Promise<Uint8Array<ArrayBuffer> | "too_large" | "aborted"> {
  if (body === null) return new Uint8Array(0);
  const chunks: Uint8Array[] = [];
  let total = 0;
  const reader = body.getReader();
  try {
    while (true) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.byteLength;
      if (total > maxBytes) {
        // The rest is not wanted; a body that already failed cannot be cancelled, harmlessly.
        await reader.cancel().catch(() => {});
        return "too_large";
      }
      chunks.push(value);
    }
  } catch {
    return "aborted";
  } finally {
    reader.releaseLock();
  }
  const joined = new Uint8Array(total);
  let offset = 0;
  for (const chunk of chunks) {
    joined.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return joined;
}

/**
 * Passes `body` through one chunk at a time (nothing is read ahead of what the client takes), with
 * known secrets redacted (a secret split across chunks included), and reports the upstream byte
 * count once: at the end, on an upstream error, or when the client cancels. Cancelling (the client
 * went away) cancels the upstream body, which ends the upstream request.
 */
function relayBody(
  body: ReadableStream<Uint8Array>,
  redactor: Redactor,
  onDone: (bytes: number, reason?: string) => void,
  meter?: ResponseMeter,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  const redacting = redactor.stream();
  let bytes = 0;
  let reported = false;
  const report = (reason?: string) => {
    if (reported) return;
    reported = true;
    onDone(bytes, reason);
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      // Read until there is something to pass on: a chunk that may be the start of a secret is
      // held back until the next one says whether it is.
      while (true) {
        let result: ReadableStreamReadResult<Uint8Array>;
        try {
          result = await reader.read();
        } catch (error) {
          report("the upstream response ended early");
          controller.error(error);
          return;
        }
        if (result.done) {
          const held = meter?.end();
          if (held && held.byteLength > 0) controller.enqueue(redacting.push(held));
          const rest = redacting.end();
          if (rest.byteLength > 0) controller.enqueue(rest);
          report();
          controller.close();
          return;
        }
        bytes += result.value.byteLength;
        // Metered before redaction: the budget is charged from what the upstream reported.
        const metered = meter ? meter.push(result.value) : { pass: result.value, cut: false };
        const out = redacting.push(metered.pass);
        if (metered.cut) {
          // Cut at the budget: what passed, then an error event in place of the rest.
          controller.enqueue(out);
          controller.enqueue(redacting.end());
          controller.enqueue(meter!.cutEvent());
          report("cut at the run's budget");
          controller.close();
          // The upstream's rest is not wanted; a body that already ended cannot be cancelled.
          await reader.cancel().catch(() => {});
          return;
        }
        if (out.byteLength > 0) {
          controller.enqueue(out);
          return;
        }
      }
    },
    async cancel(reason) {
      report("the client went away before the response ended");
      // Cancelling fails only for an upstream body that already ended or failed: nothing to stop.
      await reader.cancel(reason).catch(() => {});
    },
  }, { highWaterMark: 0 });
}

/** An error body both OpenAI and Anthropic SDKs understand (`error.message`, `error.type`). */
function jsonError(status: number, type: string, message: string): Response {
  return Response.json({ type: "error", error: { type, message } }, { status });
}

function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  // Lengths are public (every token has the same length); contents are compared in full.
  if (a.length !== b.length) return false;
  let difference = 0;
  for (let i = 0; i < a.length; i++) difference |= a[i] ^ b[i];
  return difference === 0;
}

function base64Url(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(
    /=+$/,
    "",
  );
}
