/**
 * The next run's worker puts off its load while every CPU of the machine is taken
 * (scripts/sandbox-exec `defer_load`), 3 s at most, and not at all once a lease wants the
 * container, nor for `up` (real engine). Attacked: what an agent leaves in the sandbox user's
 * state directory, where the markers that say a load is wanted live, cannot hold a later load back. The CPUs are taken by busy loops on the host, as runs at once in other
 * containers take them; the kernel's pressure information (/proc/pressure/cpu) is the machine's.
 */
import assert from "node:assert/strict";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import { readyWorker, SPARE_SOCKET, spareCommand } from "../../lib/sandbox/spare.ts";
import { run } from "../../lib/process.ts";
import { assertDocker, dockerTest, profileFrom, removeProfile, uniqueProfile } from "../_helpers.ts";

/** sandbox-exec's DEFER_LOAD_S. */
const PUT_OFF_AT_MOST_MS = 3_000;

/** One more busy loop than the machine has CPUs: some task always waits for one. */
function takeEveryCpu(): { [Symbol.dispose](): void } {
  const loops = Array.from({ length: navigator.hardwareConcurrency + 1 }, () =>
    new Deno.Command("sh", { args: ["-c", "while :; do :; done"], stdout: "null", stderr: "null" }).spawn());
  return {
    [Symbol.dispose]() {
      for (const loop of loops) {
        try {
          loop.kill("SIGKILL");
        } catch {
          // Gone already.
        }
      }
    },
  };
}

async function listening(container: string): Promise<boolean> {
  return (await run(["docker", "exec", "--user", "10001", container, "test", "-S", SPARE_SOCKET])).exitCode === 0;
}

/** Milliseconds from now until the next worker listens (bounded). */
async function untilListening(container: string, boundMs = 20_000): Promise<number> {
  const started = performance.now();
  while (performance.now() - started < boundMs) {
    if (await listening(container)) return performance.now() - started;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`no worker listened in ${container} within ${boundMs} ms`);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

Deno.test({
  name: "the next run's worker puts its load off while every CPU is taken (3 s at most), and loads at once when a lease wants the container",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    assert.match(await Deno.readTextFile("/proc/pressure/cpu"), /^some .*total=\d+/, "this kernel reports no CPU pressure: nothing puts the load off");
    const name = uniqueProfile("int-spare-load");
    const provider = new DockerSandboxProvider(profileFrom(`profiles:\n  ${name}: {}\n`, name));
    const container = provider.containerName;
    /** A run's release that leaves the next worker behind it, as every leased run's does. */
    const releaseWithSpare = async (id: string) => {
      const release = await provider.lease(id, 60);
      assert.ok(release, `lease ${id} was not granted`);
      await release({ spare: spareCommand() });
    };
    try {
      await provider.ensureRunning();

      await t.step("twin: on a machine with a CPU to spare, the worker loads at once", async () => {
        await releaseWithSpare("load-idle");
        const ms = await untilListening(container);
        assert.ok(ms < PUT_OFF_AT_MOST_MS - 1_000, `listening after ${Math.round(ms)} ms`);
      });

      await t.step("every CPU taken: the load waits, then happens within its bound", async () => {
        using _busy = takeEveryCpu();
        await sleep(300);
        await releaseWithSpare("load-busy");
        const released = performance.now();
        await sleep(1_200);
        assert.equal(await listening(container), false, "the worker loaded while every CPU was taken");
        await untilListening(container);
        const ms = performance.now() - released;
        console.error(`spare load: put off, listening ${Math.round(ms)} ms after the release`);
        assert.ok(ms >= 1_200);
      });

      await t.step("every CPU taken: a lease that wants the container starts the load at once, and gets it with the worker", async () => {
        using _busy = takeEveryCpu();
        await sleep(300);
        await releaseWithSpare("load-wanted");
        await sleep(300);
        const asked = performance.now();
        const next = await provider.lease("load-next", 60);
        const ms = performance.now() - asked;
        assert.ok(next, "the next lease was not granted");
        try {
          assert.equal(await listening(container), true, "the lease was granted before the worker listened");
          console.error(`spare load: wanted by a lease, granted after ${Math.round(ms)} ms`);
          // Put off to the end, it would have been granted 2.7 s at least after it was asked.
          assert.ok(ms < PUT_OFF_AT_MOST_MS - 500, `granted after ${Math.round(ms)} ms`);
        } finally {
          await next();
        }
      });

      await t.step("every CPU taken, runs following each other (the lease waited for the release): the next load does not wait", async () => {
        using _busy = takeEveryCpu();
        await sleep(300);
        await releaseWithSpare("follow-a");
        // Asked for while the release is on: it waits for it (and wants the load).
        await releaseWithSpare("follow-b");
        const released = performance.now();
        await untilListening(container);
        const ms = performance.now() - released;
        console.error(`spare load: runs following each other, listening ${Math.round(ms)} ms after the release`);
        assert.ok(ms < PUT_OFF_AT_MOST_MS - 500, `listening after ${Math.round(ms)} ms`);
      });

      await t.step("attack: a directory the agent left where a lease says it wants the load does not hold the next load back", async () => {
        using _busy = takeEveryCpu();
        await sleep(300);
        const held = await provider.lease("planted-a", 60);
        assert.ok(held, "lease planted-a was not granted");
        // As the agent would during its run (the sandbox user, whose state directory it is).
        const planted = await run(["docker", "exec", "--user", "10001", container, "sh", "-c",
          "mkdir -p /tmp/.sandbox-exec/load-wanted/x && echo planted"]);
        assert.equal(planted.stdout, "planted\n", planted.stderr);
        await held({ spare: spareCommand() });
        const asked = performance.now();
        const next = await provider.lease("planted-b", 60);
        const ms = performance.now() - asked;
        assert.ok(next, "the next lease was not granted");
        try {
          assert.equal(await listening(container), true, "the lease was granted before the worker listened");
          assert.ok(ms < PUT_OFF_AT_MOST_MS - 500, `granted after ${Math.round(ms)} ms`);
          const left = await run(["docker", "exec", "--user", "10001", container, "test", "-e", "/tmp/.sandbox-exec/load-wanted"]);
          assert.notEqual(left.exitCode, 0, "the planted directory is still there");
        } finally {
          await next();
        }
      });

      await t.step("every CPU taken: the worker `up` leaves loads at once (its user asked for a warm container)", async () => {
        using _busy = takeEveryCpu();
        await sleep(300);
        const asked = performance.now();
        await readyWorker(provider);
        await untilListening(container);
        const ms = performance.now() - asked;
        console.error(`spare load: up's, listening ${Math.round(ms)} ms after it was asked for`);
        assert.ok(ms < PUT_OFF_AT_MOST_MS - 500, `listening after ${Math.round(ms)} ms`);
      });
    } finally {
      await removeProfile(name);
    }
  },
});
