/**
 * A command's wrapper started ahead of the command (scripts/sandbox-exec `--waiting`): `up` leaves
 * one in the container, and each `sandbox exec` hands its command to it over a socket in the
 * container's mounted directory instead of starting a `docker exec` — which costs the engine
 * ~50 ms before the command runs — then passes it on to the next, as a session passes its spare
 * relay on. An exec that finds none (one is busy with a concurrent command) runs its command the
 * usual way, and starts one for the next.
 *
 * The host's side, in order:
 * - `startWaitingExec`: a detached `docker exec` of the wrapper as the sandbox user, with a key in
 *   its environment, watching a directory of its own in the mount; recorded beside the mount
 *   (0600), like the spare relay (lib/proxy/spare_relay.ts).
 * - `claimWaitingExec`: take the record (a rename: one claimant), and check the exec still runs.
 * - `connectWaitingExec`: make `job.sock` in its directory and take three connections that each
 *   say the key first (control, stdin and stdout, stderr); anything else that connects — the
 *   socket is 0666, so the agent may — is dropped. Nothing has been sent yet: on failure the
 *   caller runs the command the usual way, and loses nothing.
 * - `WaitingExecChild`: the job goes on control (working directory, argv, environment), stdin on
 *   the second connection, and the command's exit code comes back on control.
 * - `passOnWaitingExec`: `again` on control, and the record written back: the wrapper waits for
 *   the next job. Anything else (`releaseWaitingExec`: the command was stopped, or another wrapper
 *   was recorded meanwhile) ends it.
 *
 * What it holds: the key (which only names it to the host) and nothing of any run. It is not
 * dumpable, so no process of the sandbox user reads its key or ptraces it; the mount is read-only
 * in the sandbox, so only the host makes the socket it waits for. Until it runs a command a lease
 * does not count it; once it does, it is a live exec like any other.
 */
import { type Child, collectStderr, linesOrStop, type ProcessOutcome, type SpawnOptions, stopOnAbortOrTimeout } from "../process.ts";
import { MAX_LINE_CHARS } from "../lines.ts";
import { claimLiveRecord, prepareProxyMountSource, PROXY_MOUNT_PATH, waitingExecRecordPath } from "./proxy_mount.ts";
import { trace } from "../trace.ts";
import { closeQuietly, readLine, writeAll } from "../conn.ts";
import { randomHex } from "../hash.ts";
import { pathExists } from "../paths.ts";
import type { DockerCli } from "./docker.ts";
// (Types only from the provider, which loads this module: a cycle of values would deadlock the
// bundled CLI, whose modules load lazily and await each other.)
import type { DockerSandboxProvider } from "./docker_provider.ts";
import { SANDBOX_USER } from "./users.ts";

type Provider = Pick<DockerSandboxProvider, "docker" | "containerName" | "stopExec" | "hasProxyMount">;

/** The container's waiting wrapper, claimed and connected; undefined when it has none to give. */
export async function takeWaitingExec(provider: Provider): Promise<WaitingConnections | undefined> {
  const source = await prepareProxyMountSource(provider.containerName).catch(() => undefined);
  if (!source) return undefined;
  const stop = (id: string) => provider.stopExec(id);
  const claimed = await claimWaitingExec(source, stop);
  return claimed ? await connectWaitingExec(claimed, stop) : undefined;
}

/** Start a waiting wrapper in the container unless it has one (or no mounted directory to wait in). */
export async function leaveWaitingExec(provider: Provider, signal?: AbortSignal): Promise<void> {
  if (!await provider.hasProxyMount(signal).catch(() => false)) return;
  const source = await prepareProxyMountSource(provider.containerName).catch(() => undefined);
  if (source) await startWaitingExec(provider.docker, provider.containerName, SANDBOX_USER, source);
}

/** The wrapper's key travels in this variable (never on a command line: `ps`). */
const KEY_ENV = "SANDBOX_EXEC_KEY";
/** Its exec ids; `--kill ID` stops it like any exec. */
const ID_PREFIX = "waiting-";
/** Its directories in the mount: `e` and 7 hex digits, never swept as a session's. */
const DIR_PREFIX = "e";
const JOB_SOCKET = "job.sock";
/** How long its three connections may take; a live one takes a millisecond or two. */
const CONNECT_WAIT_MS = 1_500;
/** The longest first line a connection may say (a key and a role). */
const MAX_HELLO = 200;
/** The exit code of a command whose wrapper went away without saying one: it was killed. */
const EXIT_KILLED = 137;

