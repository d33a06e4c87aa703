/**
 * The CLI's interrupt: the first Ctrl-C (or SIGTERM) aborts the command's signal, and only a second
 * one reaches the handler the entry point set (cli.ts: exit at once with 130). Deciding to exit is
 * the entry point's alone: cli/context.ts never ends the process.
 */
import assert from "node:assert/strict";
import { onSecondInterrupt, signal } from "../../cli/context.ts";

/** Resolves once the next SIGTERM has been delivered to this process's listeners. */
function nextSigterm(): Promise<void> {
  // Signal listeners do not keep the event loop alive; this interval does, until it arrives.
  const alive = setInterval(() => {}, 1_000);
  return new Promise((resolve) => {
    const listener = () => {
      Deno.removeSignalListener("SIGTERM", listener);
      clearInterval(alive);
      // After the other listeners (cli/context.ts registered its own first).
      queueMicrotask(resolve);
    };
    Deno.addSignalListener("SIGTERM", listener);
    Deno.kill(Deno.pid, "SIGTERM");
  });
}

Deno.test("a first interrupt aborts the command's signal; only a second reaches the entry point's handler", async () => {
  let second = 0;
  onSecondInterrupt(() => second++);
  assert.ok(!signal.aborted, "the signal is aborted before any interrupt");

  await nextSigterm();
  assert.ok(signal.aborted, "the first interrupt did not abort the signal");
  assert.equal((signal.reason as { code?: string }).code, "interrupted");
  assert.equal(second, 0, "the first interrupt already reached the second-interrupt handler");

  await nextSigterm();
  assert.equal(second, 1, "the second interrupt did not reach the handler");
});
