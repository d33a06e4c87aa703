/**
 * The proxies' socket directory, bind-mounted read-only into a sandbox on a local engine.
 *
 * Over the exec stream every byte of a download is copied through the `docker` client and the
 * engine (about 450 MB/s here, against 2 GB/s for a container's own connection). When the engine
 * shares this machine's filesystem (a local, rootless or Podman engine), each container instead
 * gets one host directory of its own, `/tmp/sandbox-proxy-<hash>/<id>`, mounted read-only at
 * `PROXY_MOUNT_PATH`; each session of that container puts its proxies' Unix sockets in a
 * subdirectory of it, and the relay inside connects to them directly (relay/main.ts `--sockets`).
 * Policy does not move: the sockets are the same proxies, which check the token, the allowlist
 * and the push rules on every connection however it arrives.
 *
 * The sandbox sees the host path of its mount (`/proc/self/mountinfo`), so that path says nothing
 * about the user: `<hash>` is a hash of this user's uid and state directory, not their name or
 * home (/tmp, not $TMPDIR, so that every process of the user finds the same directory, and not
 * /run, which a rootless engine does not share). Another user may have made that name in /tmp
 * first: the parent is used only when lstat shows a directory (not a link) this user owns, and
 * is then made 0700; otherwise there is no mount, and the relay uses the exec stream.
 *
 * Who can reach what: the parent is 0700, so no other user of this machine reaches any socket
 * under it; a container's directory and its sessions' are 0711 and the sockets 0666, so
 * that the sandbox user (uid 10001, whatever it maps to on the host) can connect to a socket whose
 * path it knows but list nothing; and the mount is read-only, so nothing in the sandbox can create,
 * replace, remove or re-permission anything in it (not even when its uid happens to own the
 * files). A container sees only its own directory (`<id>` hashes the engine's address and the
 * container's name).
 */
import { userStateDir } from "../paths.ts";
import { randomHex, sha256Hex } from "../hash.ts";
import type { DockerCli } from "./docker.ts";
import { execRunning } from "./engine_api.ts";
import { trace } from "../trace.ts";

/** The system's temporary directory, where the mounted directories' parent is (see above). */
const PROXY_MOUNT_TMP = "/tmp";
/** Where a sandbox sees its directory. */
export const PROXY_MOUNT_PATH = "/run/sandbox-proxy";
/** `sun_path` holds 108 bytes; a longer socket path cannot be bound. */
export const MAX_SOCKET_PATH = 100;
/** The most a socket path in the mounted directory may take: `sun_path` and its final NUL. */
const MAX_MOUNTED_SOCKET_BYTES = 107;
/** Names are short, so that a socket's path fits under a long home directory. */
const CONTAINER_NAME_CHARS = 12;
const SESSION_NAME_CHARS = 8;
/** The longest socket name a session puts in its directory. */
const LONGEST_SOCKET = "egress.sock";

type Env = (name: string) => string | undefined;
const processEnv: Env = (name) => Deno.env.get(name);

/**
 * The engine the `docker` CLI talks to, as far as the environment names it: `DOCKER_HOST`, else
 * the context (`DOCKER_CONTEXT`, else the current one in the CLI's configuration; "" for the
 * default).
 */
async function engineAddress(env: Env): Promise<{ host: string; context: string }> {
  const host = env("DOCKER_HOST") ?? "";
  let context = host ? "" : env("DOCKER_CONTEXT") ?? "";
  if (!host && !context) {
    const config = `${env("DOCKER_CONFIG") || `${env("HOME") ?? "/tmp"}/.docker`}/config.json`;
    try {
      const parsed = JSON.parse(await Deno.readTextFile(config));
      if (typeof parsed?.currentContext === "string") context = parsed.currentContext;
    } catch {
      // No configuration: the default engine.
    }
  }
  return { host, context: context === "default" ? "" : context };
}

/**
 * Whether the engine may share this machine's filesystem: it is reached on a Unix socket (the
 * default one, or a context's). A remote engine (tcp://, ssh://) is not; an engine in a VM on a
 * Unix socket (Docker Desktop) passes this test, binds the directory, and its sandboxes' relays
 * then find the sockets unreachable and use the exec stream.
 */