interface WaitingRecord {
  id: string;
  dir: string;
  key: string;
  /** The engine's exec id, when it was started through the engine's API. */
  exec?: string;
}

/** A waiting wrapper this process has claimed. */
export interface ClaimedWaitingExec {
  record: WaitingRecord;
  mountSource: string;
  hostDir: string;
}

/** The three connections of a claimed wrapper, each having said the key. */
export interface WaitingConnections {
  id: string;
  /** Set once the command has run and the wrapper said its exit code: it can be passed on. */
  reported?: boolean;
  record: WaitingRecord;
  mountSource: string;
  hostDir: string;
  control: Deno.UnixConn;
  io: Deno.UnixConn;
  stderr: Deno.UnixConn;
}

/**
 * Start a waiting wrapper in `container` (the sandbox user's), its directory in `mountSource`, and
 * record it; nothing when one is recorded already. Best effort: without one, the next command
 * starts the usual way.
 */
export async function startWaitingExec(docker: DockerCli, container: string, user: string, mountSource: string): Promise<void> {
  const recordPath = waitingExecRecordPath(mountSource);
  if (await pathExists(recordPath)) return;
  const dir = `${DIR_PREFIX}${randomHex(4).slice(0, 7)}`;
  const hostDir = `${mountSource}/${dir}`;
  // Readable (0755): the wrapper watches it for the job socket. Nothing else is ever in it.
  await Deno.mkdir(hostDir, { mode: 0o755 });
  await Deno.chmod(hostDir, 0o755);
  const key = randomHex(32);
  const id = `${ID_PREFIX}${crypto.randomUUID()}`;
  const started = await docker.run([
    "exec",
    "--detach",
    "--user",
    user,
    "--env",
    KEY_ENV,
    container,
    "sandbox-exec",
    "--waiting",
    id,
    `${PROXY_MOUNT_PATH}/${dir}`,
  ], { env: { [KEY_ENV]: key }, timeoutMs: 30_000 }).catch(() => undefined);
  if (!started || started.exitCode !== 0) {
    await Deno.remove(hostDir, { recursive: true }).catch(() => {});
    return;
  }
  const exec = started.stdout.trim();
  const record: WaitingRecord = { id, dir, key, ...(/^[0-9a-f]{64}$/.test(exec) ? { exec } : {}) };
  try {
    await Deno.writeTextFile(recordPath, JSON.stringify(record), { createNew: true, mode: 0o600 });
    trace("waiting exec: started");
  } catch {
    // Another process recorded one meanwhile: this one goes.
    await docker.run(["exec", "--user", user, container, "sandbox-exec", "--kill", id], { timeoutMs: 30_000 }).catch(() => {});
    await Deno.remove(hostDir, { recursive: true }).catch(() => {});
  }
}

/** Take the container's waiting wrapper, if it has a live one. */
export async function claimWaitingExec(
  mountSource: string,
  stop: (id: string) => Promise<void>,
): Promise<ClaimedWaitingExec | undefined> {
  const record = await claimLiveRecord(waitingExecRecordPath(mountSource), parseRecord, mountSource, stop, "waiting exec:");
  return record && { record, mountSource, hostDir: `${mountSource}/${record.dir}` };
}

function parseRecord(text: string): WaitingRecord {
  const value = JSON.parse(text) as WaitingRecord;
  if (
    typeof value !== "object" || value === null ||
    typeof value.id !== "string" || !value.id.startsWith(ID_PREFIX) ||
    typeof value.dir !== "string" || !new RegExp(`^${DIR_PREFIX}[0-9a-f]{7}$`).test(value.dir) ||
    typeof value.key !== "string" || !/^[0-9a-f]{64}$/.test(value.key) ||
    (value.exec !== undefined && !/^[0-9a-f]{64}$/.test(value.exec))
  ) {
    throw new TypeError("not a waiting exec record");
  }
  return value;
}

/**
 * Make the claimed wrapper's job socket and take its three connections, each of which must say
 * the key and its role at once; others are dropped. Undefined (and the wrapper stopped) when it
 * does not come within `waitMs`: nothing was sent, the command runs the usual way.
 */
