/** Turning a spawned child into an `ExecStream` (stdout lines, then an outcome) or `ExecBytes`. */
import type { Child } from "../process.ts";
import type { ExecBytes, ExecStream, ExecStreamOutcome } from "./provider.ts";

/**
 * Lines of `child`'s stdout; `finish` decides the outcome once it has exited. `stoppedEarly` is
 * true when the consumer left before the end, after the child has been told to stop.
 */
export function execStreamOf(
  child: Child,
  finish: (stoppedEarly: boolean) => Promise<ExecStreamOutcome>,
): ExecStream {
  let settle!: (outcome: Promise<ExecStreamOutcome>) => void;
  const outcome = new Promise<ExecStreamOutcome>((resolve) => settle = resolve);
  outcome.catch(() => {}); // the caller awaits it; this only keeps an unread one handled
  return {
    outcome,
    [Symbol.asyncIterator]: async function* () {
      let drained = false;
      try {
        yield* child.lines();
        drained = true;
      } finally {
        if (!drained) child.kill();
        settle(finish(!drained));
      }
      await outcome;
    },
  };
}

/**
 * `child`'s stdout as bytes, with `outcome` (how it ended, read by the caller) and a `stop` that
 * kills it and waits for that end without raising: stopped on purpose, how it ended is no error
 * of the caller's.
 */
export function execBytesOf(
  child: { readonly stdout: ReadableStream<Uint8Array>; kill(): void },
  outcome: Promise<ExecStreamOutcome>,
): ExecBytes {
  outcome.catch(() => {}); // the caller awaits it; this only keeps an unread one handled
  return {
    stdout: child.stdout,
    outcome,
    stop: async () => {
      child.kill();
      await outcome.catch(() => {});
    },
  };
}
