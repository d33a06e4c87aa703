/**
 * The egress proxy: the only way out of an isolated sandbox. An HTTP forward proxy on a raw socket
 * (`Deno.serve` cannot answer CONNECT): a Unix socket that the sandbox's relay reaches, or
 * loopback TCP for `sandbox proxy`.
 *
 * - `CONNECT host:port` (HTTPS and anything else over TLS): policy check, connect, then bytes are
 *   piped both ways untouched. The proxy never sees inside TLS.
 * - `GET http://host/path` (absolute-form plain HTTP): policy check, then the request is forwarded
 *   in origin form with `Host` set from the checked URL, and the response relayed back framed as
 *   its headers say. HTTP/1.1 keep-alive: the client's connection then carries its next request,
 *   which is read, checked, forwarded and logged exactly as the first. Requests are answered one
 *   at a time: bytes that arrive before the previous response is complete (pipelining, or a
 *   request smuggled behind a body) end the connection unread, and so does any response or body
 *   whose end cannot be told.
 * - Upstream connections outlive the client's: one that ended an exchange cleanly (request body
 *   sent, response read to exactly its framed end, HTTP/1.1 without `Connection: close`, nothing
 *   sent after it) goes to the proxy's pool (lib/proxy/upstream_pool.ts), and a next request for
 *   the same canonical host and port, on any client connection, takes it instead of connecting
 *   (the policy is applied all the same). Anything else is closed. A pooled connection the
 *   upstream closed meanwhile costs a GET, HEAD or OPTIONS without a body nothing: it is sent
 *   again on a new connection.
 *
 * Both go through one decision (`#reach`): the allowlist on the canonical name, then the
 * name is resolved once and every address checked (lib/proxy/address_guard.ts); the proxy
 * connects to a checked address literally, so a DNS answer that changes between check and connect
 * is never asked for. Loopback, private, link-local, metadata and the host's own addresses are
 * refused (403) unless `network.hosts` maps the name there.
 *
 * Every request (a CONNECT, or each plain-HTTP request of a connection) is logged once, when it
 * ends, allowed or denied, with the bytes that crossed the sandbox boundary both ways and the
 * address actually connected to; a connection that sent nothing is not logged.
 */
import type { AccessLog, AccessLogEntry } from "./access_log.ts";
import type { RunBudget } from "./budget.ts";
import { closeOnAbort } from "../process.ts";
import {
  canonicalHost,
  compileEgressPolicy,
  type EgressMode,
  type EgressPolicy,
  isIpLiteral,
  isUnspecifiedAddress,
  splitHostPort,
} from "./egress_policy.ts";
import { type PooledUpstream, UpstreamPool } from "./upstream_pool.ts";
import {
  hostInterfaceAddresses,
  type RefusedAddress,
  resolveDestination,
  type Resolver,
  systemResolver,
} from "./address_guard.ts";

/** Requests with a larger head (request line + headers) get 431. */
export const MAX_REQUEST_HEAD_BYTES = 64 * 1024;
/** How long a client may take to send its request head before the connection is dropped. */
export const REQUEST_HEAD_TIMEOUT_MS = 30_000;
export const CONNECT_TIMEOUT_MS = 10_000;
/** Cap on one line of chunked framing (size line or trailer). */
const MAX_CHUNK_LINE_BYTES = 8 * 1024;
const READ_BUFFER_BYTES = 64 * 1024;
/**
 * Piping buffers start at READ_BUFFER_BYTES and double while reads fill them, up to this: through
 * the relay, a 64 KiB read-then-write loop holds a bulk download to 0.57x of a direct one and 1 MiB
 * reaches par, while an idle or chatty connection never pays for the large buffer.
 */
const MAX_PIPE_BUFFER_BYTES = 1024 * 1024;
/** After an error response, how long and how much of the client's unread input is drained. */
const LINGER_MS = 2_000;
const LINGER_MAX_BYTES = 1024 * 1024;
/** Methods that change nothing (RFC 9110 section 9.2.1): sent again when a pooled connection fails. */
const RETRYABLE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);
/** Idle upstream connections kept per proxy (so per session), for all destinations together. */
export const MAX_IDLE_UPSTREAMS = 8;
/** Below the 5 s after which Node and Deno servers close an idle kept-alive connection. */
export const UPSTREAM_IDLE_TIMEOUT_MS = 4_000;

export interface EgressProxyOptions {
  /** Addresses to listen on, all on the same port. Never "0.0.0.0" or "::". */
  hostnames: string[];
  /** 0 or absent: pick a free port. */
  port?: number;
  /** Listen on this Unix socket instead of TCP (`hostnames` must then be empty). */
  path?: string;
  mode: EgressMode;
  /** Allowlist patterns (see lib/egress_policy.ts), used in mode "allowlist". */
  allow: string[];
  /**
   * Static name → IP map consulted before DNS, like /etc/hosts. Names are matched canonically.
   * The user's explicit choice: a mapped name may reach an internal address; nothing else may.
   */
  hosts?: Record<string, string>;
  log?: AccessLog;
  /** Named in deny messages and log entries. */
  profile: string;
  runId?: string | null;
  /** Aborting closes the proxy, as `close()` does. */
  signal?: AbortSignal;
  /** Deadline for resolving and connecting to the upstream. */
  connectTimeoutMs?: number;
  /** Name resolver (default: the system's, as `Deno.connect` uses it). Called once per request. */
  resolve?: Resolver;
  /** This host's own addresses, refused as destinations (default: every interface's, read per request). */
  localAddresses?: () => readonly string[];
  /** Opens the upstream connection to a checked IP address (default: `Deno.connect`). */
  dial?: Dialer;
  /**
   * What the run may spend (lib/proxy/budget.ts): each request is admitted (and counted) before
   * any connection is made, and its bytes both ways are charged; past the budget, every live
   * connection is cut.
   */
  budget?: RunBudget;
  /** Idle plain-HTTP upstream connections kept for later requests (default MAX_IDLE_UPSTREAMS). */
  maxIdleUpstreams?: number;
}

/** Connect to `address` (an IP literal, never a name) on `port`. */
export type Dialer = (address: string, port: number, signal: AbortSignal) => Promise<Deno.Conn>;

