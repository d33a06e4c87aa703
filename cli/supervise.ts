/**
 * Durable sessions' supervisors, started from the CLI: a process of its own in a session of its
 * own (setsid), so that killing the CLI (even SIGKILL), closing its terminal or losing an ssh
 * connection does not end what it holds. `sandbox shell` starts one with the hidden
 * `session-supervise` command; `sandbox run` starts its own command line again, marked by
 * `SUPERVISED_RUN_ENV` with the run's id (startSupervisedRun below).
 *
 * How a run is supervised:
 * 1. The CLI picks the run's id and starts the supervisor: the same program and arguments, with
 *    `SUPERVISED_RUN_ENV=ID`. The supervisor runs the run as an unsupervised CLI would (its record's
 *    pid is the supervisor's: `sandbox runs` reports the run crashed when it dies), and forgets the
 *    variable at once, so that nothing it starts inherits it.
 * 2. In the foreground the supervisor inherits stdin, stdout and stderr: stdout is the run's NDJSON
 *    byte for byte, with no copy in between, and the CLI only waits for it (its exit code is the
 *    run's; Ctrl-C and SIGTERM are passed on). When the CLI is killed, the supervisor goes on; its
 *    writes to a terminal or pipe that is gone are dropped, its events are in the store.
 * 3. With `--detach` the CLI waits until the run is recorded, prints its id and leaves; a run that
 *    ends before that (a usage mistake) has its stderr and exit code passed on as if in the
 *    foreground.
 * `sandbox exec --detach` is supervised the same way (exec_action.ts records it, mode "exec", its
 * output lines as terminal events); a foreground exec is not, to keep its start as fast as
 * `docker exec`'s.
 */
import { cliName } from "../lib/cli_name.ts";
import { SandboxError } from "../lib/errors.ts";
import { trace, traceClock } from "../lib/trace.ts";
import { note, stdout } from "./context.ts";
import { SUPERVISED_RUN_ENV, superviseForeground, supervisorArgs } from "./supervise_first.ts";

export { SUPERVISED_RUN_ENV, supervisorArgs };

/** How often `run --detach` looks for the run's record while it starts. */
const START_POLL_MS = 50;

/** The run this process supervises (and the variable forgotten), or undefined: start one. */
export function supervisedRunId(): string | undefined {
  const id = Deno.env.get(SUPERVISED_RUN_ENV);
  if (id === undefined) return undefined;
  Deno.env.delete(SUPERVISED_RUN_ENV);
  if (!/^[\w.-]{1,100}$/.test(id)) {
    throw new SandboxError("usage", `Invalid ${SUPERVISED_RUN_ENV} "${id}": not a run id`);
  }
  return id;
}

export interface SupervisedOptions {
  /** What is supervised, for messages: "run", "exec". */
  what: "run" | "exec";
  detach?: boolean;
  json?: boolean;
  /** Detached, the supervisor still reads stdin (a run's `--prompt-file -`). */
  stdin?: boolean;
}

/** Start this command line's run (or exec) under a supervisor of its own; this CLI's exit code. */
export async function startSupervised(opts: SupervisedOptions): Promise<number> {
  if (opts.json && !opts.detach) {
    throw new SandboxError("usage", `--json is for ${opts.what} --detach`);
  }
  const { newRunId } = await import("../lib/run/run_log.ts");
  const id = newRunId();
  if (!opts.detach) return await superviseForeground(id, Deno.args);
  const child = new Deno.Command("setsid", {
    args: supervisorArgs(Deno.args),
    env: { [SUPERVISED_RUN_ENV]: id, ...traceClock() },
    stdin: opts.stdin ? "inherit" : "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  trace("cli: supervisor started");
  return await detached(child, id, opts);
}

/** `--detach`: the run's id once it is recorded; or, when it ended first, its stderr and code. */
async function detached(
  child: Deno.ChildProcess,
  id: string,
  opts: SupervisedOptions,
): Promise<number> {
  const { readRun } = await import("../lib/run/run_log.ts");
  const chunks: Uint8Array[] = [];
  const reader = child.stderr.getReader();
  const reading = (async () => {
    for (let r = await reader.read(); !r.done; r = await reader.read()) chunks.push(r.value);
  })();
  let ended: Deno.CommandStatus | undefined;
  void child.status.then((status) => ended = status);
  while (!ended && !await readRun(id)) {
    await new Promise((resolve) => setTimeout(resolve, START_POLL_MS));
  }
  if (ended) {
    await reading;
    for (const chunk of chunks) await Deno.stderr.write(chunk);
    return ended.code;
  }
  // The supervisor's later diagnostics have no reader: it drops them (its events are stored).
  await reader.cancel().catch(() => {}); // already closed: nothing to cancel
  child.unref();
  if (opts.json) await stdout.json({ id, status: "running" });
  else await stdout.line(id);
  note(
    `${opts.what} ${id} goes on in the background: ${cliName()} attach ${id} (events), ${cliName()} stop ${id}`,
  );
  return 0;
}
