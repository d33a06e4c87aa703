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
import { startSupervised, supervisedRunId } from "./supervise.ts";
import { EXIT, exitCodeFor, SandboxError } from "../lib/errors.ts";
import { trace } from "../lib/trace.ts";
import type { ExecStream, ExecStreamOutcome } from "../lib/sandbox/provider.ts";
import type { DiskWatch } from "../lib/sandbox/disk_watch.ts";
import type { SandboxSession } from "../lib/proxy/session.ts";
import type { Profile } from "../lib/config.ts";

export interface ExecFlags {
  profile?: string;
  cwd: string;
  env: string[];
  timeout?: string;
  repo?: string;
  /** Start the command in the background, recorded, and print its id (cli/supervise.ts). */
  detach?: boolean;
  /** With --detach: the id as JSON. */
  json?: boolean;
}

/** Where a recorded (detached) command's lines go besides stdout and stderr. */
interface ExecSink {
  line(text: string): void;
  errorLine(text: string): void;
}

export async function execAction(
  argv: string[],
  opts: ExecFlags,
  command: Invocation,
): Promise<void> {
  if (opts.detach || opts.json) {
    const id = supervisedRunId();
    if (id === undefined) {
      cliState.exitCode = await startSupervised({ ...opts, what: "exec" });
      return;
    }
    return await recordedExec(id, argv, opts, command);
  }
  cliState.exitCode = await execIn(argv, opts, command);
}

/**
 * A detached command, in its supervisor: recorded as a session (mode "exec"; `sandbox runs`), its
 * stdout lines and stderr lines committed to the event store as terminal output and error events
 * before they are passed on, then a system line with its exit code.
 */
async function recordedExec(
  id: string,
  argv: string[],
  opts: ExecFlags,
  command: Invocation,
): Promise<void> {
  const profile = await profileFor(command, opts.profile);
  const [{ RunLog }, { EventWriter }] = await Promise.all([
    import("../lib/run/run_log.ts"),
    import("../lib/session/event_store.ts"),
  ]);
  await using record = await RunLog.create({
    id,
    mode: "exec",
    profile: profile.name,
    model: "-",
    sandbox: profile.sandbox.mode,
  });
  using events = new EventWriter(id);
  const started = Date.now();
  const event = (type: "output" | "error", source: "user" | "system", data: string) =>
    void events.append({ channel: "terminal", type, source, data });
  let exitCode: number;
  let error: string | null = null;
  try {
    exitCode = await execIn(argv, opts, command, {
      line: (text) => event("output", "user", text),
      errorLine: (text) => event("error", "user", text),
    });
  } catch (failure) {
    error = failure instanceof Error ? failure.message : String(failure);
    exitCode = exitCodeFor(failure);
    event("error", "system", error);
  }
  // Stopped (`sandbox stop`, Ctrl-C, SIGTERM): whatever the command made of its end, or whatever
  // step the signal cut short, the command was interrupted, as a foreground exec exits.
  if (signal.aborted) exitCode = EXIT.interrupted;
  event("output", "system", `[Process exited with code ${exitCode} in ${Date.now() - started}ms]`);
  await record.finish({
    status: signal.aborted ? "interrupted" : exitCode === 0 ? "succeeded" : "failed",
    exitCode,
    usage: null,
    error,
  });
  cliState.exitCode = exitCode;
}

/** The command in the profile's development sandbox, its output passed on; its exit code. */
async function execIn(
  argv: string[],
  opts: ExecFlags,
  command: Invocation,
  sink?: ExecSink,
): Promise<number> {
  const env = parseEnvPairs(opts.env);
  const timeoutMs = parseTimeout(opts.timeout);
  const profile = await profileFor(command, opts.profile);
  if (profile.sandbox.mode === "local") {
    return await execLocal(argv, { ...opts, env, timeoutMs }, profile, sink);
  }
  // Loaded once the mode is known: mode local's commands never load the Docker provider's modules.
  const [{ openProvider, relayTransportFor }, { openSession }] = await Promise.all([
    import("../lib/sandbox/providers.ts"),
    import("../lib/proxy/session.ts"),
  ]);
  // The profile's development sandbox (runs never use it: each has one of its own).
  const provider = await openProvider(profile, { onProgress: progress, repo: opts.repo, signal });
  const session = await sessionWhileRunning(
    provider,
    () => openSession(profile, relayTransportFor(provider), { signal, onProgress: note }),
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
    onStderrLine: (line: string) => {
      sink?.errorLine(line);
      stderrLine(line);
    },
  };
  const stream = provider.execStream(argv, execOptions);
  // The container outlives the command: the next command's (or run's) relay starts while this
  // one runs, so that its start does not wait for one (lib/proxy/spare_relay.ts).
  session.leaveSpareRelay();
  const outcome = await relayOutput(stream, provider, watch.signal, sink);
  if (outcome.oomKilled) noteOom(profile);
  return outcome.exitCode;
}

