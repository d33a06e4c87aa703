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
import { trace } from "../lib/trace.ts";
import { cliName } from "../lib/cli_name.ts";
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

/** Start run `id`'s supervisor with this process's stdio, pass signals on, and wait for it. */
export async function superviseForeground(id: string, args: string[]): Promise<number> {
  const child = new Deno.Command("setsid", {
    args: supervisorArgs(args),
    env: { [SUPERVISED_RUN_ENV]: id },
    stdin: "inherit",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  trace("cli: supervisor started");
  // Each Ctrl-C or SIGTERM is the run's: the supervisor decides what it does (as the CLI did).
  const forwarders = (["SIGINT", "SIGTERM"] as const).map((name) => {
    const forward = () => {
      try {
        child.kill(name);
      } catch {
        // The supervisor has ended: its status below is the answer.
      }
    };
    Deno.addSignalListener(name, forward);
    return () => Deno.removeSignalListener(name, forward);
  });
  try {
    const status = await child.status;
    if (status.signal !== null) {
      const line = `${cliName()}: run ${id}: its supervisor was ended by ${status.signal}; ` +
        `what it recorded: ${cliName()} logs ${id}\n`;
      await Deno.stderr.write(new TextEncoder().encode(line));
    }
    return status.code;
  } finally {
    for (const remove of forwarders) remove();
  }
}