function dialTcp(address: string, port: number, signal: AbortSignal): Promise<Deno.Conn> {
  return Deno.connect({ hostname: address, port, signal });
}

export interface ListenAddress {
  hostname: string;
  port: number;
}

export interface EgressProxy {
  /** The TCP port; 0 when listening on a Unix socket. */
  port: number;
  addresses: ListenAddress[];
  /** `http://hostname:port`, for `HTTP_PROXY`/`HTTPS_PROXY`. */
  url(hostname: string): string;
  /** Stop listening and end every live connection. */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Start listening; rejects with `TypeError` for an all-interfaces address or no address at all.
 * Async like `startCredentialProxy`, so that every failure (a bad address, a port in use)
 * arrives the same way, as a rejection.
 */
// deno-lint-ignore require-await
export async function startEgressProxy(options: EgressProxyOptions): Promise<EgressProxy> {
  assertListenOn(options);
  // Before listening: a bad `hosts` entry raises here, with nothing to clean up.
  const proxy = new ProxySession(options);
  const listeners: Deno.Listener[] = options.path === undefined
    ? listenAll(options.hostnames, options.port ?? 0)
    : [Deno.listen({ transport: "unix", path: options.path })];
  const port = options.path === undefined ? (listeners[0].addr as Deno.NetAddr).port : 0;
  const acceptLoops = listeners.map((listener) => proxy.acceptFrom(listener));

  let closing: Promise<void> | undefined;
  // Set right below; a signal that has already aborted closes at once, before it is set.
  let detach = () => {};
  const close = () => {
    closing ??= (async () => {
      detach();
      for (const listener of listeners) closeQuietly(listener);
      await Promise.all(acceptLoops);
      await proxy.closeAll();
    })();
    return closing;
  };
  detach = closeOnAbort(options.signal, close);

  return {
    port,
    addresses: options.hostnames.map((hostname) => ({ hostname, port })),
    url: (hostname) => `http://${formatHostForUrl(hostname)}:${port}`,
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** Shared by the host proxies: a Unix socket, or TCP addresses that name no wildcard. */
export function assertListenOn(options: { hostnames: readonly string[]; path?: string }): void {
  if (options.path === undefined) return assertListenHostnames(options.hostnames);
  if (options.hostnames.length > 0) {
    throw new TypeError("Cannot listen on a Unix socket and TCP addresses at once");
  }
}

/** A listen address list must be non-empty and name no wildcard. */
export function assertListenHostnames(hostnames: readonly string[]): void {
  if (hostnames.length === 0) throw new TypeError("Cannot start a proxy without a listen address");
  for (const hostname of hostnames) {
    if (isUnspecifiedAddress(hostname)) {
      throw new TypeError(
        `Refusing to listen on "${hostname}": the proxy must listen on loopback or the sandbox network gateway only`,
      );
    }
  }
}

/** `[::1]` for IPv6 literals, the name as is otherwise. */
export function formatHostForUrl(hostname: string): string {
  return hostname.includes(":") && !hostname.startsWith("[") ? `[${hostname}]` : hostname;
}

function listenAll(hostnames: readonly string[], port: number): Deno.TcpListener[] {
  const listeners: Deno.TcpListener[] = [];
  try {
    for (const hostname of hostnames) {
      // The first listener picks the port when asked for 0; the others reuse it.
      const chosen = listeners.length === 0 ? port : listeners[0].addr.port;
      listeners.push(Deno.listen({ hostname: hostname.replace(/^\[|\]$/g, ""), port: chosen }));
    }
  } catch (error) {
    for (const listener of listeners) closeQuietly(listener);
    throw error;
  }
  return listeners;
}

/** Bytes on the sandbox side of one connection: what the sandbox sent and received. */
interface Tally {
  bytesIn: number;
  bytesOut: number;
}

/** A tally that reports every byte added to it to `charge`, starting with those `from` holds. */
function meteredTally(from: Tally, charge: (bytes: number) => void): Tally {
  let bytesIn = from.bytesIn;
  let bytesOut = from.bytesOut;
  if (bytesIn + bytesOut > 0) charge(bytesIn + bytesOut);
  return {
    get bytesIn() {
      return bytesIn;
    },
    set bytesIn(value: number) {
      const added = value - bytesIn;
      bytesIn = value;
      if (added > 0) charge(added);
    },
    get bytesOut() {
      return bytesOut;
    },
    set bytesOut(value: number) {
      const added = value - bytesOut;
      bytesOut = value;
      if (added > 0) charge(added);
    },
  };
}

/** Thrown inside a handler to answer the client with an error response and log a deny/failure. */
class ProxyRefusal extends Error {
  constructor(
    readonly status: number,
    readonly decision: "allow" | "deny",
    message: string,
    /** For the access log only, when it may say more than the sandbox is told. */
    readonly logReason: string = message,
  ) {
    super(message);
  }
}

/** State shared by all connections of one proxy: policy, live sockets, running handlers. */
class ProxySession {
  readonly #options: EgressProxyOptions;
  readonly #policy: EgressPolicy;
  readonly #hosts: Map<string, string>;
  readonly #liveConns = new Set<Deno.Conn>();
  readonly #handlers = new Set<Promise<void>>();
  /** Aborted by `closeAll()`: cancels pending upstream connects. */
  readonly #closing = new AbortController();
  readonly #pool: UpstreamPool<Upstream>;

  constructor(options: EgressProxyOptions) {
    this.#options = options;
    this.#policy = compileEgressPolicy(options.mode, options.allow);
    this.#hosts = new Map();
    for (const [name, address] of Object.entries(options.hosts ?? {})) {
      const ip = canonicalHost(address);
      // Only an address: a name here would be resolved again, unchecked, at connect time.
      if (ip === undefined || !isIpLiteral(ip)) {
        throw new TypeError(`Invalid hosts entry "${name}": "${address}" is not an IP address`);
      }
      // Keyed by canonical name, since that is what requests are looked up by.
      this.#hosts.set(canonicalHost(name) ?? name, ip);
    }
    this.#pool = new UpstreamPool({
      maxIdle: options.maxIdleUpstreams ?? MAX_IDLE_UPSTREAMS,
      idleTimeoutMs: UPSTREAM_IDLE_TIMEOUT_MS,
      discard: (upstream) => this.#untrack(upstream.conn),
    });
  }

  async acceptFrom(listener: Deno.Listener): Promise<void> {
    try {
      for await (const conn of listener) {
        if (this.#closing.signal.aborted) {
          closeQuietly(conn);
          continue;
        }
        const handler = this.#handle(conn).finally(() => this.#handlers.delete(handler));
        this.#handlers.add(handler);
      }
    } catch {
      // Closing the listener ends the loop (BadResource/Interrupted). Any other accept error also
      // ends it: the proxy then stops accepting, which fails closed.
    }
  }

  async closeAll(): Promise<void> {
    this.#closing.abort();
    this.#pool.clear();
    for (const conn of this.#liveConns) closeQuietly(conn);
    await Promise.allSettled([...this.#handlers]);
  }

  #track(conn: Deno.Conn): Deno.Conn {
    this.#liveConns.add(conn);
    return conn;
  }

  #untrack(conn: Deno.Conn | undefined): void {
    if (!conn) return;
    this.#liveConns.delete(conn);
    closeQuietly(conn);
  }

  async #handle(clientConn: Deno.Conn): Promise<void> {
    this.#track(clientConn);
    noDelay(clientConn);
    const client = new BufferedConn(clientConn, { bytesIn: 0, bytesOut: 0 });
    try {
      // One request after another while both ends keep the connection (see the module's comment).
      while (await this.#exchange(client));
    } finally {
      this.#untrack(clientConn);
    }
  }

  /**
   * One request on the client's connection, checked, forwarded and logged on its own. Returns
   * whether the connection may carry another.
   */
  async #exchange(client: BufferedConn): Promise<boolean> {
    const started = performance.now();
    let tally: Tally = { bytesIn: 0, bytesOut: 0 };
    client.tally = tally;
    const clientConn = client.conn;
    const entry: Omit<AccessLogEntry, "durationMs" | "bytesIn" | "bytesOut"> = {
      time: new Date().toISOString(),
      kind: "egress",
      decision: "deny",
      method: "",
      host: "",
      port: 0,
      profile: this.#options.profile,
      runId: this.#options.runId ?? null,
    };
    try {
      const head = await this.#readHead(client, clientConn);
      if (head === undefined) {
        entry.reason = "the client closed or stalled before sending a complete request";
        return false;
      }
      entry.method = head.method;
      const target = this.#parseTarget(head);
      Object.assign(entry, { host: target.host, port: target.port, path: target.path });
      tally = this.#admit(client, tally);
      if (head.method !== "CONNECT") {
        const framing = bodyFraming(head.headers);
        const forwarded = await this.#forward({ head, target, framing, client, tally }, entry);
        entry.status = forwarded.status;
        return forwarded.keepAlive;
      }
      const upstream = await this.#open(target);
      try {
        entry.decision = "allow";
        entry.address = upstream.address;
        await writeAll(
          clientConn,
          latin1Encode("HTTP/1.1 200 Connection Established\r\n\r\n"),
          tally,
        );
        entry.status = 200;
        await tunnel(client, upstream.conn, tally);
        return false;
      } finally {
        this.#untrack(upstream.conn);
      }
    } catch (error) {
      if (error instanceof ProxyRefusal) {
        entry.decision = error.decision;
        entry.status = error.status;
        entry.reason = error.logReason;
        await writeAll(clientConn, errorResponse(error.status, error.message), tally)
          .then(() => lingeringClose(clientConn, tally))
          .catch(() => {}); // the client went away: the refusal is logged all the same
      } else if (!this.#closing.signal.aborted) {
        // A reset or broken pipe mid-stream: the connection simply ends.
        entry.reason ??= `connection ended: ${errorName(error)}`;
      }
      return false;
    } finally {
      // A port scan, a health check or a kept-alive connection closed while idle is not an access.
      if (tally.bytesOut > 0) {
        this.#options.log?.write({
          ...entry,
          ...tally,
          durationMs: Math.round(performance.now() - started),
        });
      }
    }
  }

  /**
   * The request admitted by the run's budget (counted, before any connection is made), and the
   * tally that charges its bytes from here on (those of its head included); or a refusal.
   */
  #admit(client: BufferedConn, tally: Tally): Tally {
    const budget = this.#options.budget;
    if (budget === undefined) return tally;
    const refused = budget.admitEgress();
    if (refused !== undefined) throw new ProxyRefusal(403, "deny", refused);
    const metered = meteredTally(tally, (bytes) => {
      // Past the budget nothing more crosses: every connection of the run's proxy ends.
      if (budget.chargeEgress(bytes)) return;
      for (const conn of this.#liveConns) closeQuietly(conn);
    });
    client.tally = metered;
    return metered;
  }

  /**
   * Forward one plain-HTTP request over an idle connection of the pool opened for the same
   * canonical host and port (the policy is applied to this request all the same), else over a new
   * one from `#reach`; give the connection back to the pool if it ended the exchange cleanly.
   * A pooled connection the upstream closed while idle answers nothing: a safe request (GET, HEAD,
   * OPTIONS) without a body is then sent again on a new connection, nothing having reached the
   * client; any other ends as such a failure always did.
   */
  async #forward(
    exchange: PlainExchange,
    entry: Pick<AccessLogEntry, "decision" | "address">,
  ): Promise<Forwarded> {
    const { target, framing } = exchange;
    let upstream = this.#pool.take(upstreamKey(target));
    if (upstream !== undefined) this.#checkPolicy(target);
    upstream ??= await this.#open(target);
    entry.decision = "allow";
    try {
      while (true) {
        entry.address = upstream.address;
        const retry = upstream.reused && framing.kind === "none" &&
          RETRYABLE_METHODS.has(exchange.head.method);
        const forwarded = await forwardPlainHttp(exchange, upstream, { retry });
        if (forwarded !== "no_response") {
          if (forwarded.upstreamReusable) {
            this.#pool.put(upstream);
            upstream = undefined;
          }
          return forwarded;
        }
        this.#untrack(upstream.conn);
        upstream = undefined;
        upstream = await this.#open(target);
      }
    } finally {
      if (upstream !== undefined) this.#untrack(upstream.conn);
    }
  }

  /** A new upstream connection for `target`, from the whole decision (`#reach`). */
  async #open(target: Target): Promise<Upstream> {
    const connected = await this.#reach(target);
    const conn = this.#track(connected.conn);
    noDelay(conn);
    return new Upstream(conn, upstreamKey(target), connected.address);
  }

  /** The request head, or `undefined` when the client closed or stalled before sending one. */
  async #readHead(client: BufferedConn, clientConn: Deno.Conn): Promise<RequestHead | undefined> {
    const stall = setTimeout(() => closeQuietly(clientConn), REQUEST_HEAD_TIMEOUT_MS);
    let bytes;
    try {
      bytes = await client.readHead(MAX_REQUEST_HEAD_BYTES);
    } catch {
      return undefined;
    } finally {
      clearTimeout(stall);
    }
    if (bytes === "eof") return undefined;
    if (bytes === "too_large") {
      throw new ProxyRefusal(
        431,
        "deny",
        `request head larger than ${MAX_REQUEST_HEAD_BYTES} bytes`,
      );
    }
    const head = parseRequestHead(latin1Decode(bytes));
    if (typeof head === "string") throw new ProxyRefusal(400, "deny", `malformed request: ${head}`);
    return head;
  }

  #parseTarget(head: RequestHead): Target {
    if (head.method === "CONNECT") {
      const { host, port } = splitHostPort(head.target);
      const canonical = canonicalHost(host);
      if (canonical === undefined || port === undefined || !isPortNumber(port)) {
        throw new ProxyRefusal(
          400,
          "deny",
          `malformed request: CONNECT needs "host:port", got "${head.target}"`,
        );
      }
      return { host: canonical, port: Number(port) };
    }
    if (/^https:\/\//i.test(head.target)) {
      throw new ProxyRefusal(400, "deny", "malformed request: use CONNECT for https:// URLs");
    }
    if (!/^http:\/\//i.test(head.target)) {
      throw new ProxyRefusal(
        400,
        "deny",
        `malformed request: this is a forward proxy; expected an absolute http:// URL or CONNECT, got "${head.target}"`,
      );
    }
    let url: URL;
    try {
      url = new URL(head.target);
    } catch {
      throw new ProxyRefusal(400, "deny", `malformed request: invalid URL "${head.target}"`);
    }
    const canonical = canonicalHost(url.hostname);
    if (canonical === undefined) {
      throw new ProxyRefusal(400, "deny", `malformed request: invalid host "${url.hostname}"`);
    }
    return {
      host: canonical,
      port: url.port === "" ? 80 : Number(url.port),
      path: url.pathname,
      originForm: url.pathname + url.search,
      hostHeader: url.host,
    };
  }

  #checkPolicy(target: Target): void {
    const decision = this.#policy(target.host, target.port);
    if (decision.allowed) return;
    const what = `"${target.host}:${target.port}"`;
    const { mode, allow, profile } = this.#options;
    const why = mode === "none"
      ? `is not allowed: network mode "none" of profile "${profile}" allows no egress`
      : `is not allowed by the ${mode} policy of profile "${profile}" (allowed: ${
        allow.length ? allow.join(", ") : "nothing"
      })`;
    throw new ProxyRefusal(403, "deny", `${what} ${why}`);
  }

  /**
   * The one decision for both CONNECT and plain HTTP, and the connection it allows: the policy on
   * the canonical name, one resolution, the address check, then a connection to a checked
   * address. Refusals are raised as `ProxyRefusal`s.
   */
  async #reach(target: Target): Promise<{ conn: Deno.Conn; address: string }> {
    this.#checkPolicy(target);
    const timeoutMs = this.#options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    const attempt = new AbortController();
    const timer = setTimeout(() => attempt.abort(), timeoutMs);
    const stopOnClose = () => attempt.abort();
    this.#closing.signal.addEventListener("abort", stopOnClose, { once: true });
    const why = (error: unknown) =>
      this.#closing.signal.aborted
        ? "the proxy is shutting down"
        : attempt.signal.aborted
        ? `no answer within ${timeoutMs} ms`
        : errorName(error);
    try {
      const addresses = await this.#destination(target, attempt.signal).catch((error) => {
        if (error instanceof ProxyRefusal) throw error;
        throw new ProxyRefusal(
          502,
          "allow",
          `cannot resolve "${target.host}": ${why(error)}`,
        );
      });
      const dial = this.#options.dial ?? dialTcp;
      let failure: unknown;
      // Each checked address in turn, each with a fair share of the time left.
      const deadline = performance.now() + timeoutMs;
      for (const [i, address] of addresses.entries()) {
        if (attempt.signal.aborted) break;
        const share = (deadline - performance.now()) / (addresses.length - i);
        const one = AbortSignal.any([attempt.signal, AbortSignal.timeout(Math.max(1, share))]);
        try {
          return { conn: await dial(address, target.port, one), address };
        } catch (error) {
          failure = error;
        }
      }
      throw new ProxyRefusal(
        502,
        "allow",
        `cannot connect to "${target.host}:${target.port}": ${why(failure)}`,
        `cannot connect to "${target.host}:${target.port}" at ${addresses.join(", ")}: ${
          why(failure)
        }`,
      );
    } finally {
      clearTimeout(timer);
      this.#closing.signal.removeEventListener("abort", stopOnClose);
    }
  }

  /** The checked addresses `target` may be reached at; internal ones refused (403). */
  async #destination(target: Target, signal: AbortSignal): Promise<string[]> {
    const destination = await resolveDestination(target.host, {
      hosts: this.#hosts,
      resolve: this.#options.resolve ?? systemResolver,
      localAddresses: this.#options.localAddresses ?? hostInterfaceAddresses,
      signal,
    });
    if (destination.kind === "connect") return destination.addresses;
    const what = `"${target.host}:${target.port}"`;
    const classes = [...new Set(destination.refused.map((r) => r.why))].join(" / ");
    const profile = this.#options.profile;
    const message = destination.source === "literal"
      ? `${what} is an internal address (${classes}), which the egress proxy does not connect to; ` +
        `to reach it, map a name to it in network.hosts of profile "${profile}" and allow that name`
      : `${what} resolved to an internal address (${classes}), which the egress proxy does not ` +
        `connect to by name; to allow it, map the name to that address in network.hosts of ` +
        `profile "${profile}" (the access log has the address)`;
    // The sandbox learns the class, not the address: the proxy is no oracle for internal DNS.
    throw new ProxyRefusal(
      403,
      "deny",
      message,
      `${message}; resolved: ${describe(destination.refused)}`,
    );
  }
}

