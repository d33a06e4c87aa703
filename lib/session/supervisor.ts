/**
 * A session's supervisor: the process of its own (started detached by `sandbox shell`, in a
 * session of its own: setsid) that holds a session's sandbox, program and record, so that the
 * session lives on when the terminal that started it closes or the CLI is killed.
 *
 * How it works:
 * 1. Record the session as a run (mode "shell", `meta.pid` this process: `sandbox runs` reports a
 *    session whose supervisor died as crashed), its events in the event store.
 * 2. Acquire a virgin sandbox from the profile's lifecycle, open its proxy session.
 * 3. Listen for viewers on `viewers.sock` (protocol.ts), only the user's.
 * 4. Start the program with a terminal (`RunSandbox.startTerminal`); every byte it shows and every byte typed is
 *    committed to the store, then passed on.
 *    With a repository (`--repo`), its checkout is made as a run's, and the program starts in it.
 * 5. When the program ends, its timeout passes or someone stops it: with a repository, its work
 *    brought back as a branch (shell_repo.ts; the sandbox kept when it cannot come back); a system
 *    event with the exit code, the viewers told, the record finished, the sandbox released.
 */
import type { Profile } from "../config.ts";
import { closeQuietly, writeAll } from "../conn.ts";
import { readLines } from "../lines.ts";
import { openSession, type SandboxSession } from "../proxy/session.ts";
import { AGENT_GIT_IDENTITY, type RunWorktree } from "../repo/local.ts";
import { RunLog } from "../run/run_log.ts";
import { sandboxLifecycle } from "../sandbox/providers.ts";
import type { RunSandbox, Terminal } from "../sandbox/provider.ts";
import { EventWriter } from "./event_store.ts";
import {
  clampSize,
  decodeBytes,
  encodeBytes,
  MAX_LINE_CHARS,
  parseMessage,
  REDRAW_BYTES,
  type Role,
  SESSION_DIR_MODE,
  sessionDir,
  type SessionSpec,
  type SupervisorMessage,
  type ViewerMessage,
  VIEWERS_SOCKET_MODE,
  viewersSocket,
} from "./protocol.ts";
import { bringShellBack, checkOutForShell, type ShellRepoOutcome } from "./shell_repo.ts";
import { agentProgram } from "./agent_program.ts";

const encoder = new TextEncoder();

export interface SuperviseOptions {
  /** Diagnostics, for the supervisor's own log. */
  log: (line: string) => void;
  /** Stops the session (SIGTERM to the supervisor), as `sandbox stop ID` does. */
  signal?: AbortSignal;
}

/** What a session holds while it lives; each released (or kept) when it ends. */
interface Held {
  sandbox?: RunSandbox;
  session?: SandboxSession;
  worktree?: RunWorktree;
}

/** Run session `spec` to its end; the program's exit code. */
export async function superviseSession(
  spec: SessionSpec,
  profile: Profile,
  options: SuperviseOptions,
): Promise<number> {
  await using record = await RunLog.create({
    id: spec.id,
    mode: "shell",
    profile: profile.name,
    model: "-",
    sandbox: profile.sandbox.mode,
  });
  using events = new EventWriter(spec.id);
  const started = Date.now();
  const held: Held = {};
  let exitCode = 125;
  let error: string | null = null;
  const hub = new ViewerHub(events);
  let serving: Promise<void> | undefined;
  try {
    const tty = await startShell(spec, profile, held, record, options);
    hub.attach(tty);
    const listener = listenForViewers(spec.id);
    serving = hub.serve(listener);
    const timer = setTimeout(() => hub.stop("timeout"), profile.resources.timeoutMs);
    options.signal?.addEventListener("abort", () => hub.stop("stopped"), { once: true });
    exitCode = await hub.pump(tty.output, tty.exitCode);
    clearTimeout(timer);
    listener.close();
  } catch (e) {
    error = e instanceof Error ? e.message : String(e);
    options.log(`session ${spec.id} failed: ${error}`);
  }
  const back = await bringBack(spec, profile, held, hub);
  const durationMs = Date.now() - started;
  hub.end(exitCode, durationMs);
  await serving;
  await held.session?.close().catch((e) => options.log(`closing the proxies: ${e}`));
  await (back?.keep ? held.sandbox?.keep() : held.sandbox?.release())
    ?.catch((e) => options.log(`releasing the sandbox: ${e}`));
  await record.finish({
    status: hub.stopped
      ? "interrupted"
      : error
      ? "failed"
      : exitCode === 0
      ? "succeeded"
      : "failed",
    exitCode,
    usage: null,
    error,
    extra: back?.extra,
  });
  await Deno.remove(viewersSocket(spec.id)).catch(() => {}); // never made when the start failed
  return exitCode;
}