export async function engineMayShareFilesystem(
  docker: DockerCli,
  env: Env = processEnv,
): Promise<boolean> {
  const { host, context } = await engineAddress(env);
  if (host) return host.startsWith("unix://");
  if (!context) return true;
  const inspected = await docker.run([
    "context",
    "inspect",
    "--format",
    "{{.Endpoints.docker.Host}}",
    context,
  ]);
  return inspected.exitCode === 0 && inspected.stdout.trim().startsWith("unix://");
}

/** The host directory mounted into container `containerName` (not created). */
export async function proxyMountSource(
  containerName: string,
  env: Env = processEnv,
): Promise<string> {
  const { host, context } = await engineAddress(env);
  const id = (await sha256Hex(`${host}\0${context}\0${containerName}`)).slice(
    0,
    CONTAINER_NAME_CHARS,
  );
  const user = (await sha256Hex(`${Deno.uid() ?? ""}\0${userStateDir()}`)).slice(0, 16);
  return `${PROXY_MOUNT_TMP}/sandbox-proxy-${user}/${id}`;
}

/**
 * Create the directory mounted into `containerName` (the parent 0700, it 0711) and return it;
 * undefined when the sockets in it would have paths too long to bind, or its path cannot be
 * written in a `--mount` option.
 */
export async function prepareProxyMountSource(containerName: string): Promise<string | undefined> {
  const dir = await proxyMountSource(containerName);
  const longest = `${dir}/${"x".repeat(SESSION_NAME_CHARS)}/${LONGEST_SOCKET}`;
  if (new TextEncoder().encode(longest).length > MAX_MOUNTED_SOCKET_BYTES) return undefined;
  if (/[,"'\s=]/.test(dir)) return undefined;
  const parent = dir.slice(0, dir.lastIndexOf("/"));
  // Synchronous: six calls through the runtime's thread pool cost every exec and run ~4 ms of its
  // start (three callers each), against well under one so. Not recursive: /tmp is there, and a
  // name another user made in it is refused below, never followed.
  for (let attempt = 1;; attempt++) {
    mkdirOnce(parent, 0o700);
    assertOwnDirectory(parent);
    // Whatever made it (an older version, a umask), only this user may enter it.
    Deno.chmodSync(parent, 0o700);
    try {
      mkdirOnce(dir, 0o711);
      break;
    } catch (error) {
      // The parent went in between: the last container's removal took it, empty (below).
      if (!(error instanceof Deno.errors.NotFound) || attempt === 3) throw error;
    }
  }
  assertOwnDirectory(dir);
  Deno.chmodSync(dir, 0o711);
  return dir;
}

/**
 * The host's record of the spare relay waiting in the container whose mounted directory is
 * `mountSource` (lib/proxy/spare_relay.ts): beside that directory, never inside it.
 */
export function spareRelayRecordPath(mountSource: string): string {
  return `${mountSource}.spare-relay.json`;
}

/**
 * Take the record at `path` of an exec waiting in a container (a spare relay's), if that exec still runs: undefined when there is none, it does not parse, or its
 * exec is dead — then its directory in `mountSource` is removed and `stop` ends what is left of it.
 */
export async function claimLiveRecord<T extends { id: string; dir: string; exec?: string }>(
  path: string,
  parse: (text: string) => T,
  mountSource: string,
  stop: (id: string) => Promise<void>,
  what: string,
): Promise<T | undefined> {
  const record = await takeRecord(path, parse);
  if (!record) return undefined;
  if (await execRunning(record.exec)) return record;
  trace(`${what} found dead`);
  // Best effort on what is dead already: a leftover directory or process goes with the container.
  await Deno.remove(`${mountSource}/${record.dir}`, { recursive: true }).catch(() => {});
  await stop(record.id).catch(() => {});
  return undefined;
}

/**
 * Take the record at `path`: renamed first, so that of processes taking it at once exactly one
 * gets it, then read and removed. Undefined when there is none, or it does not parse.
 */
async function takeRecord<T>(path: string, parse: (text: string) => T): Promise<T | undefined> {
  const taken = `${path}.${randomHex(4)}`;
  try {
    await Deno.rename(path, taken);
  } catch {
    // No record, or another process took it first: nothing to claim.
    return undefined;
  }
  try {
    return parse(await Deno.readTextFile(taken));
  } catch {
    // Unreadable or malformed: not a record to use.
    return undefined;
  } finally {
    await Deno.remove(taken).catch(() => {}); // ours alone after the rename; gone is as good
  }
}

/**
 * Remove what the host kept for `containerName`'s mount, once the container is gone: the directory
 * (its sessions' sockets, a spare relay's) and the spare relay's record beside it.
 */
export async function removeProxyMountSource(containerName: string): Promise<void> {
  const dir = await proxyMountSource(containerName);
  // Absent already is the usual case (never made, or removed by another process).
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  await Deno.remove(spareRelayRecordPath(dir)).catch(() => {});
  // The user's directory goes with its last container; while another is in it, it stays
  // (NotEmpty), and one being made meanwhile makes it again (prepareProxyMountSource).
  await Deno.remove(dir.slice(0, dir.lastIndexOf("/"))).catch(() => {});
}

/** A session's socket directory in a container's mounted one, as the host and the sandbox see it. */
export interface SessionSocketDir {
  host: string;
  sandbox: string;
}

/**
 * A new directory for one session's sockets inside `mountSource` (0711: the sandbox user can
 * reach a socket by name, list nothing).
 */
export async function makeSessionSocketDir(mountSource: string): Promise<SessionSocketDir> {
  for (let attempt = 1;; attempt++) {
    const name = Array.from(
      crypto.getRandomValues(new Uint8Array(SESSION_NAME_CHARS / 2)),
      (b) => b.toString(16).padStart(2, "0"),
    ).join("");
    const host = `${mountSource}/${name}`;
    try {
      // Fails if it exists: a name is never shared.
      await Deno.mkdir(host, { mode: 0o711 });
    } catch (error) {
      if (error instanceof Deno.errors.AlreadyExists && attempt < 5) continue;
      throw error;
    }
    await Deno.chmod(host, 0o711);
    return { host, sandbox: `${PROXY_MOUNT_PATH}/${name}` };
  }
}

/** A session directory this old whose credential proxy does not answer was left by a crash. */
const STALE_SESSION_MS = 60_000;

/**
 * Remove what sessions that ended without closing (a killed process) left in `mountSource`:
 * directories older than a minute whose `llm.sock` has no listener (every live session has one).
 */
export async function sweepStaleSessionDirs(mountSource: string): Promise<void> {
  for await (const entry of Deno.readDir(mountSource)) {
    if (!entry.isDirectory || !/^[0-9a-f]+$/.test(entry.name)) continue;
    const dir = `${mountSource}/${entry.name}`;
    try {
      const info = await Deno.lstat(dir);
      if (Date.now() - (info.mtime?.getTime() ?? Date.now()) < STALE_SESSION_MS) continue;
      (await Deno.connect({ transport: "unix", path: `${dir}/llm.sock` })).close();
    } catch (error) {
      if (error instanceof Deno.errors.ConnectionRefused || error instanceof Deno.errors.NotFound) {
        // Removed meanwhile by another process's sweep: as good as removed here.
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      }
    }
  }
}

/** Make directory `path` unless it exists; never its parents (a vanished parent stays an error). */
function mkdirOnce(path: string, mode: number): void {
  try {
    Deno.mkdirSync(path, { mode });
  } catch (error) {
    if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
  }
}

/** A directory (not a link to one) that this user owns. */
function assertOwnDirectory(path: string): void {
  const info = Deno.lstatSync(path);
  const uid = Deno.uid();
  if (!info.isDirectory || (uid !== null && info.uid !== uid)) {
    throw new Deno.errors.PermissionDenied(`${path} is not a directory of this user`);
  }
}
