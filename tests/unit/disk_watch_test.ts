/**
 * The disk watch's decisions, against a real child process that prints sizes (`du KIB` lines) as
 * the container's init does on the container's log (scripts/sandbox-exec).
 */
import assert from "node:assert/strict";
import { startDiskWatch } from "../../lib/sandbox/disk_watch.ts";
import { ResourceLimitError, type SandboxError } from "../../lib/errors.ts";
import { spawn } from "../../lib/process.ts";

const MIB = 1024 ** 2;

/** A watcher printing `sizes` (KiB), one every 20 ms, then waiting until it is stopped. */
function printer(sizes: number[]) {
  const script = `for s in ${sizes.join(" ")}; do echo "du $s"; sleep 0.02; done; exec sleep 3600`;
  return () => Promise.resolve(spawn(["sh", "-c", script]));
}

const OPTIONS = { limitBytes: 10 * MIB, sandbox: "sandbox-w", profile: "w" };

/** The watch's abort reason; fails (instead of hanging) when it does not abort within 10 s. */
function aborted(watch: { signal: AbortSignal }): Promise<SandboxError> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error("the watch did not abort within 10 s")),
      10_000,
    );
    watch.signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve(watch.signal.reason);
    });
  });
}

Deno.test("the watch fires when the workspace grows past the limit, naming resources.disk and the size", async () => {
  const reasons: SandboxError[] = [];
  await using watch = startDiskWatch(printer([1024, 4096, 9216, 12288, 20480]), {
    ...OPTIONS,
    onAbort: (r) => reasons.push(r),
  });
  const reason = await aborted(watch);
  assert.equal(reason.code, "disk_limit");
  assert.match(
    reason.message,
    /exceeded resources\.disk: \/workspace holds 12(\.0)? MiB, the limit is 10(\.0)? MiB/,
  );
  assert.match(reason.detail ?? "", /sandbox down -p w --volumes/);
  assert.ok(reason instanceof ResourceLimitError, "the reason carries the limit and the size");
  assert.deepEqual(
    { resource: reason.resource, limit: reason.limit, actual: reason.actual },
    { resource: "disk", limit: 10 * MIB, actual: 12288 * 1024 },
  );
  assert.deepEqual(reasons, [reason]);
  assert.equal(watch.usedBytes, 12288 * 1024);
});

Deno.test("a workspace left over the limit may shrink or stay, but not grow", async (t) => {
  await t.step("staying and shrinking: no abort, the watcher ends when closed", async () => {
    const watch = startDiskWatch(printer([15360, 15360, 12288, 8192]), OPTIONS);
    // The last size is reported: the watch has seen everything the watcher printed.
    for (let waited = 0; watch.usedBytes !== 8192 * 1024; waited += 10) {
      assert.ok(waited < 10_000, `the last size never arrived: ${watch.usedBytes}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await watch.close();
    assert.equal(watch.signal.aborted, false);
  });
  await t.step("growing while over: abort", async () => {
    await using watch = startDiskWatch(printer([15360, 15361]), OPTIONS);
    assert.equal((await aborted(watch)).code, "disk_limit");
  });
});

Deno.test("the watch fails closed: a watcher that dies or cannot start aborts it", async (t) => {
  await t.step("the watcher exits", async () => {
    await using watch = startDiskWatch(
      () => Promise.resolve(spawn(["sh", "-c", "echo 'du 1024'; echo killed >&2; exit 137"])),
      OPTIONS,
    );
    const reason = await aborted(watch);
    assert.equal(reason.code, "disk_limit");
    assert.match(reason.message, /disk watch of sandbox "sandbox-w" stopped \(exit code 137\)/);
    assert.match(reason.detail ?? "", /killed/);
  });
  await t.step("the watcher cannot start", async () => {
    await using watch = startDiskWatch(
      () => Promise.reject(new Error("OCI runtime exec failed")),
      OPTIONS,
    );
    assert.match(
      (await aborted(watch)).message,
      /Cannot watch the disk use of sandbox "sandbox-w": OCI runtime exec failed/,
    );
  });
});

Deno.test("with a kernel quota there is no watcher, and closing the watch is immediate", async () => {
  const watch = startDiskWatch(() => Promise.resolve(undefined), OPTIONS);
  await watch.close();
  assert.equal(watch.signal.aborted, false);
  assert.equal(watch.usedBytes, undefined);
});

Deno.test("the watcher starts only after the delay: a watch closed before never starts one; one kept open does", async (t) => {
  await t.step("closed within the delay: the watcher is never started", async () => {
    let started = 0;
    const watch = startDiskWatch(() => {
      started++;
      return printer([1024])();
    }, { ...OPTIONS, delayMs: 200 });
    await new Promise((resolve) => setTimeout(resolve, 50));
    await watch.close();
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(started, 0);
    assert.equal(watch.signal.aborted, false);
  });
  await t.step("kept open past the delay: started once, then it reports", async () => {
    let startedAt: number | undefined;
    const opened = performance.now();
    await using watch = startDiskWatch(() => {
      startedAt = performance.now();
      return printer([1024, 4096, 12288, 20480])();
    }, { ...OPTIONS, delayMs: 100 });
    assert.equal((await aborted(watch)).code, "disk_limit");
    assert.ok(
      startedAt !== undefined && startedAt - opened >= 95,
      `started ${startedAt! - opened} ms after the watch`,
    );
  });
});

Deno.test("the watch fails closed when the watcher falls silent (stopped, it says nothing), and not while it reports", async (t) => {
  await t.step("one report, then silence past silenceMs: abort, naming the silence", async () => {
    await using watch = startDiskWatch(printer([1024]), { ...OPTIONS, delayMs: 0, silenceMs: 300 });
    const reason = await aborted(watch);
    assert.equal(reason.code, "disk_limit");
    assert.match(reason.message, /stopped reporting/);
  });
  await t.step("twin: reports closer together than silenceMs: no abort", async () => {
    const watch = startDiskWatch(printer(Array.from({ length: 40 }, () => 1024)), {
      ...OPTIONS,
      delayMs: 0,
      silenceMs: 300,
    });
    await new Promise((resolve) => setTimeout(resolve, 700));
    assert.equal(watch.signal.aborted, false);
    await watch.close();
  });
});

Deno.test("sizes from before the watch began are its baseline: a workspace that grew past the limit before the follower attached is caught; one already over that stays is not", async (t) => {
  /** A watcher printing these lines, one every 20 ms, then waiting until it is stopped. */
  const lines = (...reports: string[]) => () =>
    Promise.resolve(
      spawn([
        "sh",
        "-c",
        `for r in ${
          reports.map((r) => `'${r}'`).join(" ")
        }; do echo "$r"; sleep 0.02; done; exec sleep 3600`,
      ]),
    );
  await t.step("base 1 MiB, then (the command's) 20 MiB: abort", async () => {
    await using watch = startDiskWatch(lines("base 1024", "du 20480"), { ...OPTIONS, delayMs: 0 });
    assert.equal((await aborted(watch)).code, "disk_limit");
  });
  await t.step("twin: base 20 MiB (over before the command), then 20 MiB: no abort", async () => {
    const watch = startDiskWatch(lines("base 20480", "du 20480", "du 20480"), {
      ...OPTIONS,
      delayMs: 0,
    });
    for (let waited = 0; watch.usedBytes !== 20480 * 1024; waited += 10) {
      assert.ok(waited < 10_000, "no report arrived");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(watch.signal.aborted, false);
    await watch.close();
  });
});
