/**
 * The host's side of a granted lease (`sandbox-exec --lease`, see scripts/sandbox-exec) after it
 * said `leased`: one loop reads what the lease prints and hands each kind of line to its reader —
 * `du KIB` (its disk watcher's sizes, asked for with `du DIR`), `du-watching` (that watcher
 * started), `du-ended` (it died), `released` (it has what to do behind the run).
 *
 * Why the lease watches the disk: a run that needs `resources.disk` watched had a `docker exec`
 * of its own for it (`sandbox-exec --du`), which costs the engine as much CPU as the lease's own
 * exec; the lease is there anyway, for the whole run.
 */
import type { ProcessOutcome } from "../process.ts";
import type { DiskWatcher } from "./disk_watch.ts";

/** A `du` line: the lease's disk watcher's size of the directory, in KiB. */
const SIZE_LINE = /^du (\d+)$/;

/** How long a lease may take to say its disk watcher started (it says so at once). */
export const WATCH_START_TIMEOUT_MS = 5_000;

export class LeaseChannel {
  /** True once the lease said `released`; false when its output ended (or failed) before. */
  readonly released: Promise<boolean>;
  readonly #send: (kind: string, argv: readonly string[]) => void;
  #sizes: ReadableStreamDefaultController<string> | undefined;
  #watched = false;
  #endWatch: ((reason: string | undefined) => void) | undefined;
  #watchStarted: (() => void) | undefined;

  /**
   * `lines`: the lease's output after `leased`; `send`: a line to the lease (its input must still
   * be open).
   */
  constructor(lines: ReadableStreamDefaultReader<string>, send: (kind: string, argv: readonly string[]) => void) {
    this.#send = send;
    this.released = (async () => {
      try {
        for (;;) {
          const { value, done } = await lines.read();
          if (done) break;
          if (value === "released") {
            // The host released it: done with the run, and so with its watch.
            this.#endWatch?.(undefined);
            return true;
          }
          const size = SIZE_LINE.exec(value);
          if (size || value === "du-watching") this.#watchStarted?.();
          if (size) this.#sizes?.enqueue(size[1]);
          else if (value === "du-ended") this.#endWatch?.("the lease's disk watcher ended");
        }
      } catch {
        // Its output failed: as if it ended.
      }
      this.#endWatch?.("the lease ended");
      return false;
    })();
  }

  /**
   * Ask the lease to watch `dir`: a watcher whose lines are the sizes (KiB), which ends when
   * `stdin` ends or it is killed (exit code 0: the host stopped it), or when the lease's watcher
   * or the lease itself ends first (exit code 1: the watch failed, and fails closed); so does a
   * lease that does not say its watcher started within `startWithinMs` (one that knows no `du`,
   * which would otherwise leave the disk unwatched). One a lease.
   */
  watchDisk(dir: string, stdin: ReadableStream<Uint8Array>, startWithinMs = WATCH_START_TIMEOUT_MS): DiskWatcher {
    if (this.#watched) throw new TypeError("The lease watches one directory");
    this.#watched = true;
    const argv = ["sandbox-exec", "--lease", "du", dir];
    const started = performance.now();
    let settle!: (outcome: ProcessOutcome) => void;
    const finished = new Promise<ProcessOutcome>((resolve) => settle = resolve);
    // Read until the watch has seen enough (it stops reading: cancel), or ended here.
    const sizes = new ReadableStream<string>({
      start: (controller) => void (this.#sizes = controller),
      cancel: () => end(undefined),
    });
    const unstarted = setTimeout(() => end("the lease did not start a disk watcher"), startWithinMs);
    this.#watchStarted = () => clearTimeout(unstarted);
    const end = (reason: string | undefined) => {
      if (!this.#endWatch) return;
      this.#endWatch = undefined;
      clearTimeout(unstarted);
      const controller = this.#sizes;
      this.#sizes = undefined;
      try {
        controller?.close();
      } catch {
        // Cancelled by its reader: closed already.
      }
      settle({
        argv,
        exitCode: reason ? 1 : 0,
        signal: null,
        durationMs: performance.now() - started,
        timedOut: false,
        aborted: false,
        stderrTail: reason ?? "",
      });
    };
    this.#endWatch = end;
    // Ended by its input, as the exec's watcher is: the host closes it when the watch closes.
    stdin.pipeTo(new WritableStream()).then(() => end(undefined), () => end(undefined));
    try {
      this.#send("du", [dir]);
    } catch (error) {
      end(`cannot ask the lease: ${error instanceof Error ? error.message : error}`);
    }
    return {
      finished,
      kill: () => end(undefined),
      lines: async function* () {
        for await (const line of sizes) yield line;
      },
    };
  }
}
