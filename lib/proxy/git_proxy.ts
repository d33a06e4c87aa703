/**
 * The git proxy: smart HTTP from the sandbox to a real remote, with the user's credentials
 * attached on the host. The sandbox authenticates with its session token; the remote's token
 * never enters it. Exactly three endpoints exist (see `parseGitRoute`), named by the path alone;
 * the request forwarded to the remote is rebuilt from that one reading, never copied from the
 * sandbox's target.
 *
 * A session without a push grant gets no receive-pack at all. With one, a push may update exactly
 * one ref, the run's branch: the command section at the head of the request (at most
 * `MAX_COMMAND_BYTES`, gzip decoded) is read and checked before anything is forwarded, and the
 * checked bytes are what the remote receives, followed by the pack, streamed. Nothing is held
 * whole in this process: request and response bodies stream through.
 *
 *   GET  /git/info/refs?service=git-upload-pack|git-receive-pack
 *   POST /git/git-upload-pack
 *   POST /git/git-receive-pack
 */
import type { AccessLog } from "./access_log.ts";
import { assertListenOn, formatHostForUrl } from "./egress_proxy.ts";
import {
  type GitRoute,
  parseGitRoute,
  PushFormatError,
  pushViolation,
  requestTarget,
  scanPushCommands,
} from "./git_protocol.ts";
import { closeOnAbort } from "../process.ts";
import type { Redactor } from "../redact.ts";

export { parseGitRoute, parseRefUpdates, pushViolation, type RefUpdate } from "./git_protocol.ts";

export const GIT_PATH_PREFIX = "/git";
/** The command section of a push is read before deciding; a longer one is refused (413). */
export const MAX_COMMAND_BYTES = 1024 * 1024;
/** The request target as logged: long enough for any real git request, bounded for an attack. */
const MAX_LOGGED_TARGET = 2_000;

export interface GitRemote {
  /** The real remote, e.g. "https://github.com/org/repo.git". */
  url: string;
  /** `Authorization` header value for the remote, or undefined for anonymous access. */
  authorization: () => Promise<string | undefined>;
  /** The one ref a push may update (e.g. "refs/heads/sandbox/run-1"), or false: no push at all. */
  push: string | false;
}

export interface GitProxyOptions {
  hostnames: string[];
  /** Listen on this Unix socket instead of TCP (`hostnames` must then be empty). */
  path?: string;
  /** Session token → remote. */
  grants: Map<string, GitRemote>;
  log?: AccessLog;
  redactor?: Redactor;
  profile: string;
  runId: string | null;
  signal?: AbortSignal;
  /** How long the sandbox may take to send a push's command section (default 60 s). */
  commandTimeoutMs?: number;
}

export interface GitProxy extends AsyncDisposable {
  /** The TCP port; 0 when listening on a Unix socket. */
  port: number;
  /** The remote URL the sandbox uses: `http://host:port/git`. */
  url(hostname: string): string;
  close(): Promise<void>;
}

/** A request refused before anything reached the remote. */
class Refusal extends Error {
  constructor(readonly status: number, readonly reason: string) {
    super(reason);
  }
}

function tokenOf(req: Request): string | undefined {
  const auth = req.headers.get("authorization") ?? "";
  const bearer = /^Bearer\s+(\S+)$/i.exec(auth);
  if (bearer) return bearer[1];
  const basic = /^Basic\s+(\S+)$/i.exec(auth);
  if (basic) {
    try {
      const decoded = atob(basic[1]);
      return decoded.slice(decoded.indexOf(":") + 1);
    } catch {
      return undefined;
    }
  }
  return undefined;
}

function refuse(status: number, message: string): Response {
  return new Response(`sandbox git proxy: ${message}\n`, {
    status,
    headers: { "content-type": "text/plain" },
  });
}

/**
 * A stream of `head` then the rest of `reader`, pulled on demand with a few chunks of read-ahead
 * (so the sandbox's upload goes at the remote's pace and this process holds at most a few
 * chunks), counting bytes and reporting its end exactly once.
 */