/** The sandbox, its proxies and (with a repository) its checkout, then the program in it. */
async function startShell(
  spec: SessionSpec,
  profile: Profile,
  held: Held,
  record: RunLog,
  options: SuperviseOptions,
): Promise<Terminal> {
  const repo = spec.repo && { key: spec.repo.local.key };
  const sandbox = held.sandbox = await (await sandboxLifecycle(profile)).acquire({
    runId: spec.id,
    repo,
    agent: spec.agent?.name,
  });
  await record.note({ sandbox: sandbox.name });
  const checkingOut = spec.repo && checkOutForShell(sandbox, spec.repo, spec.id);
  checkingOut?.catch(() => {}); // awaited below, where its error counts
  held.session = sandbox.relay
    ? await openSession(profile, sandbox.relay, { runId: spec.id, onProgress: options.log })
    : undefined;
  held.worktree = await checkingOut;
  if (spec.repo) await record.note({ repo: spec.repo.local.path, workdir: held.worktree!.path });
  const env = { ...held.session?.env, ...(held.worktree ? AGENT_GIT_IDENTITY : {}) };
  const program = spec.agent
    ? await agentProgram(sandbox, spec.agent, { env, cwd: held.worktree?.path, runId: spec.id })
    : { argv: spec.argv, env };
  if (spec.agent) await record.note({ agent: spec.agent.name });
  return await sandbox.startTerminal({
    argv: program.argv,
    cwd: held.worktree?.path,
    env: { ...program.env, TERM: spec.term },
    size: { rows: spec.rows, cols: spec.cols },
  });
}

/** A repository shell's work, brought back (or kept) once the shell has ended; said to all. */
async function bringBack(
  spec: SessionSpec,
  profile: Profile,
  held: Held,
  hub: ViewerHub,
): Promise<ShellRepoOutcome | undefined> {
  if (!spec.repo || !held.sandbox || !held.worktree) return undefined;
  hub.say([`bringing the shell's work back to ${spec.repo.local.path}...`]);
  const back = await bringShellBack(held.sandbox, spec.repo, held.worktree, {
    runId: spec.id,
    profile: profile.name,
    maxBytes: profile.resources.diskBytes,
  });
  hub.say(back.lines);
  return back;
}

/** The viewers' socket, in the session's directory: both only the user's. */
export function listenForViewers(id: string): Deno.Listener<Deno.UnixConn> {
  Deno.mkdirSync(sessionDir(id), { recursive: true, mode: SESSION_DIR_MODE });
  Deno.chmodSync(sessionDir(id), SESSION_DIR_MODE);
  const path = viewersSocket(id);
  const listener = Deno.listen({ transport: "unix", path });
  Deno.chmodSync(path, VIEWERS_SOCKET_MODE);
  return listener;
}

interface Viewer {
  conn: Deno.UnixConn;
  role: Role;
}

/**
 * The session's terminal and its viewers: output committed then sent to all, input from the one
 * writer committed then typed. A second writer is made a viewer.
 */
class ViewerHub {
  readonly #events: EventWriter;
  readonly #viewers = new Set<Viewer>();
  readonly #decoder = new TextDecoder();
  #tty: Terminal | undefined;
  /** The latest output, for a new viewer's redraw. */
  #tail: Uint8Array[] = [];
  #tailBytes = 0;
  stopped: string | undefined;

  constructor(events: EventWriter) {
    this.#events = events;
  }

  attach(tty: Terminal): void {
    this.#tty = tty;
  }

  stop(why: string): void {
    this.stopped ??= why;
    this.#tty?.close();
  }

  /** Copy the terminal's output to the store and the viewers until it ends; the exit code. */
  async pump(output: ReadableStream<Uint8Array>, exitCode: Promise<number>): Promise<number> {
    for await (const chunk of output) {
      const text = this.#decoder.decode(chunk, { stream: true });
      if (text !== "") {
        this.#events.append({ channel: "terminal", type: "output", source: "user", data: text });
      }
      this.#remember(chunk);
      this.#send({ t: "out", data: encodeBytes(chunk) });
    }
    return this.stopped ? 130 : await exitCode;
  }

