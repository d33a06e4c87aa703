/**
 * A "running" run whose CLI is gone reads as crashed, even when the kernel has given its pid to
 * another process since (issue 25, item 5): the record names the process by pid and start time.
 */
import assert from "node:assert/strict";
import { readRun, runsDir } from "../../lib/run/run_log.ts";
import { processStartTicks } from "../../lib/process.ts";
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