function chain(
  head: Uint8Array | undefined,
  reader: ReadableStreamDefaultReader<Uint8Array>,
  onBytes: (count: number) => void,
  onEnd: () => void = () => {},
): ReadableStream<Uint8Array> {
  let pending = head && head.byteLength > 0 ? head : undefined;
  let ended = false;
  const end = () => {
    if (ended) return;
    ended = true;
    onEnd();
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (pending) {
        onBytes(pending.byteLength);
        controller.enqueue(pending);
        pending = undefined;
        return;
      }
      try {
        const { value, done } = await reader.read();
        if (done) {
          end();
          controller.close();
          return;
        }
        onBytes(value.byteLength);
        controller.enqueue(value);
      } catch (error) {
        end();
        controller.error(error);
      }
    },
    async cancel(reason) {
      end();
      // Cancelling fails only for a source that already ended or failed: nothing to stop.
      await reader.cancel(reason).catch(() => {});
    },
  }, { highWaterMark: 4 });
}

/**
 * Read from `reader` until the push's command section is complete; return what was read (the
 * section and whatever followed it in the last chunk) and the parsed commands.
 */
async function readCommandSection(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  timeoutMs: number,
): Promise<{ buffered: Uint8Array; commands: NonNullable<ReturnType<typeof scanPushCommands>> }> {
  let buffered = new Uint8Array(0);
  const deadline = Date.now() + timeoutMs;
  while (true) {
    let commands;
    try {
      commands = scanPushCommands(buffered);
    } catch (error) {
      if (error instanceof PushFormatError) {
        throw new Refusal(403, `push refused: ${error.message}`);
      }
      throw error;
    }
    if (commands ? commands.end > MAX_COMMAND_BYTES : buffered.byteLength >= MAX_COMMAND_BYTES) {
      throw new Refusal(
        413,
        `push refused: its command section exceeds ${MAX_COMMAND_BYTES} bytes`,
      );
    }
    if (commands) return { buffered, commands };
    let timer: ReturnType<typeof setTimeout> | undefined;
    const expired = new Promise<never>((_, reject) => {
      const late = () =>
        reject(new Refusal(408, "push refused: its command section did not arrive in time"));
      timer = setTimeout(late, Math.max(0, deadline - Date.now()));
    });
    let chunk: ReadableStreamReadResult<Uint8Array>;
    try {
      chunk = await Promise.race([reader.read(), expired]);
    } catch (error) {
      if (error instanceof Refusal) throw error;
      throw new Refusal(400, `push refused: unreadable request body (${(error as Error).message})`);
    } finally {
      clearTimeout(timer);
    }
    if (chunk.done) {
      throw new Refusal(403, "push refused: the request ends inside its command list");
    }
    const grown = new Uint8Array(buffered.byteLength + chunk.value.byteLength);
    grown.set(buffered);
    grown.set(chunk.value, buffered.byteLength);
    buffered = grown;
  }
}

/** Start the git proxy on `hostnames` (same port each; never all interfaces). */
export function startGitProxy(options: GitProxyOptions): Promise<GitProxy> {
  assertListenOn(options);
  const handler = (req: Request): Promise<Response> => handleGitRequest(req, options);

  const servers: Deno.HttpServer<Deno.Addr>[] = [];
  let port = 0;
  try {
    if (options.path !== undefined) {
      servers.push(Deno.serve({ path: options.path, onListen: () => {} }, handler));
    }
    for (const hostname of options.hostnames) {
      const server = Deno.serve({ hostname, port, onListen: () => {} }, handler);
      servers.push(server);
      port = server.addr.port;
    }
  } catch (error) {
    for (const server of servers) void server.shutdown();
    return Promise.reject(error);
  }
  let closed: Promise<void> | undefined;
  let detach = () => {};
  const close = () =>
    closed ??= (async () => {
      detach();
      await Promise.all(servers.map((server) => server.shutdown()));
    })();
  detach = closeOnAbort(options.signal, close);
  return Promise.resolve({
    port,
    url: (hostname: string) => `http://${formatHostForUrl(hostname)}:${port}${GIT_PATH_PREFIX}`,
    close,
    [Symbol.asyncDispose]: close,
  });
}

/**
 * What the access log says of one request, filled in as the request is decided. The request
 * body's reader, once one was taken, is kept here too: a refusal cancels it.
 */
interface GitExchange {
  route?: GitRoute;
  status: number;
  decision: "allow" | "deny";
  reason?: string;
  bytesIn: number;
  bytesOut: number;
  sourceReader?: ReadableStreamDefaultReader<Uint8Array>;
  /** The response streams the remote's body: the entry is written when that ends, not before. */
  logWhenBodyEnds: boolean;
}