export async function connectWaitingExec(
  claimed: ClaimedWaitingExec,
  stop: (id: string) => Promise<void>,
  waitMs = CONNECT_WAIT_MS,
): Promise<WaitingConnections | undefined> {
  const path = `${claimed.hostDir}/${JOB_SOCKET}`;
  /** Nothing was sent: the wrapper is stopped, and the command runs the usual way. */
  const giveUp = async (why: string) => {
    trace(`waiting exec: ${why}`);
    await stop(claimed.record.id).catch(() => {});
    await Deno.remove(claimed.hostDir, { recursive: true }).catch(() => {});
    return undefined;
  };
  let listener: Deno.Listener<Deno.UnixConn, Deno.UnixAddr> | undefined;
  try {
    listener = Deno.listen({ transport: "unix", path });
    await Deno.chmod(path, 0o666);
  } catch (error) {
    listener?.close();
    // Its directory went meanwhile (seen once, with commands of two checkouts at once on one
    // container): as with a wrapper that does not answer.
    return await giveUp(`cannot listen (${error instanceof Error ? error.message : String(error)})`);
  }
  const roles = new Map<string, Deno.UnixConn>();
  const strangers = new Set<Deno.Conn>();
  let done!: () => void;
  const all = new Promise<void>((resolve) => done = resolve);
  const accepting = (async () => {
    for await (const conn of listener!) {
      strangers.add(conn);
      void readLine(conn, MAX_HELLO, waitMs).then((said) => {
        const match = said === null ? null : /^([0-9a-f]+) ([coe])\n$/.exec(new TextDecoder().decode(said));
        if (match && match[1] === claimed.record.key && !roles.has(match[2])) {
          strangers.delete(conn);
          roles.set(match[2], conn);
          if (roles.size === 3) done();
        } else closeQuietly(conn);
      });
    }
  })().catch(() => {});
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<void>((resolve) => timer = setTimeout(resolve, waitMs));
  await Promise.race([all, late]);
  clearTimeout(timer);
  listener.close();
  await accepting;
  for (const conn of strangers) closeQuietly(conn);
  await Deno.remove(path).catch(() => {});
  if (roles.size < 3) {
    for (const conn of roles.values()) closeQuietly(conn);
    return await giveUp("did not connect");
  }
  trace("waiting exec: connected");
  return {
    id: claimed.record.id,
    record: claimed.record,
    mountSource: claimed.mountSource,
    hostDir: claimed.hostDir,
    control: roles.get("c")!,
    io: roles.get("o")!,
    stderr: roles.get("e")!,
  };
}

/** The job line: hex fields — working directory, argv, `-`, NAME=VALUE pairs. */
export function jobLine(argv: readonly string[], cwd: string | undefined, env: Record<string, string>): string {
  const hex = (text: string) => Array.from(new TextEncoder().encode(text), (b) => b.toString(16).padStart(2, "0")).join("");
  for (const name of Object.keys(env)) {
    if (name === "" || name.includes("=") || name.includes("\0")) throw new TypeError(`Invalid environment variable name "${name}"`);
  }
  return [hex(cwd ?? ""), ...argv.map(hex), "-", ...Object.entries(env).map(([k, v]) => hex(`${k}=${v}`))].join(" ") + "\n";
}

/**
 * The command, run by the connected wrapper: a `Child` like a `docker exec`'s, for the provider's
 * `execStream` (its stdout lines, its stderr lines and tail, its exit code, its timeout).
 */
export class WaitingExecChild implements Child {
  readonly argv: readonly string[];
  readonly stdout: ReadableStream<Uint8Array>;
  readonly finished: Promise<ProcessOutcome>;
  readonly #conns: WaitingConnections;
  readonly #maxLineChars: number;
  #stopped = false;
  /** The wrapper went away without an exit code (killed): the command's output was cut here. */
  #cut = false;