function describe(refused: readonly RefusedAddress[]): string {
  return refused.map(({ address, why }) => `${address} (${why})`).join(", ");
}

/** The pool's key for `target`: its canonical host and port (the destination the policy judged). */
function upstreamKey(target: Target): string {
  return `${target.host}:${target.port}`;
}

/** An upstream connection, kept in the pool between requests. */
class Upstream implements PooledUpstream {
  /** Reads the responses, keeping what one read brought past a response's end. */
  readonly reader: BufferedConn;
  /** True once it has been in the pool: the upstream may have closed it meanwhile. */
  reused = false;

  constructor(
    readonly conn: Deno.Conn,
    /** The canonical `host:port` it was opened for: only requests for the same reuse it. */
    readonly key: string,
    /** The checked address it is connected to. */
    readonly address: string,
  ) {
    this.reader = new BufferedConn(conn, { bytesIn: 0, bytesOut: 0 });
  }

  watchIdle(): Promise<unknown> {
    this.reused = true;
    return this.reader.watchIdle();
  }
}

interface Target {
  /** Canonical host: what the policy checked and what is resolved (unless `hosts` maps it). */
  host: string;
  port: number;
  /** Plain HTTP only: the path for the log (no query: it often carries signatures). */
  path?: string;
  /** Plain HTTP only: path and query for the forwarded request line. */
  originForm?: string;
  /** Plain HTTP only: host[:port] from the checked URL, sent as `Host`. */
  hostHeader?: string;
}