/**
 * The command in a sandbox of mode local made for it, with the profile's kept development
 * workspace and home (lib/sandbox/local/dev_sandbox.ts), its proxies served by this process, and
 * released after it: nothing of it but its files in the workspace and home outlives it.
 */
async function execLocal(
  argv: string[],
  opts: Omit<ExecFlags, "env"> & { env: Record<string, string>; timeoutMs: number | undefined },
  profile: Profile,
  sink?: ExecSink,
): Promise<number> {
  if (opts.repo !== undefined) {
    throw new SandboxError(
      "usage",
      `sandbox exec --repo: profile "${profile.name}" uses sandbox mode "local", whose development sandbox is the profile's alone`,
      { detail: "Leave out --repo (docs/local.md)" },
    );
  }
  const { openLocalDevSandbox } = await import("../lib/sandbox/local/dev_sandbox.ts");
  trace("exec: local modules loaded");
  // The session's modules load while the sandbox starts, which mostly waits for processes.
  const opening = openLocalDevSandbox(profile, { signal, onProgress: progress });
  const sessionModule = import("../lib/proxy/session.ts");
  // Awaited once the sandbox is up (and released, should it fail to load).
  sessionModule.catch(() => {});
  const sandbox = await opening;
  trace("exec: local sandbox up");
  let session: SandboxSession | undefined;
  let watch: DiskWatch | undefined;
  try {
    const { openSession } = await sessionModule;
    session = await openSession(profile, sandbox.relay, { signal, onProgress: note });
    trace("exec: session open");
    watch = sandbox.watchDisk({});
    const stream = sandbox.provider.execStream(argv, {
      cwd: opts.cwd,
      env: { ...session.env, ...opts.env },
      stdin: Deno.stdin.isTerminal() ? undefined : Deno.stdin.readable,
      signal: AbortSignal.any([signal, watch.signal]),
      timeoutMs: opts.timeoutMs ?? profile.resources.timeoutMs,
      onStderrLine: (line: string) => {
        sink?.errorLine(line);
        stderrLine(line);
      },
    });
    // What a command leaves behind ends with the sandbox, released below: no sweep of its own.
    const outcome = await relayOutput(
      stream,
      { sweep: () => Promise.resolve() },
      watch.signal,
      sink,
    );
    trace("exec: command ended");
    if (outcome.oomKilled) noteOom(profile);
    return outcome.exitCode;
  } finally {
    // All at once: the sandbox's end ends its relay too, so the session's close waits for nothing.
    await allSettled([session?.close(), watch?.close(), sandbox.release()]);
    trace("exec: local sandbox released");
  }
}

/** Wait for every one of `steps` to end, whatever another does; then raise the first failure. */
async function allSettled(steps: (Promise<void> | undefined)[]): Promise<void> {
  const ended = await Promise.allSettled(steps);
  const failed = ended.find((outcome) => outcome.status === "rejected");
  if (failed) throw failed.reason;
}

function noteOom(profile: Profile): void {
  note(
    `the command was killed by the sandbox memory limit (${
      formatBytes(profile.resources.memoryBytes)
    }); raise resources.memory in profile ${profile.name}`,
  );
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
  sink?: ExecSink,
): Promise<ExecStreamOutcome> {
  let outcome: ExecStreamOutcome | undefined;
  try {
    for await (const line of stream) {
      sink?.line(line);
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
