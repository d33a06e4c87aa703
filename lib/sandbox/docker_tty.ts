/**
 * A command in a container with a terminal (`RunSandbox.startTerminal` of docker_lifecycle.ts): an
 * exec made with `Tty: true` through the Engine API on the engine's Unix socket. Its attached
 * stream is the terminal's raw bytes both ways (no multiplexing headers); its window size is set
 * with the exec resize endpoint; its exit code is the engine's once the stream ends. The command
 * runs under the sandbox's exec wrapper (scripts/sandbox-exec), as the sandbox user, like every
 * other command the tool starts there.
 */
import { writeAll } from "../conn.ts";
import { SandboxError } from "../errors.ts";
import { assertNoSecrets } from "../secret_guard.ts";
import { engineRequest, engineSocket, readHead, requestHead } from "./engine_api.ts";
import type { Terminal, TerminalRequest } from "./provider.ts";
import { SANDBOX_USER } from "./users.ts";

/** What a terminal in a container is started with. */
export interface TtyExecRequest extends TerminalRequest {
  container: string;
}

/** A running command with a terminal. */
export type TtyExec = Terminal;

/** Start `request.argv` with a terminal in `request.container`. */
export async function startTtyExec(request: TtyExecRequest): Promise<TtyExec> {
  // No key or token the host holds goes in, whatever built the environment (an agent's TUI too).
  assertNoSecrets(`sandbox "${request.container}"`, { env: request.env, argv: request.argv });
  const socket = engineSocket();
  if (!socket) {
    throw new SandboxError(
      "unsupported",
      "A terminal in a sandbox needs the Docker engine's API on its Unix socket",
      { detail: "Set DOCKER_HOST to unix:///var/run/docker.sock or leave it unset" },
    );
  }
  const created = await engineRequest(socket, "POST", `/containers/${request.container}/exec`, {
    User: SANDBOX_USER,
    WorkingDir: request.cwd ?? "",
    Env: Object.entries(request.env).map(([name, value]) => `${name}=${value}`),
    Cmd: ["sandbox-exec", crypto.randomUUID(), ...request.argv],
    AttachStdin: true,
    AttachStdout: true,
    AttachStderr: true,
    Tty: true,
    ConsoleSize: [request.size.rows, request.size.cols],
  });
  if (created.status !== 201 && created.status !== 200) {
    throw new SandboxError(
      "exec_failed",
      `Cannot start a terminal in sandbox "${request.container}": ${created.body.trim()}`,
    );
  }
  const id = (JSON.parse(created.body) as { Id: string }).Id;
  const conn = await Deno.connect({ transport: "unix", path: socket });
  await writeAll(
    conn,
    requestHead(
      "POST",
      `/exec/${id}/start`,
      JSON.stringify({
        Detach: false,
        Tty: true,
        ConsoleSize: [request.size.rows, request.size.cols],
      }),
      "Connection: Upgrade\r\nUpgrade: tcp\r\n",
    ),
  );
  const head = await readHead(conn);
  if (head.status !== 101 && head.status !== 200) {
    conn.close();
    throw new SandboxError(
      "exec_failed",
      `Cannot attach to a terminal in sandbox "${request.container}": status ${head.status}`,
    );
  }
  return ttyExecOf(socket, id, conn, head.rest);
}

function ttyExecOf(socket: string, id: string, conn: Deno.UnixConn, first: Uint8Array): TtyExec {
  let ended!: () => void;
  const end = new Promise<void>((resolve) => ended = resolve);
  const output = new ReadableStream<Uint8Array>({
    start(controller) {
      if (first.byteLength > 0) controller.enqueue(first.slice());
    },
    async pull(controller) {
      const chunk = new Uint8Array(32 * 1024);
      let n: number | null;
      try {
        n = await conn.read(chunk);
      } catch {
        // Closed by `close()` or reset by the engine: the terminal's end; the exit code says the rest.
        n = null;
      }
      if (n === null) {
        controller.close();
        ended();
        return;
      }
      controller.enqueue(chunk.slice(0, n));
    },
    cancel() {
      ended();
    },
  });
  const exitCode = end.then(() => execExitCode(socket, id));
  return {
    output,
    exitCode,
    write: (bytes) => writeAll(conn, bytes).catch(() => {}), // the command has ended: input goes nowhere
    resize: async (size) => {
      await engineRequest(socket, "POST", `/exec/${id}/resize?h=${size.rows}&w=${size.cols}`);
    },
    close: () => {
      try {
        conn.close();
      } catch {
        // Already closed by the engine.
      }
    },
  };
}

/** The exec's exit code once the engine says it is over (its stream ends a moment before). */
async function execExitCode(socket: string, id: string): Promise<number> {
  for (let tries = 0; tries < 100; tries++) {
    const response = await engineRequest(socket, "GET", `/exec/${id}/json`);
    if (response.status !== 200) return 125;
    const state = JSON.parse(response.body) as { Running?: boolean; ExitCode?: number | null };
    if (!state.Running && typeof state.ExitCode === "number") return state.ExitCode;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return 125;
}