interface RequestHead {
  method: string;
  target: string;
  version: string;
  headers: [name: string, value: string][];
}

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const REQUEST_LINE = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+) ([^\s]+) (HTTP\/1\.[01])$/;

/** The parsed head, or a string saying what is wrong with it. */
function parseRequestHead(text: string): RequestHead | string {
  const lines = text.split("\r\n");
  const requestLine = REQUEST_LINE.exec(lines[0]);
  if (!requestLine) return "invalid request line";
  const headers: [string, string][] = [];
  for (const line of lines.slice(1)) {
    if (line === "") continue;
    // Folded continuation lines are obsolete and a classic smuggling vector: refuse them.
    if (line.startsWith(" ") || line.startsWith("\t")) {
      return "folded header lines are not supported";
    }
    // A bare CR, LF or NUL inside a line could split it in two further down the line.
    if (/[\r\n\0]/.test(line)) return "invalid characters in a header line";
    const colon = line.indexOf(":");
    const name = line.slice(0, colon);
    if (colon <= 0 || !TOKEN.test(name)) return "invalid header line";
    headers.push([name, line.slice(colon + 1).trim()]);
  }
  return {
    method: requestLine[1].toUpperCase(),
    target: requestLine[2],
    version: requestLine[3],
    headers,
  };
}

