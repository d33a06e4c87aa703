/**
 * The host's advisory locks (lib/lock.ts): `tryHostLock` takes a lock only when no one holds it,
 * without waiting, whether the holder is this process or another, and a holder that dies lets go.
 * A lock's file goes with its last holder, and removing it never lets two holders in at once; the
 * reap of orphans removes the files killed holders left, never one a live process holds.
 */
import assert from "node:assert/strict";
import { removeFreeLocks, tryHostLock, withHostLock } from "../../lib/lock.ts";
import { reapOrphans } from "../../lib/sandbox/pool.ts";
import { profileFrom, tempDir, withEnv } from "../_helpers.ts";

/** A process that takes `name`'s lock in `dir`, says "held", and holds it until killed. */
function holder(dir: string, name: string): Deno.ChildProcess {
  const script = `
    const file = await Deno.open(${
    JSON.stringify(`${dir}/${name}.lock`)
  }, { create: true, write: true });
    await file.lock(true);
    console.log("held");
    setInterval(() => {}, 60_000);`;
  return new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    stdout: "piped",
    stderr: "null",
  }).spawn();
}

async function firstLine(child: Deno.ChildProcess): Promise<string> {
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
  }
  reader.releaseLock();
  return text.trim();
}

Deno.test("tryHostLock: only one holder at a time, in this process or another; released, or its holder dead, it is free again", async () => {
  await using dir = await tempDir();
  await withEnv({ SANDBOX_LOCK_DIR: dir.path }, async () => {
    const first = await tryHostLock("lease-x");
    assert.ok(first, "a free lock was not taken");
    assert.equal(
      await tryHostLock("lease-x"),
      undefined,
      "a held lock was taken again in the same process",
    );
    // Another name is another lock.
    const other = await tryHostLock("lease-y");
    assert.ok(other);
    other.release();
    first.release();
    first.release(); // twice is harmless
    const again = await tryHostLock("lease-x");
    assert.ok(again, "a released lock stayed taken");
    again.release();

    const child = holder(dir.path, "lease-z");
    try {
      assert.equal(await firstLine(child), "held");
      assert.equal(await tryHostLock("lease-z"), undefined, "another process's lock was taken");
    } finally {
      child.kill("SIGKILL");
      await child.status;
      await child.stdout.cancel().catch(() => {});
    }
    const afterDeath = await tryHostLock("lease-z");
    assert.ok(afterDeath, "the lock of a dead process stayed taken");
    afterDeath.release();
  });
});

async function entries(dir: string): Promise<string[]> {
  return (await Array.fromAsync(Deno.readDir(dir))).map((entry) => entry.name).sort();
}

Deno.test("a lock's file is removed as its holder lets go; one a dead holder left is removed by the next", async () => {
  await using dir = await tempDir();
  await withEnv({ SANDBOX_LOCK_DIR: dir.path }, async () => {
    const seen = await withHostLock("image-x", async () => await entries(dir.path));
    assert.deepEqual(seen, ["image-x.lock"], "no file while the lock was held");
    assert.deepEqual(await entries(dir.path), [], "withHostLock left its file");
    const held = await tryHostLock("lease-x");
    assert.ok(held);
    assert.deepEqual(await entries(dir.path), ["lease-x.lock"]);
    held.release();
    assert.deepEqual(await entries(dir.path), [], "tryHostLock's release left its file");

    const child = holder(dir.path, "lease-z");
    try {
      assert.equal(await firstLine(child), "held");
    } finally {
      child.kill("SIGKILL");
      await child.status;
      await child.stdout.cancel().catch(() => {});
    }
    assert.deepEqual(await entries(dir.path), ["lease-z.lock"], "the dead holder's file");
    const next = await tryHostLock("lease-z");
    assert.ok(next);
    next.release();
    assert.deepEqual(await entries(dir.path), []);
  });
});

/** Whether this process waits, blocked, for the lock of the file at `path` (as /proc/locks says). */
async function waitedFor(path: string): Promise<boolean> {
  const ino = await Deno.stat(path).then((info) => String(info.ino), () => undefined);
  if (ino === undefined) return false;
  // "14: -> FLOCK  ADVISORY  WRITE 9053 fe:00:2146899 0 EOF": a waiter, its pid, device:inode.
  return (await Deno.readTextFile("/proc/locks")).split("\n").some((line) => {
    const fields = line.trim().split(/\s+/);
    return fields[1] === "->" && fields[2] === "FLOCK" && fields[5] === String(Deno.pid) &&
      fields[6]?.split(":")[2] === ino;
  });
}

async function until(condition: () => boolean | Promise<boolean>): Promise<void> {
  while (!await condition()) await new Promise((resolve) => setTimeout(resolve, 5));
}

Deno.test("a waiter that gets the lock of a file its holder removed does not enter: it takes the file now at the path", async () => {
  await using dir = await tempDir();
  await withEnv({ SANDBOX_LOCK_DIR: dir.path }, async () => {
    const path = `${dir.path}/build.lock`;
    let inside = 0;
    let entered = 0;
    let most = 0;
    // The first holder in stays until the other is inside too (caught: two holders at once) or
    // waits for the very file it holds (the lock works): one of the two always comes.
    const hold = async () => {
      inside++;
      most = Math.max(most, inside);
      if (++entered === 1) await until(async () => entered > 1 || await waitedFor(path));
      inside--;
    };
    const first = await tryHostLock("build");
    assert.ok(first);
    // B waits for the file's lock; then its holder removes the file and lets go. B gets the lock
    // of a file no longer in the directory, while C makes a new one.
    const b = withHostLock("build", hold);
    await until(() => waitedFor(path));
    first.release();
    const c = withHostLock("build", hold);
    await Promise.all([b, c]);
    assert.equal(most, 1, "two holders were inside at once");
    assert.deepEqual(await entries(dir.path), []);
  });
});

Deno.test("the pool's reap removes the lock file a SIGKILLed holder left, and not one a live process holds", async () => {
  await using dir = await tempDir();
  await using state = await tempDir();
  await withEnv({ SANDBOX_LOCK_DIR: dir.path, XDG_STATE_HOME: state.path }, async () => {
    const dead = holder(dir.path, "pool-0123456789abcdef");
    const live = holder(dir.path, "container-sandbox-x");
    try {
      assert.equal(await firstLine(dead), "held");
      assert.equal(await firstLine(live), "held");
      dead.kill("SIGKILL");
      await dead.status;
      assert.deepEqual(await entries(dir.path), [
        "container-sandbox-x.lock",
        "pool-0123456789abcdef.lock",
      ]);
      assert.deepEqual(
        await reapOrphans(profileFrom("profiles:\n  p: {}\n", "p")),
        [],
        "no container to reap",
      );
      assert.deepEqual(
        await entries(dir.path),
        ["container-sandbox-x.lock"],
        "the dead holder's file stayed, or the live holder's went",
      );
      assert.equal(await tryHostLock("container-sandbox-x"), undefined, "the live lock was lost");
    } finally {
      for (const child of [dead, live]) {
        try {
          child.kill("SIGKILL");
        } catch {
          // Killed already (the dead holder).
        }
        await child.status;
        await child.stdout.cancel().catch(() => {});
      }
    }
    assert.deepEqual(await entries(dir.path), ["container-sandbox-x.lock"]);
    await removeFreeLocks();
    assert.deepEqual(await entries(dir.path), [], "a file whose holder died since stayed");
  });
});
