/**
 * What `sandbox exec` does once its arguments are parsed (by commander, or by the fast path that
 * spares it loading commander: fast_path.ts).
 */
import { formatBytes } from "../lib/units.ts";
import {
  cliState,
  type Invocation,
  note,
  parseEnvPairs,
  parseTimeout,
  profileFor,
  signal,
  stderrLine,
  stdout,
} from "./context.ts";
import { progress } from "./progress.ts";
import type { ExecStream, ExecStreamOutcome } from "../lib/sandbox/provider.ts";

export interface ExecFlags {
  profile?: string;
  cwd: string;
  env: string[];
  timeout?: string;
  repo?: string;
}

export async function execAction(
  argv: string[],
  opts: ExecFlags,
  command: Invocation,
): Promise<void> {
  const env = parseEnvPairs(opts.env);
  const timeoutMs = parseTimeout(opts.timeout);
  // Loaded while the configuration is read.
  const modules = Promise.all([
    import("../lib/sandbox/providers.ts"),
    import("../lib/proxy/session.ts"),
  ]);
  modules.catch(() => {}); // awaited below; a configuration error first must not leave it unhandled
  const profile = await profileFor(command, opts.profile);
  const [{ openProvider }, { openSession }] = await modules;
  // The profile's development sandbox (runs never use it: each has one of its own).
  const provider = await openProvider(profile, { onProgress: progress, repo: opts.repo, signal });
  const session = await sessionWhileRunning(
    provider,
    () => openSession(profile, provider, { signal, onProgress: note }),
  );
  // resources.disk: a workspace growing past it stops the command (exit 125). Its watcher starts
  // 250 ms into the command, and never for a command over by then (lib/sandbox/disk_watch.ts).
  const watch = provider.watchDisk();
  await using _closing = {
    [Symbol.asyncDispose]: () => Promise.all([session.close(), watch.close()]).then(() => {}),
  };
  const execOptions = {
    cwd: opts.cwd,
    env: { ...session.env, ...env },
    stdin: Deno.stdin.isTerminal() ? undefined : Deno.stdin.readable,
    signal: AbortSignal.any([signal, watch.signal]),
    timeoutMs: timeoutMs ?? profile.resources.timeoutMs,
    onStderrLine: stderrLine,
  };
  const stream = provider.execStream(argv, execOptions);
  // The container outlives the command: the next command's (or run's) relay starts while this
  // one runs, so that its start does not wait for one (lib/proxy/spare_relay.ts).
  session.leaveSpareRelay();
  const outcome = await relayOutput(stream, provider, watch.signal);
  if (outcome.oomKilled) {
    note(
      `the command was killed by the sandbox memory limit (${
        formatBytes(profile.resources.memoryBytes)
      }); raise resources.memory in profile ${profile.name}`,
    );
  }
  cliState.exitCode = outcome.exitCode;
}

/**
 * Makes sure the sandbox runs and opens the command's proxy session beside it. While the command
 * runs, this process serves its proxies (LLM credentials, egress). Their relay starts while Docker
 * is asked about the container, which is all but always up as it is; when it had to be started,
 * made or replaced just now, the relay is started again in it. A session opened in vain is closed
 * before the error that made it so is thrown.
 */
async function sessionWhileRunning<S extends { close(): Promise<void> }>(
  provider: {
    ensureRunning(options: { signal: AbortSignal }): Promise<unknown>;
    readonly wasRunning: boolean;
  },
  open: () => Promise<S>,
): Promise<S> {
  let opening = open();
  // Awaited on every path below; this only keeps a failure meanwhile from counting as unhandled.
  opening.catch(() => {});
  // A session that failed to open has nothing to close: its error is superseded by the one thrown.
  const closeOpening = () => opening.then((session) => session.close(), () => {});
  try {
    await provider.ensureRunning({ signal });
  } catch (error) {
    await closeOpening();
    throw error;
  }
  if (!provider.wasRunning) {
    await closeOpening();
    opening = open();
  } else {
    // Started before Docker was asked: a concurrent command may have been making the container
    // just then ("No such container"). It exists now, so one more try is the answer.
    opening = opening.catch(open);
  }
  return await opening;
}

/**
 * Copies the command's stdout lines to ours until it ends (or our stdout closes), and returns how
 * it ended. Whatever happens, the command's leftovers are swept when its wrapper may not have ended
 * them itself.
 */
async function relayOutput(
  stream: ExecStream,
  provider: { sweep(): Promise<unknown> },
  watchSignal: AbortSignal,
): Promise<ExecStreamOutcome> {
  let outcome: ExecStreamOutcome | undefined;
  try {
    for await (const line of stream) {
      await stdout.line(line);
      if (stdout.closed) break;
    }
    outcome = await stream.outcome;
    return outcome;
  } catch (error) {
    // The disk watch's reason, when it stopped the command; an interrupt stands before it (the
    // watch may end while the interrupted command is being stopped).
    throw watchSignal.aborted && !signal.aborted ? watchSignal.reason : error;
  } finally {
    // What the command started, it takes with it, even what escaped its wrapper. A wrapper that
    // lived to the end reports its command's exit code (below 128 unless the command died of a
    // signal) and has ended its whole tree itself: a sweep is needed only when it may not have —
    // killed (the exec ends by a signal), or the exec failed.
    if (!outcome || outcome.exitCode >= 128) await provider.sweep();
  }
}
