/**
 * `resources.disk` for a workspace without a kernel quota: the container's init (scripts/sandbox-
 * exec, pid 1) walks the workspace about once a second, and at once when the filesystem's free
 * space falls fast, and prints `du KIB` on the container's log when the size changed and at least
 * every 5 s; the host follows that log while something runs. When the size passes the limit while
 * still growing, the watch's signal aborts with a `disk_limit` error, and whoever runs commands
 * under that signal stops them.
 *
 * Nothing of the agent's can stop or impersonate the watcher: the kernel delivers no signal to a
 * namespace's init from inside it unless init handles it (never SIGSTOP or SIGKILL), init is not
 * dumpable, and its stdout reaches only the engine. The watch still fails closed: a log that ends,
 * or stays silent for `silenceMs`, aborts the signal too.
 *
 * Growing, not merely over: a workspace left over the limit (by an earlier, stopped command) can
 * still be cleaned up, but not grown. The host starts following `delayMs` after the watch (a
 * quarter of a second by default), and not at all for a command that is over by then.
 */
import { ResourceLimitError, SandboxError } from "../errors.ts";
import type { Child } from "../process.ts";
import { formatBytes } from "../units.ts";

/** What prints the sizes: `docker logs --follow` of the container, whose init reports them. */
export type DiskWatcher = Pick<Child, "lines" | "finished" | "kill">;

export interface DiskWatch extends AsyncDisposable {
  /** Aborts with the reason (a `SandboxError`) when the limit is passed or the watch fails. */
  readonly signal: AbortSignal;
  /** The last size seen, in bytes (undefined before the first report, or without a watcher). */
  readonly usedBytes: number | undefined;
  close(): Promise<void>;
}

export interface DiskWatchOptions {
  limitBytes: number;
  /** The sandbox (container name) and profile, for the message. */
  sandbox: string;
  profile: string;
  /** Called once with the reason when the signal aborts. */
  onAbort?: (reason: SandboxError) => void;
  /** How long after the watch the watcher starts (none when the watch is closed before). */
  delayMs?: number;
  /** How long the watcher may be silent before the watch fails (it reports at least every 5 s). */
  silenceMs?: number;
}

/** Default `silenceMs`: a walk of a huge workspace spaces reports out, up to ten times its CPU time. */
export const DISK_WATCH_SILENCE_MS = 60_000;

/** Default `delayMs`. */
export const DISK_WATCH_DELAY_MS = 250;

/**
 * Watch the sizes `start()` prints: `base KIB` lines (sizes from before the watch began: the
 * workspace's size then) and `du KIB` lines (since); closing the watch stops the watcher.
 * `start` resolves to undefined when there is nothing to watch (a kernel quota holds), and may
 * throw (the sandbox cannot run it): that aborts the watch like a failure later.
 */
export function startDiskWatch(
  start: () => Promise<DiskWatcher | undefined>,
  options: DiskWatchOptions,
): DiskWatch {
  const controller = new AbortController();
  let closing = false;
  const sizes: { used: number | undefined } = { used: undefined };
  let child: DiskWatcher | undefined;
  let wake!: () => void;
  const closed = new Promise<void>((resolve) => wake = resolve);
  // The first reason wins; a watch being closed fails no more (its watcher is stopped on purpose).
  const fail = (reason: SandboxError) => {
    if (closing || controller.signal.aborted) return;
    controller.abort(reason);
    options.onAbort?.(reason);
  };
  const watching = (async () => {
    try {
      await delayUnlessClosed(closed, options.delayMs ?? DISK_WATCH_DELAY_MS);
      if (closing) return;
      child = await start();
      if (!child) return;
      // Closed while it started: stopped here, as close() could not.
      if (closing) return child.kill();
      if (await followReports(child, options, sizes, fail)) return;
      // The reports ended without the limit passed: the watch cannot go on, so it fails closed.
      const ended = await child.finished;
      fail(watcherStopped(options, ended));
    } catch (error) {
      fail(
        new SandboxError(
          "disk_limit",
          `Cannot watch the disk use of sandbox "${options.sandbox}": ${(error as Error).message}`,
          { cause: error },
        ),
      );
    }
  })();
  const close = async () => {
    if (closing) return;
    closing = true;
    wake();
    // The follower of the container's log never ends by itself: it is stopped.
    child?.kill();
    await watching;
    await child?.finished;
  };
  return {
    signal: controller.signal,
    get usedBytes() {
      return sizes.used;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** Resolves after `delayMs`, or as soon as `closed` resolves, whichever is first. */
async function delayUnlessClosed(closed: Promise<void>, delayMs: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([
    closed,
    new Promise((resolve) => timer = setTimeout(resolve, delayMs)),
  ]);
  clearTimeout(timer);
}

/**
 * Reads the watcher's reports until they end, recording each size in `sizes.used`. Returns true
 * when the watch failed meanwhile: a `du` size over the limit and larger than the one before
 * (growing, not merely over), or no report for `silenceMs` (the watcher is then killed, which
 * ends the reports).
 */
async function followReports(
  child: DiskWatcher,
  options: DiskWatchOptions,
  sizes: { used: number | undefined },
  fail: (reason: SandboxError) => void,
): Promise<boolean> {
  const silenceMs = options.silenceMs ?? DISK_WATCH_SILENCE_MS;
  let silence: ReturnType<typeof setTimeout> | undefined;
  const heard = () => {
    clearTimeout(silence);
    silence = setTimeout(() => {
      fail(watchSilent(options, silenceMs));
      child.kill();
    }, silenceMs);
  };
  heard();
  try {
    for await (const line of child.lines()) {
      // `base KIB`: a size from before the watch began (what the workspace held then);
      // `du KIB`: one since.
      const report = /^(du|base) (\d+)$/.exec(line.trim());
      if (!report) continue;
      heard();
      const bytes = Number(report[2]) * 1024;
      const previous = sizes.used;
      sizes.used = bytes;
      if (
        report[1] === "du" && bytes > options.limitBytes && previous !== undefined &&
        bytes > previous
      ) {
        fail(exceeded(options, bytes));
        return true;
      }
    }
  } finally {
    clearTimeout(silence);
  }
  return false;
}

function watchSilent(options: DiskWatchOptions, silenceMs: number): SandboxError {
  return new SandboxError(
    "disk_limit",
    `The disk watch of sandbox "${options.sandbox}" stopped reporting for ${
      Math.round(silenceMs / 1000)
    } s`,
    { detail: "Without it resources.disk cannot be enforced, so the command was stopped" },
  );
}

function watcherStopped(
  options: DiskWatchOptions,
  ended: { exitCode: number; stderrTail?: string },
): SandboxError {
  return new SandboxError(
    "disk_limit",
    `The disk watch of sandbox "${options.sandbox}" stopped (exit code ${ended.exitCode})`,
    {
      detail: `${
        ended.stderrTail ? `${ended.stderrTail}\n` : ""
      }Without it resources.disk cannot be enforced, so the command was stopped`,
    },
  );
}

function exceeded(options: DiskWatchOptions, bytes: number): SandboxError {
  return new ResourceLimitError(
    { resource: "disk", limit: options.limitBytes, actual: bytes },
    `Sandbox "${options.sandbox}" exceeded resources.disk: /workspace holds ${
      formatBytes(bytes)
    }, the limit is ${formatBytes(options.limitBytes)}`,
    {
      detail:
        `The command writing to it was stopped. Free space in /workspace, raise resources.disk in profile "${options.profile}", ` +
        `or remove the workspace with: sandbox down -p ${options.profile} --volumes`,
    },
  );
}
