/**
 * `sandbox shell`, `sandbox attach` and the hidden `sandbox session-supervise`: sessions you type
 * into, leave, and come back to (docs/sessions.md). `shell` starts a session's supervisor detached
 * (setsid: closing the terminal or killing this CLI does not end it), then attaches this terminal
 * to it as its writer; with --detach it prints the session's id and leaves it running.
 */
import type { Command } from "commander";
import { cliName } from "../lib/cli_name.ts";
import type { Profile } from "../lib/config.ts";
import { SandboxError } from "../lib/errors.ts";
import type { SessionSpec } from "../lib/session/protocol.ts";
import type { ShellRepo } from "../lib/session/shell_repo.ts";
import { cliState, globals, type Invocation, note, profileFor, signal, stdout } from "./context.ts";
import { attachAction, attachTerminal, connectSession } from "./attach_command.ts";
import { progress, stopSpinner } from "./progress.ts";
import { supervisorArgs } from "./supervise.ts";

/** How often `shell` looks for the supervisor's socket while the sandbox starts. */
const START_POLL_MS = 100;

export function registerShellCommands(program: Command): void {
  program.command("shell")
    .description(
      "an interactive shell in a fresh sandbox, destroyed when the shell ends (with --repo, its commits come back as a branch)",
    )
    .option("-p, --profile <name>", "profile whose sandbox settings apply")
    .option("-d, --detach", "start the session in the background and print its id")
    .option(
      "--repo <path>",
      "start in a checkout of this local repository; what is committed comes back as a branch",
    )
    .option("--branch <name>", "the branch the work becomes (with --repo; default sandbox/<id>)")
    .action(async (opts: ShellOptions, command: Command) => {
      await shellAction(opts, command);
    });
  program.command("attach")
    .description(
      "join a session from this terminal (a finished one is replayed); a run's (or an MCP environment's) events are replayed, then followed while it lives",
    )
    .argument("<session-id>", "as printed by shell --detach, or listed by sandbox runs")
    .option("--view", "watch without typing")
    .option("--from <seq|time>", "a run's events from this event number or time (default: 1)")
    .action(async (id: string, opts: { view?: boolean; from?: string }) =>
      await attachAction(id, opts)
    );
  program.command("session-supervise", { hidden: true })
    .argument("<session-id>")
    .action(async (id: string, _opts: unknown, command: Command) => {
      cliState.exitCode = await superviseAction(id, command);
    });
}

export interface ShellOptions {
  profile?: string;
  detach?: boolean;
  repo?: string;
  branch?: string;
}

/** The program a terminal session runs: a login shell, or an agent's TUI (agent_session_command.ts). */
export interface SessionProgram {
  /** The command as the user typed it, for messages: "sandbox shell". */
  what: string;
  argv: string[];
  /** Checks before anything starts, and what the spec adds (the agent's settings). */
  prepare?: (profile: Profile, repo: ShellRepo | undefined) => Promise<Partial<SessionSpec>>;
}

function shellAction(opts: ShellOptions, command: Invocation): Promise<void> {
  return openTerminalSession(opts, command, { what: "sandbox shell", argv: ["bash", "-l"] });
}

/**
 * Start a session's supervisor for `program` (detached: it outlives this process), then attach
 * this terminal as its writer, or with --detach print its id.
 */
export async function openTerminalSession(
  opts: ShellOptions,
  command: Invocation,
  program: SessionProgram,
): Promise<void> {
  if (!opts.detach && !Deno.stdin.isTerminal()) {
    throw new SandboxError("usage", `${program.what} needs a terminal: stdin is not one`, {
      detail: `Start it in the background with: ${cliName()} ${
        program.what.replace(/^sandbox /, "")
      } --detach`,
    });
  }
  const profile = await profileFor(command, opts.profile);
  if (profile.sandbox.mode !== "container") {
    throw new SandboxError(
      "usage",
      `Profile "${profile.name}" uses sandbox mode "${profile.sandbox.mode}": ${program.what} needs mode "container"`,
    );
  }
  const [{ newRunId }, { sessionDir, SESSION_DIR_MODE }] = await Promise.all([
    import("../lib/run/run_log.ts"),
    import("../lib/session/protocol.ts"),
  ]);
  const id = newRunId();
  const repo = await shellRepo(opts, id, program.what);
  const extra = await program.prepare?.(profile, repo);
  let size = { rows: 24, cols: 80 };
  try {
    const { rows, columns } = Deno.consoleSize();
    size = { rows, cols: columns };
  } catch {
    // No terminal (--detach from a script): the writer who attaches later sets the size.
  }
  const spec: SessionSpec = {
    id,
    profile: profile.name,
    config: globals(command).config,
    argv: program.argv,
    ...size,
    term: Deno.env.get("TERM") || "xterm-256color",
    repo,
    ...extra,
  };
  await Deno.mkdir(sessionDir(id), { recursive: true, mode: SESSION_DIR_MODE });
  await Deno.writeTextFile(`${sessionDir(id)}/spec.json`, JSON.stringify(spec), { mode: 0o600 });
  startSupervisor(id, spec.config);
  const conn = await waitForSession(id);
  if (opts.detach) {
    conn.close();
    await stdout.line(id);
    return note(`session ${id} runs in the background: ${cliName()} attach ${id}`);
  }
  const code = await attachTerminal(conn, id, "writer");
  if (code === undefined) return note(`detached; the session goes on (${cliName()} attach ${id})`);
  cliState.exitCode = code;
}

