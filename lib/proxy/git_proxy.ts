/**
 * The git proxy: smart HTTP from the sandbox to a real remote, with the user's credentials
 * attached on the host. The sandbox authenticates with its session token; the remote's token
 * never enters it. Pushes may update exactly one ref, the run's branch: the ref updates in a
 * receive-pack request (pkt-lines before the pack) are checked before anything is forwarded.
 *
 *   GET  /git/info/refs?service=git-upload-pack|git-receive-pack
 *   POST /git/git-upload-pack
 *   POST /git/git-receive-pack
 */
import type { AccessLog } from "./access_log.ts";
import { assertListenHostnames, formatHostForUrl } from "./egress_proxy.ts";
import { closeOnAbort } from "../process.ts";
import type { Redactor } from "../redact.ts";

export const GIT_PATH_PREFIX = "/git";
/** A push body is held whole to check its commands; this bounds it. */
const MAX_PUSH_BYTES = 512 * 1024 * 1024;
const ZERO_ID = /^0{40}$/;

export interface GitRemote {
  /** The real remote, e.g. "https://github.com/org/repo.git". */
  url: string;
  /** `Authorization` header value for the remote, or undefined for anonymous access. */
  authorization: () => Promise<string | undefined>;
  /** The one ref pushes may update, e.g. "refs/heads/sandbox/run-1". */
  pushRef: string;
}

export interface GitProxyOptions {
  hostnames: string[];
  /** Session token → remote. */
  grants: Map<string, GitRemote>;
  log?: AccessLog;
  redactor?: Redactor;
  profile: string;
  runId: string | null;
  signal?: AbortSignal;
}

export interface GitProxy extends AsyncDisposable {
  port: number;
  /** The remote URL the sandbox uses: `http://host:port/git`. */
  url(hostname: string): string;
  close(): Promise<void>;
}

/** A parsed ref update of a push: "<old> <new> <ref>". */
export interface RefUpdate {
  old: string;
  new: string;
  ref: string;
}

/**
 * The ref updates at the start of a receive-pack request body (pkt-lines up to the first flush).
 * Raises on malformed framing: a push we cannot read is a push we refuse.
 */
export function parseRefUpdates(body: Uint8Array): RefUpdate[] {
  const decoder = new TextDecoder();
  const updates: RefUpdate[] = [];
  let offset = 0;
  while (true) {
    if (offset + 4 > body.length) throw new Error("truncated pkt-line");
    const length = Number.parseInt(decoder.decode(body.subarray(offset, offset + 4)), 16);
    if (Number.isNaN(length)) throw new Error("malformed pkt-line length");
    if (length === 0) return updates;
    if (length < 4 || offset + length > body.length) throw new Error("malformed pkt-line");
    let line = decoder.decode(body.subarray(offset + 4, offset + length));
    offset += length;
    line = line.split("\0")[0].replace(/\n$/, "");
    if (line.startsWith("shallow ") || line.startsWith("push-cert")) continue;
    const [old, next, ref, ...rest] = line.split(" ");
    if (!old || !next || !ref || rest.length > 0) throw new Error(`malformed ref update "${line.slice(0, 100)}"`);
    updates.push({ old, new: next, ref });
  }
}

/** Why a push must be refused, or undefined when it only updates `allowed`. */
export function pushViolation(updates: RefUpdate[], allowed: string): string | undefined {
  if (updates.length === 0) return "a push with no ref updates";
  for (const update of updates) {
    if (update.ref !== allowed) return `updating "${update.ref}": this run may push only "${allowed}"`;
    if (ZERO_ID.test(update.new)) return `deleting "${update.ref}"`;
  }
  return undefined;
}

function tokenOf(req: Request): string | undefined {
  const auth = req.headers.get("authorization") ?? "";
  const bearer = /^Bearer\s+(\S+)$/i.exec(auth);
  if (bearer) return bearer[1];
  const basic = /^Basic\s+(\S+)$/i.exec(auth);
  if (basic) {
    try {
      const [, password] = atob(basic[1]).split(":");
      return password;
    } catch {
      return undefined;
    }
  }
  return undefined;
}

async function readCapped(req: Request, limit: number): Promise<Uint8Array | undefined> {
  let stream = req.body;
  if (!stream) return new Uint8Array();
  if ((req.headers.get("content-encoding") ?? "").toLowerCase() === "gzip") {
    stream = stream.pipeThrough(new DecompressionStream("gzip"));
  }
  const chunks: Uint8Array[] = [];
  let total = 0;
  for await (const chunk of stream) {
    total += chunk.byteLength;
    if (total > limit) return undefined;
    chunks.push(chunk);
  }
  const body = new Uint8Array(total);
  let at = 0;
  for (const chunk of chunks) {
    body.set(chunk, at);
    at += chunk.byteLength;
  }
  return body;
}