  #remember(chunk: Uint8Array): void {
    this.#tail.push(chunk);
    this.#tailBytes += chunk.byteLength;
    while (this.#tailBytes - this.#tail[0].byteLength >= REDRAW_BYTES) {
      this.#tailBytes -= this.#tail.shift()!.byteLength;
    }
  }

  /** Lines from the system: stored, and shown to the viewers. */
  say(lines: string[]): void {
    const data = lines.map((line) => `${line}\r\n`).join("");
    this.#events.append({ channel: "terminal", type: "output", source: "system", data });
    this.#send({ t: "out", data: encodeBytes(encoder.encode(data)) });
  }

  /** The system line, the viewers told and let go. */
  end(exitCode: number, durationMs: number): void {
    const why = this.stopped ? ` (${this.stopped})` : "";
    this.#events.append({
      channel: "terminal",
      type: "output",
      source: "system",
      data: `\n[Process exited with code ${exitCode} in ${durationMs}ms${why}]\n`,
    });
    this.#send({ t: "exit", code: exitCode });
    for (const viewer of this.#viewers) closeQuietly(viewer.conn);
    this.#viewers.clear();
  }

  #send(message: SupervisorMessage, only?: Viewer): void {
    const line = encoder.encode(JSON.stringify(message) + "\n");
    for (const viewer of only ? [only] : this.#viewers) {
      // A viewer too slow or gone is dropped rather than holding the session up.
      writeAll(viewer.conn, line).catch(() => this.#drop(viewer));
    }
  }

  #drop(viewer: Viewer): void {
    this.#viewers.delete(viewer);
    closeQuietly(viewer.conn);
  }

  async serve(listener: Deno.Listener<Deno.UnixConn>): Promise<void> {
    const talks: Promise<void>[] = [];
    try {
      for await (const conn of listener) talks.push(this.#talk(conn));
    } catch {
      // The listener was closed: the session is over.
    }
    await Promise.allSettled(talks);
  }

  /** One viewer's conversation: hello, then its input until it goes. */
  async #talk(conn: Deno.UnixConn): Promise<void> {
    let viewer: Viewer | undefined;
    try {
      for await (const line of readLines(conn.readable, MAX_LINE_CHARS)) {
        const message = parseMessage<ViewerMessage>(line);
        if (!message) break;
        if (!viewer) {
          if (message.t !== "hello") break;
          viewer = this.#welcome(conn, message);
          continue;
        }
        await this.#handle(viewer, message);
      }
    } catch {
      // A line too long or a reset connection: the viewer is let go.
    }
    if (viewer) this.#drop(viewer);
    else closeQuietly(conn);
  }

  #welcome(conn: Deno.UnixConn, hello: Extract<ViewerMessage, { t: "hello" }>): Viewer {
    const writerTaken = [...this.#viewers].some((v) => v.role === "writer");
    const role: Role = hello.role === "writer" && !writerTaken ? "writer" : "viewer";
    const viewer = { conn, role };
    this.#send({ t: "welcome", role }, viewer);
    if (this.#tailBytes > 0) {
      const tail = new Uint8Array(this.#tailBytes);
      let at = 0;
      for (const chunk of this.#tail) tail.set(chunk, (at += chunk.byteLength) - chunk.byteLength);
      this.#send({ t: "out", data: encodeBytes(tail) }, viewer);
    }
    this.#viewers.add(viewer);
    if (role === "writer") this.#redraw(clampSize(hello.rows, hello.cols));
    return viewer;
  }

  /** The writer's size, changed and changed back: the program hears SIGWINCH and redraws. */
  #redraw(size: { rows: number; cols: number }): void {
    const tty = this.#tty;
    if (!tty) return;
    tty.resize({ rows: size.rows, cols: size.cols + 1 })
      .then(() => tty.resize(size))
      .catch(() => {}); // the program has ended: nothing to redraw
  }

  async #handle(viewer: Viewer, message: ViewerMessage): Promise<void> {
    if (message.t === "stop") return this.stop("stopped");
    if (viewer.role !== "writer" || !this.#tty) return;
    if (message.t === "in" && typeof message.data === "string") {
      const bytes = decodeBytes(message.data);
      this.#events.append({
        channel: "terminal",
        type: "input",
        source: "user",
        data: new TextDecoder().decode(bytes),
      });
      await this.#tty.write(bytes);
    } else if (message.t === "resize") {
      await this.#tty.resize(clampSize(message.rows, message.cols)).catch(() => {}); // ended
    }
  }
}
