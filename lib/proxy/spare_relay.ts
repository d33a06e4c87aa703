/**
 * The next session's relay, ready before it is asked for: a "spare relay".
 *
 * Starting a relay (a `docker exec`, the exec wrapper, Deno loading relay.js, its ports bound) is
 * the longest step between a warm run's start and its first event (~100 ms of ~300), and the one
 * thing `sandbox exec` waits for besides its own command. So when a session that carried its
 * connections over the mounted sockets closes, it leaves a relay behind for the next one: started
 * detached, as the relay's own uid, listening on the ports the session had, waiting (inotify, no
 * cost) for a control socket to appear in a socket directory of its own. The host notes it in a
 * record beside the container's mounted directory (in the 0700 state directory: the sandbox never
 * sees it).
 *
 * The next session claims the record (a rename: exactly one session gets it), makes
 * `control.sock` in that directory and its proxies' sockets beside it (at the same time: the relay
 * carries nothing before the session's command runs), and waits for the relay to connect and say
 * its key. The key went to the relay in its environment, which no process of the sandbox user can
 * read (the relay is another uid; its wrapper is not dumpable), so a connection that says it is
 * the relay, listening on those ports and carrying to those sockets: nothing the agent started
 * can pass for it. The control connection is then the relay's lifetime, as the exec stream is for
 * a relay the session starts itself: when it ends, the session launches one on the same ports.
 *
 * A session that closes normally passes its spare on instead of letting it end (`passOn`): its
 * last words on the control connection are `again`, on which the relay closes every connection it
 * carried for the session and waits for the next control socket in the same directory, with the
 * same key; the host empties the directory of the session's sockets and writes the record again.
 * So a container's sessions, one after another, need no relay started at all — no `docker exec`,
 * whose work in the engine is most of what a short `sandbox exec` costs.
 *
 * What the relay is, and is not, trusted with does not change: it holds no secret of any run (the
 * key only names it), every connection it carries still needs the session's token and passes the
 * same proxies, and it carries nothing until a session made its sockets. A spare whose record is
 * stale (its container restarted, or it could not bind its ports) is found dead and dropped, and
 * the session starts a relay as before.
 */
import { closeQuietly, readLine } from "../conn.ts";
import { randomHex } from "../hash.ts";
import { claimLiveRecord, spareRelayRecordPath } from "../sandbox/proxy_mount.ts";
import type { SandboxRelayTransport } from "../sandbox/provider.ts";
import { type RelayService, type RunningRelay, SPARE_KEY_ENV } from "./relay_host.ts";
import { trace } from "../trace.ts";

/** A sandbox's socket directory bound in: where the host and the sandbox see it. */
export interface SocketMount {
  host: string;
  sandbox: string;
}

/** The socket a claiming session makes last, which the spare connects to (relay/main.ts). */
const CONTROL_SOCKET = "control.sock";
/** Exec ids of spare relays: `relay-…`, so that they are stopped as the relay's uid. */
const SPARE_ID_PREFIX = "relay-spare-";
/** Spare directories are `s` and 7 hex digits: a session directory's length, never swept as one. */
export const SPARE_DIR = /^s[0-9a-f]{7}$/;
/** How long a claimed spare may take to connect; a live one takes a millisecond or two. */
const CONTROL_WAIT_MS = 1_500;
/** The longest line a control connection may send before it is dropped. */
const MAX_KEY_LINE = 160;
/** What the host says on the control connection, just before closing it, to keep the relay (relay/main.ts). */
const AGAIN = "again\n";

/** What the host keeps of a spare relay. */
interface SpareRecord {
  /** Its exec wrapper's id (`relay-spare-…`). */
  id: string;
  /** Its socket directory's name in the container's mounted directory. */
  dir: string;
  ports: Partial<Record<RelayService, number>>;
  key: string;
  /** The engine's exec id, when it was started through the engine's API. */
  exec?: string;
}

/** A spare relay a session has claimed: its socket directory, ports and key. */
export interface ClaimedSpare {
  record: SpareRecord;
  /** The socket directory, as the host and the sandbox see it. */
  hostDir: string;
  sandboxDir: string;
}

/**
 * Start a spare relay in `transport`'s sandbox on `ports`, its socket directory in `mount`, and
 * record it beside `mount`; nothing when the sandbox already has one. Best effort: a spare that
 * cannot be started is only a slower next start.
 */