/** The exchange's log entry, written once (`write` again does nothing). */
function gitLogWriter(
  req: Request,
  target: string,
  remote: GitRemote | undefined,
  exchange: GitExchange,
  options: GitProxyOptions,
): () => void {
  const started = performance.now();
  let logged = false;
  return () => {
    if (logged) return;
    logged = true;
    let remoteUrl = new URL("http://unknown/");
    try {
      if (remote) remoteUrl = new URL(remote.url);
    } catch { /* a remote URL that does not parse is logged as unknown */ }
    const { route, decision, status, bytesIn, bytesOut, reason } = exchange;
    options.log?.write({
      time: new Date().toISOString(),
      kind: "git",
      decision,
      method: req.method,
      host: remoteUrl.hostname,
      port: Number(remoteUrl.port || (remoteUrl.protocol === "https:" ? 443 : 80)),
      ...(route ? { path: `${remoteUrl.pathname.replace(/\/+$/, "")}${route.suffix}` } : {}),
      target: target.length > MAX_LOGGED_TARGET ? `${target.slice(0, MAX_LOGGED_TARGET)}…` : target,
      status,
      bytesIn,
      bytesOut,
      durationMs: Math.round(performance.now() - started),
      profile: options.profile,
      runId: options.runId,
      ...(reason ? { reason } : {}),
    });
  };
}

/**
 * One request from the sandbox. Every outcome is logged once, when it has ended: refusals at
 * once, forwarded requests when the response body has been streamed (or abandoned).
 */
export async function handleGitRequest(req: Request, options: GitProxyOptions): Promise<Response> {
  const target = requestTarget(req.url);
  const token = tokenOf(req);
  const remote = token ? options.grants.get(token) : undefined;
  const exchange: GitExchange = {
    status: 0,
    decision: "deny",
    bytesIn: 0,
    bytesOut: 0,
    logWhenBodyEnds: false,
  };
  const writeLog = gitLogWriter(req, target, remote, exchange, options);
  try {
    if (!remote) {
      exchange.status = 401;
      exchange.reason = "missing or unknown session token";
      // The body is not wanted; a client already gone makes cancelling fail, harmlessly.
      await req.body?.cancel().catch(() => {});
      return new Response("sandbox git proxy: authentication required\n", {
        status: exchange.status,
        headers: { "www-authenticate": 'Basic realm="sandbox"' },
      });
    }
    const decided = parseGitRoute(req.method, target, GIT_PATH_PREFIX);
    if (!decided.ok) throw new Refusal(decided.status, decided.reason);
    const route = exchange.route = decided.route;
    if (route.service === "git-receive-pack" && remote.push === false) {
      throw new Refusal(403, `push refused: ${pushViolation([], false)}`);
    }
    const headers = forwardedRequestHeaders(req, route);
    const body = route.kind === "rpc"
      ? await checkedRequestBody(req, route, remote, headers, exchange, options)
      : undefined;
    return await forwardToRemote(
      req,
      { remote, route, headers, body },
      exchange,
      writeLog,
      options,
    );
  } catch (error) {
    // Whatever was left of the request body is not wanted; cancelling one already ended fails,
    // harmlessly.
    await (exchange.sourceReader ? exchange.sourceReader.cancel() : req.body?.cancel())
      ?.catch(() => {});
    if (error instanceof Refusal) {
      exchange.status = error.status;
      exchange.reason = error.reason;
      return refuse(exchange.status, exchange.reason);
    }
    // Not the sandbox's doing (the credential source failed, say): say so without any secret.
    exchange.status = 502;
    const message = options.redactor
      ? options.redactor.redact((error as Error).message ?? String(error))
      : "error";
    exchange.reason = `cannot forward: ${message.slice(0, 200)}`;
    return refuse(exchange.status, "cannot forward the request to the remote");
  } finally {
    if (!exchange.logWhenBodyEnds) writeLog();
  }
}

/**
 * The request headers the remote gets: an allowlist (the sandbox's token and everything else stay
 * behind). Protocol v2 is for fetches; receive-pack speaks v0 only, the format the command check
 * reads.
 */