function refuse(status: number, message: string): Response {
  return new Response(`sandbox git proxy: ${message}\n`, { status, headers: { "content-type": "text/plain" } });
}

/** Start the git proxy on `hostnames` (same port each; never all interfaces). */
export function startGitProxy(options: GitProxyOptions): Promise<GitProxy> {
  assertListenHostnames(options.hostnames);
  const handler = async (req: Request): Promise<Response> => {
    const started = performance.now();
    const url = new URL(req.url);
    const suffix = url.pathname.startsWith(`${GIT_PATH_PREFIX}/`) ? url.pathname.slice(GIT_PATH_PREFIX.length) : "";
    const service = url.searchParams.get("service") ?? suffix.slice(1);
    let status = 0;
    let decision: "allow" | "deny" = "deny";
    let reason: string | undefined;
    let bytesOut = 0;
    try {
      const token = tokenOf(req);
      const remote = token ? options.grants.get(token) : undefined;
      if (!remote) {
        status = 401;
        reason = "missing or unknown session token";
        return new Response("sandbox git proxy: authentication required\n", {
          status,
          headers: { "www-authenticate": 'Basic realm="sandbox"' },
        });
      }
      const route = suffix === "/info/refs" && req.method === "GET"
        ? "refs"
        : (suffix === "/git-upload-pack" || suffix === "/git-receive-pack") && req.method === "POST"
        ? "rpc"
        : undefined;
      if (!route || (service !== "git-upload-pack" && service !== "git-receive-pack")) {
        status = 404;
        reason = "not a smart HTTP route";
        return refuse(status, `no route ${req.method} ${url.pathname}`);
      }
      let body: Uint8Array | undefined;
      if (route === "rpc") {
        body = await readCapped(req, MAX_PUSH_BYTES);
        if (!body) {
          status = 413;
          reason = "request too large";
          return refuse(status, "request too large");
        }
        bytesOut = body.byteLength;
        if (service === "git-receive-pack") {
          let violation: string | undefined;
          try {
            violation = pushViolation(parseRefUpdates(body), remote.pushRef);
          } catch (error) {
            violation = `unreadable push: ${(error as Error).message}`;
          }
          if (violation) {
            status = 403;
            reason = violation;
            return refuse(status, `push refused: ${violation}`);
          }
        }
      }
      const headers = new Headers();
      for (const name of ["content-type", "accept", "git-protocol", "user-agent"]) {
        const value = req.headers.get(name);
        if (value) headers.set(name, value);
      }
      const authorization = await remote.authorization();
      if (authorization) headers.set("authorization", authorization);
      const target = `${remote.url.replace(/\/+$/, "")}${suffix}${url.search}`;
      const upstream = await fetch(target, {
        method: req.method,
        headers,
        body: body as BodyInit | undefined,
        redirect: "manual",
        signal: req.signal,
      });
      status = upstream.status;
      decision = "allow";
      const out = new Headers();
      for (const name of ["content-type", "cache-control", "expires", "pragma"]) {
        const value = upstream.headers.get(name);
        if (value) out.set(name, value);
      }
      // The remote's own auth challenge would make the sandbox's git ask for credentials it has not.
      if (status === 401 || status === 403) reason = "the remote refused the credentials";
      return new Response(upstream.body, { status, headers: out });
    } catch (error) {
      status = 502;
      reason = "cannot reach the remote";
      const message = options.redactor ? options.redactor.redact((error as Error).message) : "error";
      return refuse(status, `cannot reach the remote (${message.slice(0, 200)})`);
    } finally {
      const remoteUrl = (() => {
        try {
          const token = tokenOf(req);
          return token ? new URL(options.grants.get(token)?.url ?? "http://unknown/") : new URL("http://unknown/");
        } catch {
          return new URL("http://unknown/");
        }
      })();
      options.log?.write({
        time: new Date().toISOString(),
        kind: "git",
        decision,
        method: req.method,
        host: remoteUrl.hostname,
        port: Number(remoteUrl.port || (remoteUrl.protocol === "https:" ? 443 : 80)),
        path: `${remoteUrl.pathname.replace(/\/+$/, "")}${suffix}`,
        status,
        bytesIn: 0,
        bytesOut,
        durationMs: Math.round(performance.now() - started),
        profile: options.profile,
        runId: options.runId,
        ...(reason ? { reason } : {}),
      });
    }
  };

  const servers: Deno.HttpServer<Deno.NetAddr>[] = [];
  let port = 0;
  try {
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
