/**
 * The host's side of the waiting command wrapper (lib/sandbox/waiting_exec.ts) without an engine:
 * a claimed wrapper whose directory went before its socket could be made is given up quietly (the
 * wrapper stopped, the command left to run the usual way), never a crash of the CLI; one that
 * does not connect in time, likewise. A command's output is read to its end even when its exit
 * code comes first; a wrapper killed under its command ends the output as a killed process's pipe
 * does, never with an error of the connection. The wrapper itself, against a real engine, is
 * tests/security/waiting_exec_test.ts.
 */
import assert from "node:assert/strict";
import { connectWaitingExec, WaitingExecChild } from "../../lib/sandbox/waiting_exec.ts";
import { readLine, writeAll } from "../../lib/conn.ts";
import { tempDir } from "../_helpers.ts";
import { connectedWrapper } from "../_waiting_wrapper.ts";

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

const say = (conn: Deno.Conn, text: string) => writeAll(conn, new TextEncoder().encode(text));

Deno.test("a command's output is read to its end when its exit code comes first", async () => {
  await using dir = await tempDir();
  using wrapper = await connectedWrapper(dir.path);
  const child = new WaitingExecChild(wrapper.conns, ["echo"], undefined, {}, {});
  assert.ok(await readLine(wrapper.wrapperControl, 1024, 5_000), "no job line");
  // The exit code and the end of stderr first, as a fast command's may arrive; then the output.
  await say(wrapper.wrapperControl, "x 0\n");
  wrapper.wrapperStderr.close();
  const ended = await child.finished;
  assert.equal(ended.exitCode, 0);
  await say(wrapper.wrapperIo, "late line\n");
  wrapper.wrapperIo.close();
  assert.deepEqual(await Array.fromAsync(child.lines()), ["late line"]);
});

Deno.test("a wrapper killed under its command: the output ends there, no error; the command counts as killed (137)", async () => {
  await using dir = await tempDir();
  using wrapper = await connectedWrapper(dir.path);
  const child = new WaitingExecChild(wrapper.conns, ["sleep"], undefined, {}, {});
  assert.ok(await readLine(wrapper.wrapperControl, 1024, 5_000), "no job line");
  await say(wrapper.wrapperIo, "before\n");
  // Read while the wrapper dies: its control closes with no exit code, and what it ran (an
  // orphan now) still holds the output open.
  const reading = Array.fromAsync(child.lines());
  await new Promise((resolve) => setTimeout(resolve, 50));
  wrapper.wrapperControl.close();
  wrapper.wrapperStderr.close();
  assert.equal((await child.finished).exitCode, 137);
  assert.deepEqual(await reading, ["before"]);
  assert.equal(wrapper.conns.reported, false);
});