function forwardedRequestHeaders(req: Request, route: GitRoute): Headers {
  const headers = new Headers();
  for (const name of ["accept", "user-agent"]) {
    const value = req.headers.get(name);
    if (value) headers.set(name, value);
  }
  const protocol = req.headers.get("git-protocol");
  if (protocol && route.service === "git-upload-pack") {
    if (!/^[A-Za-z0-9=:._-]{1,100}$/.test(protocol)) {
      throw new Refusal(400, "malformed Git-Protocol header");
    }
    headers.set("git-protocol", protocol);
  }
  return headers;
}

/**
 * The body of an RPC request, as the remote gets it (its content type and encoding headers set on
 * `headers`). A push's ref updates are read and checked against the grant before a byte goes out,
 * and the remote gets the decoded bytes that were checked; throws `Refusal` otherwise.
 */
async function checkedRequestBody(
  req: Request,
  route: GitRoute,
  remote: GitRemote,
  headers: Headers,
  exchange: GitExchange,
  options: GitProxyOptions,
): Promise<ReadableStream<Uint8Array>> {
  const expected = `application/x-${route.service}-request`;
  const contentType = req.headers.get("content-type");
  if (contentType !== expected) {
    throw new Refusal(
      415,
      `POST ${route.service} needs content type "${expected}", not "${
        (contentType ?? "").slice(0, 100)
      }"`,
    );
  }
  headers.set("content-type", contentType);
  const encoding = (req.headers.get("content-encoding") ?? "").toLowerCase();
  if (encoding !== "" && encoding !== "gzip" && encoding !== "x-gzip") {
    throw new Refusal(
      415,
      `content encoding "${encoding.slice(0, 100)}" is not accepted (only gzip)`,
    );
  }
  const source = req.body ?? new Blob([]).stream();
  const count = (n: number) => exchange.bytesOut += n;
  if (route.service !== "git-receive-pack") {
    if (encoding) headers.set("content-encoding", encoding);
    exchange.sourceReader = source.getReader();
    return chain(undefined, exchange.sourceReader, count);
  }
  // The remote gets the decoded bytes that were checked, never a second reading of them.
  const decoded = encoding ? source.pipeThrough(new DecompressionStream("gzip")) : source;
  const sourceReader = exchange.sourceReader = decoded.getReader();
  const { buffered, commands } = await readCommandSection(
    sourceReader,
    options.commandTimeoutMs ?? 60_000,
  );
  const violation = pushViolation(commands.updates, remote.push);
  if (violation) throw new Refusal(403, `push refused: ${violation}`);
  return chain(buffered, sourceReader, count);
}

/**
 * Sends the decided request to the remote with the user's credentials, and passes its answer
 * back: only the listed response headers, redirects not followed, the body streamed (the log
 * entry is written when it ends).
 */
async function forwardToRemote(
  req: Request,
  request: {
    remote: GitRemote;
    route: GitRoute;
    headers: Headers;
    body: ReadableStream<Uint8Array> | undefined;
  },
  exchange: GitExchange,
  writeLog: () => void,
  options: GitProxyOptions,
): Promise<Response> {
  const { remote, route, headers, body } = request;
  const authorization = await remote.authorization();
  if (authorization) headers.set("authorization", authorization);
  let upstream: Response;
  try {
    upstream = await fetch(`${remote.url.replace(/\/+$/, "")}${route.suffix}`, {
      method: req.method,
      headers,
      body,
      redirect: "manual",
      signal: req.signal,
    });
  } catch (error) {
    exchange.status = 502;
    exchange.reason = "cannot reach the remote";
    const message = options.redactor ? options.redactor.redact((error as Error).message) : "error";
    return refuse(exchange.status, `cannot reach the remote (${message.slice(0, 200)})`);
  }
  const status = exchange.status = upstream.status;
  exchange.decision = "allow";
  const out = new Headers();
  for (const name of ["content-type", "cache-control", "expires", "pragma"]) {
    const value = upstream.headers.get(name);
    if (value) out.set(name, value);
  }
  // The remote's own auth challenge would make the sandbox's git ask for credentials it has not.
  if (status === 401 || status === 403) exchange.reason = "the remote refused the credentials";
  if (!upstream.body) return new Response(null, { status, headers: out });
  exchange.logWhenBodyEnds = true;
  return new Response(
    chain(undefined, upstream.body.getReader(), (n) => exchange.bytesIn += n, writeLog),
    { status, headers: out },
  );
}
