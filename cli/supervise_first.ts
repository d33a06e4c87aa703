/**
 * A foreground `sandbox run` is held by a supervisor of its own (cli/supervise.ts): the same
 * command line run again under `setsid`, marked with the run's id. The CLI starts it first, from
 * its entry (cli.ts), before the rest of the CLI loads — the supervisor loads all of it anyway —
 * and then only waits: the run's stdout is the supervisor's (inherited, no copy), its exit code
 * the CLI's, and each Ctrl-C or SIGTERM the CLI gets is passed on. This module loads little on
 * purpose: what it imports is on every run's path twice.
 */
import { parseFastPath } from "./fast_path.ts";
import { newRunId } from "../lib/run/run_id.ts";
import { trace, traceClock } from "../lib/trace.ts";
import { cliName } from "../lib/cli_name.ts";
import { userStateDir } from "../lib/paths.ts";
import denoJson from "../deno.json" with { type: "json" };

/** The environment variable that makes a `sandbox run` the supervisor of run ID (its value). */
export const SUPERVISED_RUN_ENV = "SANDBOX_SUPERVISED_RUN";

/**
 * `setsid`'s arguments to run this program again with `args`, as it was started: from a checkout
 * with its deno.json, or (the bundle) with the unstable flags deno.json lists, which a bundle
 * cannot carry (scripts/install.ts starts it the same way).
 */
export function supervisorArgs(args: string[]): string[] {
  const main = Deno.mainModule;
  const denoConfig = main.startsWith("file:") ? new URL("./deno.json", main) : undefined;
  const config = denoConfig && existsSync(denoConfig)
    ? ["--config", denoConfig.pathname]
    : ["--no-config", ...denoJson.unstable.map((feature) => `--unstable-${feature}`)];
  return [Deno.execPath(), "run", "--allow-all", "--quiet", ...config, main, ...args];
}

function existsSync(url: URL): boolean {
  try {
    Deno.statSync(url);
    return true;
  } catch {
    return false;
  }
}

/** Whether this process is the supervisor of a `run` (not of an `exec --detach`). */
export function supervisesRun(args: string[]): boolean {
  return Deno.env.get(SUPERVISED_RUN_ENV) !== undefined && parseFastPath(args)?.kind === "run";
}

/**
 * When `args` is a plain foreground `run` (what the fast path reads, without --detach) and this
 * process is not its supervisor already: start the supervisor, wait for it, and return its exit
 * code. Undefined otherwise: the CLI goes on as usual (and a `run` there starts its supervisor
 * itself, cli/supervise.ts).
 */
export async function superviseRunFirst(args: string[]): Promise<number | undefined> {
  if (Deno.env.get(SUPERVISED_RUN_ENV) !== undefined) return undefined;
  const fast = parseFastPath(args);
  if (fast?.kind !== "run" || fast.opts.detach || fast.opts.json) return undefined;
  return await superviseForeground(newRunId(), args);
}

/**
 * The supervisor tells the CLI that started it (whose pid this variable holds) that it listens for
 * Ctrl-C and SIGTERM, with `READY_SIGNAL` (cli/context.ts, once its listeners are in place).
 * Before that, a signal's default action would end it before it recorded anything.
 */
export const SUPERVISOR_READY_ENV = "SANDBOX_SUPERVISOR_READY";
const READY_SIGNAL = "SIGUSR2";

/**
 * In a supervisor started by a foreground CLI: tell that CLI its signals may come now. Only that
 * CLI is told (its pid checked against the parent's): a CLI gone has left the supervisor to a
 * reaper, which must not get a signal it did not ask for.
 */
export function tellSupervisorReady(): void {
  const cli = Deno.env.get(SUPERVISOR_READY_ENV);
  if (cli === undefined) return;
  Deno.env.delete(SUPERVISOR_READY_ENV);
  if (Number(cli) !== Deno.ppid) return;
  try {
    Deno.kill(Deno.ppid, READY_SIGNAL);
  } catch {
    // The CLI has just gone: no one to tell.
  }
}

/**
 * Start run `id`'s supervisor with this process's stdio, pass signals on, and wait for it. A signal
 * that comes before the supervisor is ready for it is held until it is (tellSupervisorReady); a
 * second one while it is held is the user insisting, and goes at once.
 */
export async function superviseForeground(id: string, args: string[]): Promise<number> {
  let child: Deno.ChildProcess | undefined;
  let becameReady = () => {};
  const ready = new Promise<void>((resolve) => becameReady = resolve);
  let held = 0;
  const pass = (name: Deno.Signal) => {
    try {
      child?.kill(name);
    } catch {
      // The supervisor has ended: its status is the answer.
    }
  };
  // Listening before the supervisor exists: no signal meets this process's default action, which
  // would end it and leave the supervisor running with no one to pass signals on.
  const listeners: [Deno.Signal, () => void][] = [
    [READY_SIGNAL, () => becameReady()],
    ...(["SIGINT", "SIGTERM"] as const).map((name): [Deno.Signal, () => void] => [name, () => {
      if (held++ === 0) void ready.then(() => pass(name));
      else pass(name);
    }]),
  ];
  for (const [name, listener] of listeners) Deno.addSignalListener(name, listener);
  try {
    child = new Deno.Command("setsid", {
      args: supervisorArgs(args),
      env: { [SUPERVISED_RUN_ENV]: id, [SUPERVISOR_READY_ENV]: String(Deno.pid), ...traceClock() },
      stdin: "inherit",
      stdout: "inherit",
      stderr: "inherit",
    }).spawn();
    trace("cli: supervisor started");
    const status = await child.status;
    becameReady();
    if (status.signal !== null) await Deno.stderr.write(await endedBySignal(id, status.signal));
    return status.code;
  } finally {
    for (const [name, listener] of listeners) Deno.removeSignalListener(name, listener);
  }
}

/** What to say of a supervisor that a signal ended: where its record is, or that there is none. */
async function endedBySignal(id: string, signal: Deno.Signal): Promise<Uint8Array> {
  // The record's file, not the run log's reader: this module is the installed start file's, whose
  // every import is on every run's path (lib/run/run_log.ts keeps runs in the same place).
  const recorded = await Deno.stat(`${userStateDir()}/runs/${id}/meta.json`).then(
    () => true,
    () => false,
  );
  const what = recorded
    ? `what it recorded: ${cliName()} logs ${id}`
    : "it ended before recording the run: nothing was recorded";
  return new TextEncoder().encode(
    `${cliName()}: run ${id}: its supervisor was ended by ${signal}; ${what}\n`,
  );
}
