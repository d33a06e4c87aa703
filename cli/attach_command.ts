/**
 * `sandbox attach ID`: a terminal joined to a live session (as its writer, or a viewer when one
 * already types, or with --view), or a finished session's terminal replayed. Also the terminal end
 * of `sandbox shell`, and `sandbox stop ID`.
 */
import { writeAll } from "../lib/conn.ts";
import { EXIT, SandboxError } from "../lib/errors.ts";
import { cliName } from "../lib/cli_name.ts";
import { readLines } from "../lib/lines.ts";
import {
  decodeBytes,
  encodeBytes,
  MAX_LINE_CHARS,
  parseMessage,
  type Role,
  type SupervisorMessage,
  type ViewerMessage,
  viewersSocket,
} from "../lib/session/protocol.ts";
import { cliState, note } from "./context.ts";

const encoder = new TextEncoder();
/** Ctrl-]: leaves the session running and ends this terminal's part in it (as telnet's escape). */
const DETACH_KEY = 0x1d;

/** Connect to live session `id`'s viewers' socket; undefined when nothing listens there. */
export async function connectSession(id: string): Promise<Deno.UnixConn | undefined> {
  try {
    return await Deno.connect({ transport: "unix", path: viewersSocket(id) });
  } catch (error) {
    if (error instanceof Deno.errors.NotFound || error instanceof Deno.errors.ConnectionRefused) {
      return undefined;
    }
    throw error;
  }
}

function send(conn: Deno.UnixConn, message: ViewerMessage): Promise<void> {
  return writeAll(conn, encoder.encode(JSON.stringify(message) + "\n"));
}

/** Terminal bytes to stdout as they are (no line writer: they are not lines). */
async function writeOut(bytes: Uint8Array): Promise<void> {
  let rest = bytes;
  while (rest.length > 0) rest = rest.subarray(await Deno.stdout.write(rest));
}

function windowSize(): { rows: number; cols: number } {
  try {
    const { rows, columns } = Deno.consoleSize();
    return { rows, cols: columns };
  } catch {
    return { rows: 24, cols: 80 };
  }
}

/**
 * Show session `id` on this terminal and, as its writer, type into it, until its program ends
 * (its exit code) or the user detaches with Ctrl-] (undefined).
 */
export async function attachTerminal(
  conn: Deno.UnixConn,
  id: string,
  role: Role,
): Promise<number | undefined> {
  const raw = role === "writer" && Deno.stdin.isTerminal();
  await send(conn, { t: "hello", role, ...windowSize() });
  const detached = Promise.withResolvers<undefined>();
  const resize = () => void send(conn, { t: "resize", ...windowSize() }).catch(() => {}); // gone: the read below ends
  if (raw) {
    Deno.stdin.setRaw(true);
    Deno.addSignalListener("SIGWINCH", resize);
    void typeInto(conn, detached.resolve);
  }
  try {
    return await Promise.race([showOutput(conn, id, role), detached.promise]);
  } finally {
    if (raw) {
      Deno.removeSignalListener("SIGWINCH", resize);
      Deno.stdin.setRaw(false);
    }
    try {
      conn.close();
    } catch {
      // Closed by the supervisor at the session's end.
    }
  }
}

/** The terminal's keys to the session, until Ctrl-] (then `detach()`) or the session's end. */
async function typeInto(conn: Deno.UnixConn, detach: (value: undefined) => void): Promise<void> {
  try {
    for await (const chunk of Deno.stdin.readable) {
      const at = chunk.indexOf(DETACH_KEY);
      if (at > 0) await send(conn, { t: "in", data: encodeBytes(chunk.subarray(0, at)) });
      if (at >= 0) return detach(undefined);
      await send(conn, { t: "in", data: encodeBytes(chunk) });
    }
  } catch {
    // The session's socket closed: its end is read from the output side.
  }
}

/** The supervisor's messages until `exit`; its code. */
async function showOutput(conn: Deno.UnixConn, id: string, asked: Role): Promise<number> {
  for await (const line of readLines(conn.readable, MAX_LINE_CHARS)) {
    const message = parseMessage<SupervisorMessage>(line);
    if (message?.t === "out") await writeOut(decodeBytes(message.data));
    else if (message?.t === "welcome" && message.role !== asked) {
      note(`session ${id} has a writer already: you are a viewer (your keys are not sent)`);
    } else if (message?.t === "exit") return message.code;
  }
  throw new SandboxError(
    "exec_failed",
    `Session "${id}" ended without an exit code: its supervisor died`,
    { detail: `What it showed: ${cliName()} logs ${id}` },
  );
}