/** Headers that describe one hop, never forwarded as they are. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "upgrade",
  "host",
]);

type BodyFraming = { kind: "none" } | { kind: "length"; bytes: number } | { kind: "chunked" };

/** How the request body is framed; anything ambiguous is refused (request smuggling). */
function bodyFraming(headers: RequestHead["headers"]): BodyFraming {
  const values = (name: string) =>
    headers.filter(([n]) => n.toLowerCase() === name).map(([, v]) => v);
  const transferEncoding = values("transfer-encoding");
  const contentLength = values("content-length");
  if (transferEncoding.length > 0) {
    if (contentLength.length > 0) {
      throw new ProxyRefusal(
        400,
        "deny",
        "malformed request: both Transfer-Encoding and Content-Length",
      );
    }
    if (transferEncoding.join(",").trim().toLowerCase() !== "chunked") {
      throw new ProxyRefusal(
        400,
        "deny",
        "malformed request: only Transfer-Encoding: chunked is supported",
      );
    }
    return { kind: "chunked" };
  }
  if (contentLength.length === 0) return { kind: "none" };
  const distinct = new Set(contentLength);
  const [value] = distinct;
  if (distinct.size !== 1 || !/^\d{1,15}$/.test(value)) {
    throw new ProxyRefusal(400, "deny", "malformed request: invalid Content-Length");
  }
  return { kind: "length", bytes: Number(value) };
}

/** What one forwarded request came to. */
interface Forwarded {
  /** The upstream's final status code, when its response had a status line. */
  status: number | undefined;
  /** The client's connection may carry another request. */
  keepAlive: boolean;
  /** The upstream connection ended its response cleanly and may carry another request. */
  upstreamReusable: boolean;
}

/** One plain-HTTP request read from the client, checked and admitted. */
interface PlainExchange {
  head: RequestHead;
  target: Target;
  framing: BodyFraming;
  client: BufferedConn;
  tally: Tally;
}

/**
 * Forward one plain-HTTP request and relay its response back; with `retry`, "no_response" when
 * the upstream ended (or refused the request's head) before answering anything, the client's
 * connection untouched.
 */