export async function startSpareRelay(
  transport: SandboxRelayTransport,
  mount: SocketMount,
  ports: Partial<Record<RelayService, number>>,
): Promise<void> {
  const record = spareRelayRecordPath(mount.host);
  if (await hasSpareRelay(mount.host)) return;
  const dir = `s${randomHex(4).slice(0, 7)}`;
  const hostDir = `${mount.host}/${dir}`;
  // Readable (0755), unlike a session's (0711): the relay watches it for the control socket. Its
  // names are the fixed ones a session makes in any directory: nothing to hide by listing.
  await Deno.mkdir(hostDir, { mode: 0o755 });
  await Deno.chmod(hostDir, 0o755);
  const key = randomHex(32);
  const id = `${SPARE_ID_PREFIX}${crypto.randomUUID()}`;
  const args = [
    "--spare",
    "--sockets",
    `${mount.sandbox}/${dir}`,
    ...Object.entries(ports).map(([service, port]) => `${service}=${port}`),
  ];
  // The key goes in the relay's environment, never in an argument (`ps`).
  const started = await transport.startDetachedRelay(id, args, { [SPARE_KEY_ENV]: key });
  if (!started) {
    // Nothing waits in it: the directory goes; a failed removal leaves only an empty directory,
    // which goes with the sandbox's mount.
    await Deno.remove(hostDir, { recursive: true }).catch(() => {});
    return;
  }
  const spare: SpareRecord = { id, dir, ports, key, ...started };
  try {
    // Only this user reads it (the state directory is 0700 as well); `createNew`: a spare another
    // session started meanwhile stays the one, and ours goes.
    await Deno.writeTextFile(record, JSON.stringify(spare), { createNew: true, mode: 0o600 });
    trace("session: spare relay started");
  } catch {
    // Best effort, as the spare itself: a relay left running here listens on ports no session
    // was told and carries nothing (no control socket is ever made for it); it ends with the
    // sandbox. The same holds for the directory.
    await transport.stopRelay(id).catch(() => {});
    await Deno.remove(hostDir, { recursive: true }).catch(() => {});
  }
}

/**
 * Take the spare relay waiting in `mount`, if there is one that is alive. The record is claimed
 * by renaming it (two sessions cannot both get it); a dead spare's directory is removed.
 */
export async function claimSpareRelay(
  transport: Pick<SandboxRelayTransport, "stopRelay">,
  mount: SocketMount,
): Promise<ClaimedSpare | undefined> {
  const spare = await claimLiveRecord(
    spareRelayRecordPath(mount.host),
    parseRecord,
    mount.host,
    (id) => transport.stopRelay(id),
    "session: spare relay",
  );
  return spare &&
    {
      record: spare,
      hostDir: `${mount.host}/${spare.dir}`,
      sandboxDir: `${mount.sandbox}/${spare.dir}`,
    };
}

function parseRecord(text: string): SpareRecord {
  const value = JSON.parse(text) as SpareRecord;
  const portsOk = Object.entries(value.ports ?? {}).every(([service, port]) =>
    /^[a-z]{1,16}$/.test(service) && Number.isInteger(port) && port > 0 && port < 65_536
  );
  if (
    typeof value.id !== "string" || !value.id.startsWith(SPARE_ID_PREFIX) ||
    !SPARE_DIR.test(value.dir ?? "") ||
    !/^[0-9a-f]{64}$/.test(value.key ?? "") || !portsOk ||
    (value.exec !== undefined && !/^[0-9a-f]{64}$/.test(value.exec))
  ) {
    throw new TypeError("not a spare relay record");
  }
  return value;
}

/** A claimed spare serving its session. */
export interface ServingSpare extends RunningRelay {
  /** Make `stop` pass the relay on (it then serves the container's next session) instead of ending it. */
  passOn(): void;
}

/**
 * With the session's sockets made in the claimed spare's directory: make the control socket and
 * wait for the spare to connect and say its key. The spare, running (its control connection its
 * lifetime), or undefined when it did not come in time (it is then stopped).
 */
