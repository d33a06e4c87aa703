/**
 * What the git proxy reads of git's smart HTTP protocol, and nothing more: which endpoint a
 * request target names, and the ref-update commands at the head of a receive-pack request.
 *
 * One reading of an input: the service is decided from the path alone, as `git http-backend`
 * (and every git host) routes on PATH_INFO, and a target that could be read another way —
 * percent-encoding, dot segments, doubled slashes, a query on a POST — is refused rather than
 * interpreted. The command parser follows `receive-pack.c` (`read_head_info`, `queue_command`)
 * byte for byte where it matters: a packet that git would read differently is refused.
 */

export type GitService = "git-upload-pack" | "git-receive-pack";

/** One of the three smart-HTTP endpoints, with the canonical suffix forwarded to the remote. */
export interface GitRoute {
  kind: "advertisement" | "rpc";
  service: GitService;
  /** Appended to the remote's URL: `/info/refs?service=…` or `/git-…-pack`. */
  suffix: string;
}

export type GitRouteDecision =
  | { ok: true; route: GitRoute }
  | { ok: false; status: 400 | 404 | 405; reason: string };

const SERVICES: readonly GitService[] = ["git-upload-pack", "git-receive-pack"];
/** Longest pkt-line git reads (LARGE_PACKET_MAX + 4 length bytes). */
const MAX_PKT_LENGTH = 65_520;
const OBJECT_ID = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/;
const ZERO_ID = /^0+$/;
/** Capabilities a push may ask for; anything else (notably `push-options`) is refused. */
const PUSH_CAPABILITIES = new Set([
  "report-status",
  "report-status-v2",
  "side-band-64k",
  "side-band",
  "quiet",
  "atomic",
  "ofs-delta",
]);
const PUSH_CAPABILITY_PREFIXES = ["agent=", "object-format=", "session-id="];

/**
 * The request target (path and query, as sent) of a request URL: what follows the authority.
 * Deno's `Request.url` keeps the target unnormalised, so this is the client's own text.
 */