async function forwardPlainHttp(
  { head, target, framing, client, tally }: PlainExchange,
  upstream: Upstream,
  options: { retry: boolean },
): Promise<Forwarded | "no_response"> {
  const named = connectionTokens(head.headers);
  const kept = head.headers.filter(([name]) => {
    const lower = name.toLowerCase();
    return !HOP_BY_HOP.has(lower) && !lower.startsWith("proxy-") && !named.has(lower);
  });
  const clientKeepsAlive = head.version === "HTTP/1.1" && !named.has("close");
  const lines = [
    `${head.method} ${target.originForm} ${head.version}`,
    // Host comes from the URL that was checked, so a Host header cannot front for another site.
    `Host: ${target.hostHeader}`,
    ...kept.map(([name, value]) => `${name}: ${value}`),
    // An HTTP/1.1 client's `close` is for its own connection: the upstream one may be pooled.
    ...(head.version === "HTTP/1.1" ? [] : ["Connection: close"]),
  ];
  try {
    await writeAll(upstream.conn, latin1Encode(lines.join("\r\n") + "\r\n\r\n"));
  } catch (error) {
    if (options.retry) return "no_response";
    throw error;
  }

  // Body up, response down, at the same time: an upstream may answer before the body is sent.
  let bodySent = false;
  const sendBody = copyFramed(framing, client, upstream.conn).then(
    () => void (bodySent = true),
    () => {}, // a client that stops mid-body: the response (or its absence) says the rest
  );
  const response = await relayResponse(head.method, upstream.reader, client.conn, tally, {
    clientKeepsAlive,
    retry: options.retry,
  });
  if (response === "no_response") {
    await sendBody;
    return response;
  }
  // The client's connection carries another request only when this one ended exactly where its
  // framing said, and nothing came after it yet: requests are answered one at a time, and bytes
  // sent before this response was complete (pipelining, or a smuggling attempt) are never read.
  const keepAlive = response.keepAlive && bodySent && client.bufferedBytes === 0;
  if (!keepAlive) {
    // A client still sending a body is cut off when the connection closes.
    client.conn.close();
  }
  await sendBody;
  // The upstream's exchange is complete whatever the client does next: its own connection's
  // keep-alive does not decide the upstream's.
  return {
    status: response.status,
    keepAlive,
    upstreamReusable: bodySent && response.upstreamReusable,
  };
}

/** The lowercased tokens of every `Connection` header. */
function connectionTokens(headers: RequestHead["headers"]): Set<string> {
  return new Set(
    headers.filter(([n]) => n.toLowerCase() === "connection")
      .flatMap(([, v]) => v.split(",").map((token) => token.trim().toLowerCase())),
  );
}

/** Copy one message body, framed as `framing` says, from `from` to `to`, and nothing after it. */
async function copyFramed(
  framing: BodyFraming,
  from: BufferedConn,
  to: Deno.Conn,
  tally?: Tally,
): Promise<void> {
  if (framing.kind === "length") {
    await from.copyExactly(framing.bytes, to, tally);
  } else if (framing.kind === "chunked") {
    // Re-send the framing as received, but parse it so that we stop exactly at its end.
    const crlf = latin1Encode("\r\n");
    while (true) {
      const sizeLine = await from.readLine(MAX_CHUNK_LINE_BYTES);
      const size = /^[0-9a-fA-F]{1,8}$/.test(sizeLine.split(";")[0].trim())
        ? parseInt(sizeLine.split(";")[0], 16)
        : NaN;
      if (Number.isNaN(size)) throw new Error("invalid chunk size");
      await writeAll(to, latin1Encode(sizeLine + "\r\n"), tally);
      if (size === 0) break;
      await from.copyExactly(size, to, tally);
      if ((await from.readLine(MAX_CHUNK_LINE_BYTES)) !== "") {
        throw new Error("invalid chunk end");
      }
      await writeAll(to, crlf, tally);
    }
    // Trailers, then the empty line that ends the message.
    while (true) {
      const trailer = await from.readLine(MAX_CHUNK_LINE_BYTES);
      await writeAll(to, latin1Encode(trailer + "\r\n"), tally);
      if (trailer === "") break;
    }
  }
}

/** The upstream's response: a status line and headers, or what is wrong with them. */
interface ResponseHead {
  /** The status line as the upstream sent it. */
  line: string;
  version: string;
  status: number;
  headers: [name: string, value: string][];
}

const STATUS_LINE = /^(HTTP\/1\.[01]) (\d{3})(?: [^\r\n]*)?$/;

function parseResponseHead(text: string): ResponseHead | undefined {
  const lines = text.split("\r\n");
  const statusLine = STATUS_LINE.exec(lines[0]);
  if (!statusLine) return undefined;
  const headers: [string, string][] = [];
  for (const line of lines.slice(1)) {
    if (line === "") continue;
    const colon = line.indexOf(":");
    if (colon <= 0 || !TOKEN.test(line.slice(0, colon)) || /^[ \t]/.test(line)) return undefined;
    headers.push([line.slice(0, colon), line.slice(colon + 1).trim()]);
  }
  return { line: lines[0], version: statusLine[1], status: Number(statusLine[2]), headers };
}

/**
 * How a response body ends (RFC 9112 section 6.3): none (HEAD, 1xx, 204, 304), a length, the last
 * chunk, or the upstream closing ("close": also for framing that could be read two ways).
 */
function responseFraming(method: string, response: ResponseHead): BodyFraming | { kind: "close" } {
  const { status } = response;
  if (method === "HEAD" || status < 200 || status === 204 || status === 304) {
    return status === 101 ? { kind: "close" } : { kind: "none" };
  }
  try {
    const framing = bodyFraming(response.headers);
    // Neither length nor chunked: the body ends where the upstream closes (ibid., item 8).
    return framing.kind === "none" ? { kind: "close" } : framing;
  } catch {
    // Ambiguous or unsupported framing: read to the end, and reuse nothing after it.
    return { kind: "close" };
  }
}

/**
 * Relay the upstream's response (interim 1xx ones first) to the client, its head rewritten
 * without hop-by-hop headers and with `Connection: close` when the client's connection ends
 * after it. Until the upstream closes when its framing says nothing else.
 */
async function relayResponse(
  method: string,
  upstream: BufferedConn,
  clientConn: Deno.Conn,
  tally: Tally,
  options: { clientKeepsAlive: boolean; retry: boolean },
): Promise<
  { status: number | undefined; keepAlive: boolean; upstreamReusable: boolean } | "no_response"