export async function awaitSpareRelay(
  transport: Pick<SandboxRelayTransport, "stopRelay">,
  claimed: ClaimedSpare,
  waitMs = CONTROL_WAIT_MS,
): Promise<ServingSpare | undefined> {
  const path = `${claimed.hostDir}/${CONTROL_SOCKET}`;
  const listener = Deno.listen({ transport: "unix", path });
  await Deno.chmod(path, 0o666);
  const expected = new TextEncoder().encode(`${claimed.record.key}\n`);
  // A spare that did not answer and cannot be stopped carries nothing: its control socket is
  // gone, and without one it serves no session; it ends with the sandbox.
  const stopSpare = () => transport.stopRelay(claimed.record.id).catch(() => {});
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<undefined>((resolve) =>
    timer = setTimeout(() => resolve(undefined), waitMs)
  );
  const pending = new Set<Deno.Conn>();
  // Anything in the sandbox can connect here (the socket is 0666 so that the relay may): each
  // connection must say the key at once, or it is dropped; the first that does is the relay. They
  // are heard at the same time, so that one that says nothing cannot hold the relay up.
  const accepting = new Promise<Deno.Conn | undefined>((resolve) => {
    (async () => {
      for await (const conn of listener) {
        pending.add(conn);
        readLine(conn, MAX_KEY_LINE, waitMs).then((said) => {
          if (said && sameBytes(said, expected)) {
            pending.delete(conn);
            resolve(conn);
          } else closeQuietly(conn);
        });
      }
      // The listener closed (the wait is over) or failed: either way no relay came.
    })().catch(() => {}).finally(() => resolve(undefined));
  });
  const control = await Promise.race([accepting, timedOut]);
  clearTimeout(timer);
  listener.close();
  // A socket file left behind is harmless: nothing listens on it any more, and the directory is
  // emptied when the spare is passed on, or removed with the session or the sandbox.
  await Deno.remove(path).catch(() => {});
  for (const conn of pending) closeQuietly(conn);
  if (!control) {
    trace("session: spare relay did not answer");
    await stopSpare();
    return undefined;
  }
  const ended = (async () => {
    const scratch = new Uint8Array(64);
    try {
      while ((await control.read(scratch)) !== null) {
        // The relay says nothing after its key: its end is all that counts.
      }
    } catch {
      // Reset: the relay is gone.
    }
    return undefined;
  })();
  let again = false;
  return {
    ended,
    passOn() {
      again = true;
    },
    async stop() {
      // The relay exits when its control connection ends (as a launched one does at the end of
      // its stdin): no exec to stop it, which would cost a run's end ~60 ms. Told `again` first,
      // it closes what it carried and waits for the next session instead.
      if (again) {
        // A relay that cannot be told is gone already: closing below is all that is left to do.
        await control.write(new TextEncoder().encode(AGAIN)).catch(() => 0);
      }
      closeQuietly(control);
      await ended;
    },
  };
}

/**
 * The relay that served a session's whole life (`passOn` was called before it stopped), passed on
 * to the container's next session: `claimed`'s directory emptied of the session's sockets (its
 * proxies are closed) and its record written again. False when the container has a spare already
 * (another session left one meanwhile): this one is then stopped.
 */
export async function passOnSpareRelay(
  transport: Pick<SandboxRelayTransport, "stopRelay">,
  mount: SocketMount,
  claimed: ClaimedSpare,
): Promise<boolean> {
  try {
    for await (const entry of Deno.readDir(claimed.hostDir)) {
      await Deno.remove(`${claimed.hostDir}/${entry.name}`, { recursive: true });
    }
    await Deno.writeTextFile(spareRelayRecordPath(mount.host), JSON.stringify(claimed.record), {
      createNew: true,
      mode: 0o600,
    });
    trace("session: spare relay passed on");
    return true;
  } catch {
    // Not passed on: stopped, best effort (a relay left running has no record, so no session
    // ever makes its control socket: it carries nothing and ends with the sandbox).
    await transport.stopRelay(claimed.record.id).catch(() => {});
    await Deno.remove(claimed.hostDir, { recursive: true }).catch(() => {});
    return false;
  }
}

/** Whether the sandbox whose socket directory is `mountSource` has a spare relay waiting (a record). */
export async function hasSpareRelay(mountSource: string): Promise<boolean> {
  try {
    await Deno.lstat(spareRelayRecordPath(mountSource));
    return true;
  } catch {
    // No record (or none this user can see): no spare waits.
    return false;
  }
}

/** Equal bytes, compared in time that does not depend on where they differ. */
function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}
