/**
 * The host's side of the waiting command wrapper (lib/sandbox/waiting_exec.ts) without an engine:
 * a claimed wrapper whose directory went before its socket could be made is given up quietly (the
 * wrapper stopped, the command left to run the usual way), never a crash of the CLI; one that
 * does not connect in time, likewise. The wrapper itself, against a real engine, is
 * tests/security/waiting_exec_test.ts.
 */
import assert from "node:assert/strict";
import { connectWaitingExec } from "../../lib/sandbox/waiting_exec.ts";
import { tempDir } from "../_helpers.ts";

function claimed(hostDir: string) {
  return { record: { id: "waiting-test", dir: "e1234567", key: "ab12" }, mountSource: "/nowhere", hostDir };
}

Deno.test("a claimed wrapper whose directory is gone is stopped and given up: undefined, no throw", async () => {
  await using dir = await tempDir();
  const stopped: string[] = [];
  const result = await connectWaitingExec(claimed(`${dir.path}/gone`), (id) => {
    stopped.push(id);
    return Promise.resolve();
  });
  assert.equal(result, undefined);
  assert.deepEqual(stopped, ["waiting-test"]);
});

Deno.test("a claimed wrapper that does not connect in time is stopped, and its directory and socket removed", async () => {
  await using dir = await tempDir();
  const hostDir = `${dir.path}/e1234567`;
  await Deno.mkdir(hostDir);
  const stopped: string[] = [];
  const result = await connectWaitingExec(claimed(hostDir), (id) => {
    stopped.push(id);
    return Promise.resolve();
  }, 50);
  assert.equal(result, undefined);
  assert.deepEqual(stopped, ["waiting-test"]);
  await assert.rejects(Deno.stat(hostDir), Deno.errors.NotFound);
});
