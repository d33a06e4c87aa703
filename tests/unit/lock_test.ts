/**
 * The host's advisory locks (lib/lock.ts): `tryHostLock` takes a lock only when no one holds it,
 * without waiting, whether the holder is this process or another, and a holder that dies lets go.
 */
import assert from "node:assert/strict";
import { tryHostLock } from "../../lib/lock.ts";
import { tempDir, withEnv } from "../_helpers.ts";

/** A process that takes `name`'s lock in `dir`, says "held", and holds it until killed. */
function holder(dir: string, name: string): Deno.ChildProcess {
  const script = `
    const file = await Deno.open(${JSON.stringify(`${dir}/${name}.lock`)}, { create: true, write: true });
    await file.lock(true);
    console.log("held");
    setInterval(() => {}, 60_000);`;
  return new Deno.Command(Deno.execPath(), { args: ["eval", script], stdout: "piped", stderr: "null" }).spawn();
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
    assert.equal(await tryHostLock("lease-x"), undefined, "a held lock was taken again in the same process");
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