/** `sandbox attach ID [--view]`. */
export async function attachAction(
  id: string,
  opts: { view?: boolean; from?: string },
): Promise<void> {
  const [{ readRun }] = await Promise.all([import("../lib/run/run_log.ts")]);
  const meta = await readRun(id);
  if (!meta) {
    throw new SandboxError("usage", `No session "${id}"`, {
      detail: `List sessions and runs with: ${cliName()} runs`,
    });
  }
  if (meta.mode !== "shell") {
    // An NDJSON session (a run, an MCP environment): its events from where the viewer asks,
    // then followed while it lives; there is nothing to type into.
    const { logsFromStore } = await import("./store_logs.ts");
    await logsFromStore(id, { follow: true, format: "ndjson", from: opts.from ?? "1" });
    return await saidEnded(id, meta.status === "running");
  }
  if (meta.status !== "running") return await replayEnded(id, meta.status, meta.exitCode);
  if (!opts.view && !Deno.stdin.isTerminal()) {
    throw new SandboxError("usage", "Cannot attach as the writer: stdin is not a terminal", {
      detail: `Watch without typing: ${cliName()} attach --view ${id}`,
    });
  }
  const conn = await connectSession(id);
  if (!conn) return await replayEnded(id, "ended", null);
  const code = await attachTerminal(conn, id, opts.view ? "viewer" : "writer");
  if (code === undefined) {
    return void note(`detached; the session goes on (${cliName()} attach ${id})`);
  }
  cliState.exitCode = code;
}

/** A session that is over: its terminal replayed from the store, and said so. */
async function replayEnded(id: string, status: string, exitCode: number | null): Promise<void> {
  const { replayStream } = await import("../lib/session/event_store.ts");
  for await (const batch of replayStream(id)) {
    const output = batch.filter((e) => e.channel === "terminal" && e.type === "output");
    await writeOut(encoder.encode(output.map((e) => e.data).join("")));
  }
  note(
    status === "crashed"
      ? `session ${id} is over: its supervisor died (above, all it recorded)`
      : `session ${id} has ended${exitCode === null ? "" : ` (exit ${exitCode})`}: replayed above`,
  );
  cliState.exitCode = status === "crashed" ? EXIT.failure : EXIT.ok;
}

/** A run's events shown to its end: how it ended said, and its exit code this command's. */
async function saidEnded(id: string, followed: boolean): Promise<void> {
  const { readRun } = await import("../lib/run/run_log.ts");
  const meta = await readRun(id);
  if (!meta || meta.status === "running") return; // interrupted while following: nothing ended
  const what = meta.mode === "exec" ? "command" : "run";
  const exit = meta.exitCode === null ? "" : `, exit ${meta.exitCode}`;
  if (meta.status === "crashed") {
    const { describeUnreaped } = await import("../lib/run/recovery.ts");
    const work = describeUnreaped(meta);
    note(
      `${what} ${id} crashed: its supervisor died (above, all it recorded)${
        work ? `; ${work}` : ""
      }`,
    );
    cliState.exitCode = EXIT.failure;
  } else if (followed) {
    note(`${what} ${id} ended (${meta.status}${exit})`);
    cliState.exitCode = meta.exitCode ?? EXIT.failure;
  } else {
    note(`${what} ${id} has ended (${meta.status}${exit}): replayed above`);
  }
}

/** Modes of record whose supervisor is the run itself (`run`, `exec --detach`): stopped by a signal. */
const RUN_MODES = new Set(["agentic", "generate", "exec"]);
/** How often `stop` looks whether a stopped run has recorded its end. */
const STOP_POLL_MS = 100;

/** `sandbox stop ID`: the session's program and sandbox ended (a run: as on Ctrl-C). */
export async function stopSession(id: string): Promise<number> {
  const { readRun } = await import("../lib/run/run_log.ts");
  const meta = await readRun(id);
  if (meta && RUN_MODES.has(meta.mode)) {
    const what = meta.mode === "exec" ? "command" : "run";
    if (meta.status !== "running") {
      throw new SandboxError(
        "usage",
        `${what === "run" ? "Run" : "Command"} "${id}" is not running: it ${meta.status}`,
        {
          detail: `What it did: ${cliName()} attach ${id}`,
        },
      );
    }
    // The record's pid is its supervisor's, alive with the recorded start time (readRun checked).
    // Stopped once that process has ended: its record written, its sandbox gone.
    Deno.kill(meta.pid, "SIGTERM");
    const { isSameProcessAlive } = await import("../lib/process.ts");
    while (await isSameProcessAlive(meta.pid, meta.pidStartTicks)) {
      await new Promise((resolve) => setTimeout(resolve, STOP_POLL_MS));
    }
    const now = await readRun(id) ?? { ...meta, status: "crashed" };
    note(
      `${what} ${id} stopped: ${now.status}${
        now.exitCode === null ? "" : ` (exit ${now.exitCode})`
      }`,
    );
    return now.exitCode ?? EXIT.failure;
  }
  const conn = await connectSession(id);
  if (!conn) {
    throw new SandboxError("usage", `No live session "${id}"`, {
      detail: `List sessions and runs with: ${cliName()} runs`,
    });
  }
  await send(conn, { t: "hello", role: "viewer", rows: 24, cols: 80 });
  await send(conn, { t: "stop" });
  for await (const line of readLines(conn.readable, MAX_LINE_CHARS)) {
    const message = parseMessage<SupervisorMessage>(line);
    if (message?.t === "exit") {
      conn.close();
      return message.code;
    }
  }
  return EXIT.failure;
}