> {
  let answered = false;
  while (true) {
    const bytes = await upstream.readHead(MAX_REQUEST_HEAD_BYTES).catch((error) => {
      if (options.retry && !answered) return "no_response" as const;
      throw error;
    });
    if (bytes === "no_response" || (bytes === "eof" && options.retry && !answered)) {
      return "no_response";
    }
    answered = true;
    if (bytes === "eof") return { status: undefined, keepAlive: false, upstreamReusable: false };
    const response = bytes === "too_large" ? undefined : parseResponseHead(latin1Decode(bytes));
    if (response === undefined) {
      // Not a response this proxy can frame: passed on as it is, until the upstream closes.
      if (bytes !== "too_large") await writeAll(clientConn, bytes, tally);
      await pumpRest(upstream, clientConn, tally);
      return {
        status: bytes === "too_large" ? undefined : parseStatus(bytes),
        keepAlive: false,
        upstreamReusable: false,
      };
    }
    const framing = responseFraming(method, response);
    const interim = response.status >= 100 && response.status < 200 && response.status !== 101;
    const keepAlive = options.clientKeepsAlive && framing.kind !== "close";
    await writeAll(clientConn, responseHeadBytes(response, interim || keepAlive), tally);
    if (interim) continue;
    if (framing.kind === "close") {
      await pumpRest(upstream, clientConn, tally);
    } else {
      await copyFramed(framing, upstream, clientConn, tally);
    }
    const upstreamKeepsAlive = response.version === "HTTP/1.1" &&
      !connectionTokens(response.headers).has("close");
    return {
      status: response.status,
      keepAlive,
      // Bytes the upstream sent past its response were not asked for: nothing more is read there.
      upstreamReusable: framing.kind !== "close" && upstreamKeepsAlive &&
        upstream.bufferedBytes === 0,
    };
  }
}

/** A response head without hop-by-hop headers; `Connection: close` unless `keepAlive`. */
function responseHeadBytes(response: ResponseHead, keepAlive: boolean): Uint8Array {
  const named = connectionTokens(response.headers);
  const kept = response.headers.filter(([name]) => {
    const lower = name.toLowerCase();
    return !["connection", "keep-alive", "proxy-connection"].includes(lower) && !named.has(lower);
  });
  const lines = [
    response.line,
    ...kept.map(([name, value]) => `${name}: ${value}`),
    ...(keepAlive ? [] : ["Connection: close"]),
  ];
  return latin1Encode(lines.join("\r\n") + "\r\n\r\n");
}

/** What `from` has buffered, then everything it sends until it closes. */
async function pumpRest(from: BufferedConn, to: Deno.Conn, tally: Tally): Promise<void> {
  await from.settle();
  const early = from.takeBuffered();
  if (early.length > 0) await writeAll(to, early, tally);
  const buffer = new PipeBuffer();
  while (true) {
    const chunk = await buffer.readFrom(from.conn);
    if (chunk === null) return;
    await writeAll(to, chunk, tally);
  }
}

/** A read buffer that doubles while reads fill it, up to MAX_PIPE_BUFFER_BYTES. */
class PipeBuffer {
  #bytes = new Uint8Array(READ_BUFFER_BYTES);

  /** The bytes of one read (valid until the next), or null at end of stream. */
  async readFrom(conn: Deno.Conn): Promise<Uint8Array | null> {
    const n = await conn.read(this.#bytes);
    if (n === null) return null;
    const chunk = this.#bytes.subarray(0, n);
    if (n === this.#bytes.length && n < MAX_PIPE_BUFFER_BYTES) {
      // The old buffer stays alive as `chunk` until the caller has written it.
      this.#bytes = new Uint8Array(n * 2);
    }
    return chunk;
  }
}

function parseStatus(chunk: Uint8Array): number | undefined {
  const match = /^HTTP\/\d\.\d (\d{3})/.exec(latin1Decode(chunk.subarray(0, 16)));
  return match ? Number(match[1]) : undefined;
}

/** Pipe both ways until both sides have finished sending; half-closes are passed on. */
async function tunnel(client: BufferedConn, upstream: Deno.Conn, tally: Tally): Promise<void> {
  const up = (async () => {
    // Bytes the client sent right after CONNECT (a TLS ClientHello) were read with the head.
    const early = client.takeBuffered();
    if (early.length > 0) await writeAll(upstream, early);
    await pump(client.conn, upstream, (n) => (tally.bytesOut += n));
  })();
  const down = pump(upstream, client.conn, (n) => (tally.bytesIn += n));
  try {
    await Promise.all([up, down]);
  } catch (error) {
    // One side failed: end both, so the other direction does not wait forever.
    closeQuietly(client.conn);
    closeQuietly(upstream);
    await Promise.allSettled([up, down]);
    throw error;
  }
}

async function pump(from: Deno.Conn, to: Deno.Conn, count: (n: number) => void): Promise<void> {
  const buffer = new PipeBuffer();
  while (true) {
    const chunk = await buffer.readFrom(from);
    if (chunk === null) break;
    count(chunk.length);
    await writeAll(to, chunk);
  }
  // Fails only when `to` is already closed (the other direction failed) or reset by its peer:
  // nothing more can be sent on it, and the other direction's read from it ends that pump too.
  await to.closeWrite().catch(() => {});
}

/** Reads from the client with a buffer, so that what was read past the head is not lost. */
class BufferedConn {
  #buffered = new Uint8Array(0);
  /** A read started while idle (`watchIdle`), which the next read takes over. */
  #pending: Promise<boolean> | undefined;

  /** Counts what is read (`bytesOut`: on the client's connection, what the sandbox sent). */
  constructor(readonly conn: Deno.Conn, public tally: Tally) {}

  /** How many bytes were read and not yet consumed. */
  get bufferedBytes(): number {
    return this.#buffered.length;
  }

  /**
   * Start reading while nothing is expected: settles when something arrives or the stream ends
   * (or fails). What it reads is kept for the next reader.
   */
  watchIdle(): Promise<boolean> {
    this.#pending ??= this.#read();
    return this.#pending;
  }

  /** Let the read started by `watchIdle` finish, so that nothing reads the connection beside it. */
  async settle(): Promise<void> {
    if (this.#pending !== undefined) await this.#fill();
  }

  /** Read more into the buffer; false at end of stream. */
  #fill(): Promise<boolean> {
    const pending = this.#pending;
    this.#pending = undefined;
    return pending ?? this.#read();
  }