/** `--repo`, checked before anything starts: a local repository, and a branch it can take. */
async function shellRepo(
  opts: ShellOptions,
  id: string,
  what: string,
): Promise<ShellRepo | undefined> {
  if (!opts.repo) {
    if (opts.branch) throw new SandboxError("usage", `--branch is for ${what} --repo`);
    return undefined;
  }
  const [{ isRemoteUrl }, { checkRunBranch, resolveLocalRepo }] = await Promise.all([
    import("../lib/repo/remote.ts"),
    import("../lib/repo/local.ts"),
  ]);
  if (isRemoteUrl(opts.repo)) {
    throw new SandboxError(
      "usage",
      `${what} --repo takes a local repository, not a URL: "${opts.repo}"`,
      { detail: "Clone it and pass the clone's path, or use run agentic --repo URL" },
    );
  }
  const local = await resolveLocalRepo(opts.repo);
  const branch = opts.branch ?? `sandbox/${id}`;
  await checkRunBranch(local, branch);
  if (local.uncommitted > 0) {
    note(
      `warning: ${local.uncommitted} uncommitted change(s) in ${local.path} are NOT sent: the sandbox gets ${local.baseName} (${
        local.base.slice(0, 12)
      }) as committed`,
    );
  }
  return { local, branch };
}

/** The supervisor, in a session of its own (setsid), outliving this process. */
function startSupervisor(id: string, config: string | undefined): void {
  const args = ["session-supervise", ...(config ? ["--config", config] : []), id];
  const child = new Deno.Command("setsid", {
    args: supervisorArgs(args),
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  child.unref();
}

/** The session's socket once it listens; its failure when its supervisor ended first. */
async function waitForSession(id: string): Promise<Deno.UnixConn> {
  const { readRun } = await import("../lib/run/run_log.ts");
  const { sessionDir } = await import("../lib/session/protocol.ts");
  progress(`starting session ${id}`, "begin");
  let recorded = false;
  for (let polls = 0;; polls++) {
    const conn = await connectSession(id);
    if (conn) {
      stopSpinner();
      return conn;
    }
    const meta = await readRun(id);
    recorded ||= meta !== undefined;
    const gone = meta ? meta.status !== "running" : polls > 300;
    if (gone || (recorded && !meta)) {
      const log = await Deno.readTextFile(`${sessionDir(id)}/supervisor.log`).catch(() => "");
      throw new SandboxError(
        "exec_failed",
        `Session "${id}" could not start: ${
          meta?.error ?? (log.trim().split("\n").pop() || "its supervisor ended")
        }`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, START_POLL_MS));
  }
}

/** The supervisor process: `spec.json` read, the session run to its end, diagnostics in its log. */
async function superviseAction(id: string, command: Invocation): Promise<number> {
  const [{ sessionDir }, { superviseSession }] = await Promise.all([
    import("../lib/session/protocol.ts"),
    import("../lib/session/supervisor.ts"),
  ]);
  const dir = sessionDir(id);
  const log = await Deno.open(`${dir}/supervisor.log`, {
    append: true,
    create: true,
    mode: 0o600,
  });
  const encoder = new TextEncoder();
  const write = (line: string) =>
    log.writeSync(encoder.encode(`${new Date().toISOString()} ${line}\n`));
  try {
    const spec = JSON.parse(await Deno.readTextFile(`${dir}/spec.json`)) as SessionSpec;
    const profile = await profileFor(command, spec.profile);
    write(`session ${id}: supervisor ${Deno.pid} for profile ${profile.name}`);
    const code = await superviseSession(spec, profile, { log: write, signal });
    write(`session ${id}: ended with ${code}`);
    return code;
  } catch (error) {
    write(`session ${id}: ${error instanceof Error ? error.stack ?? error.message : error}`);
    throw error;
  } finally {
    log.close();
  }
}
