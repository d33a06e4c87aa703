/**
 * A "running" run whose CLI is gone reads as crashed, even when the kernel has given its pid to
 * another process since (issue 25, item 5): the record names the process by pid and start time.
 */
import assert from "node:assert/strict";
import { readRun, runsDir } from "../../lib/run/run_log.ts";
import { isSameProcessAlive, processStartTicks } from "../../lib/process.ts";
import { tempDir, withEnv } from "../_helpers.ts";

async function recordRunning(id: string, pid: number, pidStartTicks?: number): Promise<void> {
  await Deno.mkdir(`${runsDir()}/${id}`, { recursive: true });
  const meta = {
    id,
    mode: "agentic",
    profile: "p",
    model: "m",
    sandbox: "container",
    status: "running",
    startedAt: new Date().toISOString(),
    endedAt: null,
    durationMs: null,
    exitCode: null,
    usage: null,
    error: null,
    pid,
    pidStartTicks,
    storeError: null,
  };
  await Deno.writeTextFile(`${runsDir()}/${id}/meta.json`, JSON.stringify(meta));
}

Deno.test("a running run whose pid now belongs to a process started later reads as crashed; its own live process reads as running", async () => {
  await using dir = await tempDir("sandbox-liveness-");
  await withEnv({ XDG_STATE_HOME: dir.path }, async () => {
    const ticks = await processStartTicks(Deno.pid);
    assert.ok(ticks !== undefined);
    await recordRunning("r-live", Deno.pid, ticks);
    await recordRunning("r-reused", Deno.pid, ticks! - 1);
    assert.equal((await readRun("r-live"))?.status, "running");
    assert.equal((await readRun("r-reused"))?.status, "crashed");
  });
});

Deno.test("a running run whose process has ended but is not yet reaped (a zombie) reads as crashed", async () => {
  await using dir = await tempDir("sandbox-liveness-");
  // The child ends only once its parent, `sh`, has become `sleep 30`, which never reaps it. (A
  // child that ended at once could be reaped by `sh` before its exec: then there was no zombie.)
  const parent = new Deno.Command("sh", {
    args: [
      "-c",
      "sh -c 'until [ \"$(cat /proc/$PPID/comm)\" = sleep ]; do :; done' & echo $!; exec sleep 30",
    ],
    stdout: "piped",
  }).spawn();
  try {
    const reader = parent.stdout.pipeThrough(new TextDecoderStream()).getReader();
    const pid = Number((await reader.read()).value?.trim());
    await reader.cancel();
    let stat = "";
    while (!/\) Z /.test(stat)) stat = await Deno.readTextFile(`/proc/${pid}/stat`);
    const ticks = await processStartTicks(pid);
    assert.equal(await isSameProcessAlive(pid, ticks), false);
    await withEnv({ XDG_STATE_HOME: dir.path }, async () => {
      await recordRunning("r-zombie", pid, ticks);
      assert.equal((await readRun("r-zombie"))?.status, "crashed");
    });
  } finally {
    parent.kill("SIGKILL");
    await parent.status;
  }
});