  async #read(): Promise<boolean> {
    const chunk = new Uint8Array(READ_BUFFER_BYTES);
    const n = await this.conn.read(chunk);
    if (n === null) return false;
    this.tally.bytesOut += n;
    const joined = new Uint8Array(this.#buffered.length + n);
    joined.set(this.#buffered);
    joined.set(chunk.subarray(0, n), this.#buffered.length);
    this.#buffered = joined;
    return true;
  }

  /** The head up to and including the blank line. */
  async readHead(maxBytes: number): Promise<Uint8Array | "eof" | "too_large"> {
    let searchFrom = 0;
    while (true) {
      const end = indexOfBlankLine(this.#buffered, searchFrom);
      if (end !== -1) return end > maxBytes ? "too_large" : this.#take(end);
      if (this.#buffered.length > maxBytes) return "too_large";
      searchFrom = Math.max(0, this.#buffered.length - 3);
      if (!(await this.#fill())) return "eof";
    }
  }

  /** One CRLF-terminated line, without the CRLF. */
  async readLine(maxBytes: number): Promise<string> {
    while (true) {
      const newline = this.#buffered.indexOf(0x0a);
      if (newline !== -1) {
        const line = latin1Decode(this.#take(newline + 1));
        if (!line.endsWith("\r\n")) throw new Error("bare LF in chunked framing");
        return line.slice(0, -2);
      }
      if (this.#buffered.length > maxBytes) throw new Error("line too long");
      if (!(await this.#fill())) throw new Error("unexpected end of stream");
    }
  }

  /**
   * Copy exactly `count` bytes to `to` (written bytes counted as `bytesIn` of `tally`, if given).
   * Past what is buffered, reads go straight into a growing pipe buffer, and what one of them
   * brings past `count` is kept buffered for the next reader.
   */
  async copyExactly(count: number, to: Deno.Conn, tally?: Tally): Promise<void> {
    if (count > this.#buffered.length) await this.settle();
    let remaining = count;
    if (remaining > 0 && this.#buffered.length > 0) {
      const piece = this.#take(Math.min(remaining, this.#buffered.length));
      await writeAll(to, piece, tally);
      remaining -= piece.length;
    }
    const buffer = remaining > 0 ? new PipeBuffer() : undefined;
    while (buffer && remaining > 0) {
      const chunk = await buffer.readFrom(this.conn);
      if (chunk === null) throw new Error("unexpected end of stream");
      this.tally.bytesOut += chunk.length;
      const piece = chunk.subarray(0, Math.min(remaining, chunk.length));
      if (piece.length < chunk.length) this.#buffered = chunk.slice(piece.length);
      await writeAll(to, piece, tally);
      remaining -= piece.length;
    }
  }

  /** Everything buffered and not yet consumed. */
  takeBuffered(): Uint8Array {
    return this.#take(this.#buffered.length);
  }

  #take(count: number): Uint8Array {
    const taken = this.#buffered.slice(0, count);
    this.#buffered = this.#buffered.slice(count);
    return taken;
  }
}

/** Index just past the first "\r\n\r\n", or -1. */
function indexOfBlankLine(bytes: Uint8Array, from: number): number {
  for (let i = from; i + 3 < bytes.length; i++) {
    if (
      bytes[i] === 0x0d && bytes[i + 1] === 0x0a && bytes[i + 2] === 0x0d && bytes[i + 3] === 0x0a
    ) {
      return i + 4;
    }
  }
  return -1;
}

const REASON_PHRASES: Record<number, string> = {
  400: "Bad Request",
  403: "Forbidden",
  431: "Request Header Fields Too Large",
  502: "Bad Gateway",
};

/** A complete response with a text body an agent can read and act on. */
function errorResponse(status: number, message: string): Uint8Array {
  const body = new TextEncoder().encode(`sandbox egress proxy: ${message}\n`);
  const head = [
    `HTTP/1.1 ${status} ${REASON_PHRASES[status] ?? "Error"}`,
    "Content-Type: text/plain; charset=utf-8",
    `Content-Length: ${body.length}`,
    "Connection: close",
    "",
    "",
  ].join("\r\n");
  const bytes = new Uint8Array(head.length + body.length);
  bytes.set(latin1Encode(head));
  bytes.set(body, head.length);
  return bytes;
}

/**
 * Half-close after an error response and drain what the client is still sending. Closing a
 * socket with unread input makes the kernel send a reset, which can destroy the response before
 * the client reads it; the client would never learn why it was refused.
 */
async function lingeringClose(conn: Deno.Conn, tally: Tally): Promise<void> {
  // Fails only when the client already closed or reset the connection: nothing is left to
  // deliver, and the drain below ends at once (or the timer closes it).
  await conn.closeWrite().catch(() => {});
  const giveUp = setTimeout(() => closeQuietly(conn), LINGER_MS);
  const buffer = new Uint8Array(READ_BUFFER_BYTES);
  try {
    let drained = 0;
    while (drained < LINGER_MAX_BYTES) {
      const n = await conn.read(buffer);
      if (n === null) break;
      drained += n;
      tally.bytesOut += n;
    }
  } catch {
    // Closed by the timer, or reset by the client: either way we are done.
  } finally {
    clearTimeout(giveUp);
  }
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array, tally?: Tally): Promise<void> {
  let rest = bytes;
  while (rest.length > 0) {
    const n = await conn.write(rest);
    rest = rest.subarray(n);
    if (tally) tally.bytesIn += n;
  }
}

/** HTTP heads are bytes; latin1 maps each byte to one char and back without loss. */
function latin1Decode(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 8192) {
    text += String.fromCharCode(...bytes.subarray(i, i + 8192));
  }
  return text;
}

function latin1Encode(text: string): Uint8Array {
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i) & 0xff;
  return bytes;
}

function isPortNumber(text: string): boolean {
  return /^\d{1,5}$/.test(text) && Number(text) >= 1 && Number(text) <= 65_535;
}

function errorName(error: unknown): string {
  return error instanceof Error ? error.name : "unknown error";
}

/**
 * Small writes (a response head, then its body) go out at once: with Nagle's algorithm, a kept-alive
 * connection would wait for the peer's delayed ACK (40 ms) on each request.
 */
function noDelay(conn: Deno.Conn): void {
  // Unix socket connections have no such option.
  if ("setNoDelay" in conn && typeof conn.setNoDelay === "function") conn.setNoDelay(true);
}

function closeQuietly(resource: { close(): void }): void {
  try {
    resource.close();
  } catch {
    // Already closed.
  }
}
