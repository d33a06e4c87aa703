/**
 * A shared container's lease and this host's lock on it (lib/sandbox/docker_provider.ts `lease`,
 * real engine): runs of this host that want the container at once are told it is busy by the
 * host's lock, without queueing inside; the lease inside stays the authority for what the host's
 * lock does not see.
 */
import assert from "node:assert/strict";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import { hostLockDir } from "../../lib/lock.ts";
import { assertDocker, dockerTest, profileFrom, removeProfile, uniqueProfile } from "../_helpers.ts";

/** A process that holds this host's lock `name` (as another run's process would) until killed. */
async function holdHostLock(name: string): Promise<Deno.ChildProcess> {
  const script = `
    const file = await Deno.open(${JSON.stringify(`${hostLockDir()}/${name}.lock`)}, { create: true, write: true });
    await file.lock(true);
    console.log("held");
    setInterval(() => {}, 60_000);`;
  const child = new Deno.Command(Deno.execPath(), { args: ["eval", script], stdout: "piped", stderr: "null" }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const { value } = await reader.read();
  reader.releaseLock();
  assert.equal(value?.trim(), "held");
  return child;
}

Deno.test({
  name: "a lease: one run of this host at a time (the host's lock answers busy at once); the lease inside still refuses what the host's lock does not see",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const name = uniqueProfile("int-host-lease");
    const provider = new DockerSandboxProvider(profileFrom(`profiles:\n  ${name}: {}\n`, name));
    try {
      await provider.ensureRunning();

      await t.step("two leases asked at once in one process: one is granted, the other told busy", async () => {
        const [a, b] = await Promise.all([provider.lease("run-a", 60), provider.lease("run-b", 60)]);
        assert.equal([a, b].filter(Boolean).length, 1, "not exactly one lease was granted");
        await (a ?? b)!();
        // Released: granted again.
        const again = await provider.lease("run-c", 60);
        assert.ok(again, "the released container was not leased again");
        await again();
      });

      await t.step("another process of this host holding the container's lock: busy, though nothing holds it inside; once that process is gone, granted", async () => {
        const holder = await holdHostLock(`lease-${provider.containerName}`);
        try {
          assert.equal(await provider.lease("run-d", 60), undefined);
        } finally {
          holder.kill("SIGKILL");
          await holder.status;
          await holder.stdout.cancel().catch(() => {});
        }
        const granted = await provider.lease("run-e", 60);
        assert.ok(granted, "the lock of a process that is gone still held the container");
        await granted();
      });

      await t.step("a lease held inside by what the host's lock does not see (another host, a lease taken by hand): busy all the same", async () => {
        const inside = new Deno.Command("docker", {
          args: ["exec", "-i", "--user", "10001", provider.containerName, "sandbox-exec", "--lease", "lease-by-hand", "60"],
          stdin: "piped",
          stdout: "piped",
          stderr: "null",
        }).spawn();
        try {
          const reader = inside.stdout.pipeThrough(new TextDecoderStream()).getReader();
          const { value } = await reader.read();
          reader.releaseLock();
          assert.equal(value?.trim(), "leased");
          assert.equal(await provider.lease("run-f", 60), undefined, "a lease held inside was granted again");
        } finally {
          await inside.stdin.close().catch(() => {});
          await inside.status;
          await inside.stdout.cancel().catch(() => {});
        }
        // Its release done, the container is granted again (the lease waits for a release in progress).
        const granted = await provider.lease("run-g", 60);
        assert.ok(granted);
        await granted();
      });
    } finally {
      await removeProfile(name);
    }
  },
});