export function requestTarget(url: string): string {
  return url.replace(/^[a-zA-Z][a-zA-Z0-9+.-]*:\/\/[^/?#]*/, "");
}

/**
 * Decide which endpoint `method target` names under `prefix` (e.g. "/git"). Exactly these are
 * accepted, spelled exactly so:
 *
 *   GET  <prefix>/info/refs?service=git-upload-pack   (or git-receive-pack; nothing else in the query)
 *   POST <prefix>/git-upload-pack                     (no query)
 *   POST <prefix>/git-receive-pack                    (no query)
 */
export function parseGitRoute(method: string, target: string, prefix: string): GitRouteDecision {
  if (!/^\/[\x21-\x7e]*$/.test(target) || target.includes("#")) {
    return { ok: false, status: 400, reason: "the request target is not a plain path" };
  }
  const mark = target.indexOf("?");
  const path = mark < 0 ? target : target.slice(0, mark);
  const query = mark < 0 ? undefined : target.slice(mark + 1);
  const endpoint = path.startsWith(`${prefix}/`) ? path.slice(prefix.length) : undefined;
  if (
    endpoint !== "/info/refs" && endpoint !== "/git-upload-pack" && endpoint !== "/git-receive-pack"
  ) {
    if (/%|\\|\/\/|\/\.\.?(?:\/|$)|;/.test(path)) {
      return {
        ok: false,
        status: 400,
        reason: "ambiguous path (percent-encoding, dot segments, doubled slashes)",
      };
    }
    return { ok: false, status: 404, reason: "not a smart HTTP endpoint" };
  }
  if (endpoint === "/info/refs") {
    if (method !== "GET") return { ok: false, status: 405, reason: `${method} on info/refs` };
    const service = query?.startsWith("service=") ? query.slice("service=".length) : undefined;
    if (!SERVICES.includes(service as GitService)) {
      return {
        ok: false,
        status: 400,
        reason:
          "info/refs needs exactly ?service=git-upload-pack or ?service=git-receive-pack (dumb HTTP is not served)",
      };
    }
    return {
      ok: true,
      route: {
        kind: "advertisement",
        service: service as GitService,
        suffix: `/info/refs?service=${service}`,
      },
    };
  }
  const service = endpoint.slice(1) as GitService;
  if (method !== "POST") return { ok: false, status: 405, reason: `${method} on ${service}` };
  if (query !== undefined) {
    return {
      ok: false,
      status: 400,
      reason: `a query on POST ${service}: the service is its path, nothing else`,
    };
  }
  return { ok: true, route: { kind: "rpc", service, suffix: endpoint } };
}

/** A parsed ref update of a push: "<old> <new> <ref>". */
export interface RefUpdate {
  old: string;
  new: string;
  ref: string;
}

/** The command section at the head of a receive-pack request. */
export interface PushCommands {
  updates: RefUpdate[];
  /** Capabilities named after a NUL, on any line. */
  capabilities: string[];
  /** Byte offset just past the flush packet that ends the section: the pack follows. */
  end: number;
}

/** A receive-pack request the proxy cannot read as git would, or will not let through. */
export class PushFormatError extends Error {
  override name = "PushFormatError";
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * Read the command section (pkt-lines up to the first flush) at the start of `body`; undefined
 * when `body` ends before the flush (read more). Raises `PushFormatError` on anything git would
 * read differently or that the proxy does not let through: bad framing, a delimiter or empty
 * packet (git ends the list there too), signed pushes, unknown capabilities, `push-options`.
 */
export function scanPushCommands(body: Uint8Array): PushCommands | undefined {
  const updates: RefUpdate[] = [];
  const capabilities: string[] = [];
  let offset = 0;
  while (true) {
    if (offset + 4 > body.length) return undefined;
    const header = String.fromCharCode(...body.subarray(offset, offset + 4));
    if (!/^[0-9a-fA-F]{4}$/.test(header)) {
      throw new PushFormatError(`malformed pkt-line length "${printable(header)}"`);
    }
    const length = Number.parseInt(header, 16);
    if (length === 0) return { updates, capabilities, end: offset + 4 };
    if (length <= 4) throw new PushFormatError(`special packet "${header}" in the command list`);
    if (length > MAX_PKT_LENGTH) throw new PushFormatError(`pkt-line of ${length} bytes`);
    if (offset + length > body.length) return undefined;
    let payload: string;
    try {
      payload = utf8.decode(body.subarray(offset + 4, offset + length));
    } catch {
      throw new PushFormatError("a command that is not UTF-8");
    }
    offset += length;
    // As git: one trailing LF is chomped from the packet, then the command ends at the first NUL.
    if (payload.endsWith("\n")) payload = payload.slice(0, -1);
    const nul = payload.indexOf("\0");
    const line = nul < 0 ? payload : payload.slice(0, nul);
    if (nul >= 0) {
      for (const capability of payload.slice(nul + 1).split(" ").filter(Boolean)) {
        if (capability === "push-options") {
          throw new PushFormatError("push options are not allowed");
        }
        if (
          !PUSH_CAPABILITIES.has(capability) &&
          !PUSH_CAPABILITY_PREFIXES.some((p) => capability.startsWith(p))
        ) {
          throw new PushFormatError(`capability "${printable(capability)}" is not allowed`);
        }
        capabilities.push(capability);
      }
    }
    if (line.startsWith("shallow ")) {
      if (!OBJECT_ID.test(line.slice("shallow ".length))) {
        throw new PushFormatError(`malformed "${printable(line)}"`);
      }
      continue;
    }
    if (line.startsWith("push-cert")) {
      throw new PushFormatError("signed pushes (push-cert) are not supported");
    }
    // receive-pack: 40 (or 64) hex, SP, the same again, SP, then the ref name is the rest of the line.
    const command = /^([0-9a-f]{40}|[0-9a-f]{64}) ([0-9a-f]{40}|[0-9a-f]{64}) (.+)$/s.exec(line);
    if (!command || command[1].length !== command[2].length) {
      throw new PushFormatError(`malformed ref update "${printable(line)}"`);
    }
    updates.push({ old: command[1], new: command[2], ref: command[3] });
  }
}

/** The ref updates of a whole receive-pack request body; raises on a truncated or malformed one. */
export function parseRefUpdates(body: Uint8Array): RefUpdate[] {
  const commands = scanPushCommands(body);
  if (!commands) throw new PushFormatError("truncated command list");
  return commands.updates;
}

/**
 * Why a push must be refused, or undefined when it is exactly one update (not a deletion) of
 * `allowed`. `false`: this session may not push at all.
 */
export function pushViolation(updates: RefUpdate[], allowed: string | false): string | undefined {
  if (allowed === false) {
    return "this run has no push grant (only a run started with --push may push its branch)";
  }
  if (updates.length === 0) return "a push with no ref updates";
  for (const update of updates) {
    if (update.ref !== allowed) {
      return `updating "${printable(update.ref)}": this run may push only "${allowed}"`;
    }
    if (ZERO_ID.test(update.new)) return `deleting "${update.ref}"`;
    if (!OBJECT_ID.test(update.old) || !OBJECT_ID.test(update.new)) {
      return `malformed object id for "${update.ref}"`;
    }
  }
  if (updates.length > 1) {
    return `${updates.length} updates of "${allowed}" in one push: one is allowed`;
  }
  return undefined;
}

/** Text from the sandbox, safe to quote in a message or log: controls escaped, length bounded. */
function printable(text: string): string {
  const shown = text.length > 200 ? `${text.slice(0, 200)}…` : text;
  return shown.replace(
    // deno-lint-ignore no-control-regex -- finding control characters is the point
    /[\x00-\x1f\x7f-\x9f]/g,
    (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`,
  );
}