  constructor(conns: WaitingConnections, argv: readonly string[], cwd: string | undefined, env: Record<string, string>, options: SpawnOptions) {
    this.argv = argv;
    this.#conns = conns;
    this.#maxLineChars = options.maxLineChars ?? MAX_LINE_CHARS;
    // The connection's own stream errs when a stop closes it mid-read: a stopped command's output
    // simply ends, as a killed process's pipe does.
    const reader = conns.io.readable.getReader();
    this.stdout = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        try {
          const { done, value } = await reader.read();
          if (done) {
            controller.close();
            closeQuietly(conns.io);
          } else controller.enqueue(value);
        } catch (error) {
          if (this.#stopped || this.#cut) controller.close();
          else controller.error(error);
        }
      },
      cancel: (reason) => reader.cancel(reason).catch(() => {}),
    });
    this.finished = this.#run(jobLine(argv, cwd, env), options);
  }

  lines(): AsyncGenerator<string> {
    return linesOrStop(this.stdout, this.#maxLineChars, () => this.kill());
  }

  /** Stop now: the connections close (the command's stdio with them); the caller's `--kill` does the rest. */
  kill(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    for (const conn of [this.#conns.control, this.#conns.io, this.#conns.stderr]) closeQuietly(conn);
  }

  async #run(job: string, options: SpawnOptions): Promise<ProcessOutcome> {
    const started = performance.now();
    const stop = stopOnAbortOrTimeout(options, () => this.kill());
    const stopStderr = new AbortController();
    const stderrTail = collectStderr(this.#conns.stderr.readable, options, stopStderr.signal).catch(() => "");
    try {
      await writeAll(this.#conns.control, new TextEncoder().encode(job));
      void this.#feedStdin(options.stdin);
      const said = await readLine(this.#conns.control, 64);
      const code = said === null ? null : /^x (\d{1,3})\n$/.exec(new TextDecoder().decode(said))?.[1];
      if (this.#stopped) setTimeout(() => stopStderr.abort(), 500);
      const tail = await stderrTail;
      const exitCode = code == null || this.#stopped ? EXIT_KILLED : Number(code);
      this.#conns.reported = code != null && !this.#stopped;
      trace(`waiting exec: ${this.argv[0]} ended ${this.#stopped ? "(stopped)" : exitCode} (${(performance.now() - started).toFixed(1)} ms)`);
      return {
        argv: this.argv,
        exitCode,
        signal: this.#stopped ? "SIGTERM" : null,
        durationMs: performance.now() - started,
        timedOut: stop.timedOut,
        aborted: stop.aborted && !stop.timedOut,
        stderrTail: tail,
      };
    } finally {
      stop.release();
      // Said its exit code: the command and all it started are gone, and what they wrote is read
      // to its end (the wrapper keeps no end of it open). Otherwise the wrapper was killed, and
      // whatever it ran may still hold the output open: it ends here, as a killed process's pipe.
      if (!this.#conns.reported) {
        this.#cut = true;
        closeQuietly(this.#conns.io);
      }
      closeQuietly(this.#conns.stderr);
    }
  }

  /** stdin to the command, then its end (a half-close); none at all is an empty stdin. */
  async #feedStdin(input: SpawnOptions["stdin"]): Promise<void> {
    try {
      if (input !== undefined) {
        const stream = typeof input === "string"
          ? ReadableStream.from([new TextEncoder().encode(input)])
          : input instanceof Uint8Array
          ? ReadableStream.from([input])
          : input;
        for await (const chunk of stream) await writeAll(this.#conns.io, chunk);
      }
      await this.#conns.io.closeWrite();
    } catch {
      // The command closed its stdin early, or ended: a normal end, not our error.
    }
  }
}

/**
 * The command is over: tell the wrapper `again` and record it for the next command, unless one is
 * recorded already (then it ends). False when it was not passed on.
 */
export async function passOnWaitingExec(conns: WaitingConnections): Promise<boolean> {
  try {
    await Deno.writeTextFile(waitingExecRecordPath(conns.mountSource), JSON.stringify(conns.record), { createNew: true, mode: 0o600 });
  } catch {
    await releaseWaitingExec(conns);
    return false;
  }
  try {
    await writeAll(conns.control, new TextEncoder().encode("again\n"));
  } catch {
    // It is gone: the next command finds it dead, and passes it over.
  }
  closeQuietly(conns.control);
  trace("waiting exec: passed on");
  return true;
}

/**
 * End the wrapper: its control closed without `again` (it exits when it reads that), and its
 * directory removed. (A command stopped before its end is killed, wrapper and all, by the caller.)
 */
export async function releaseWaitingExec(conns: WaitingConnections): Promise<void> {
  for (const conn of [conns.control, conns.io, conns.stderr]) closeQuietly(conn);
  await Deno.remove(conns.hostDir, { recursive: true }).catch(() => {});
}
