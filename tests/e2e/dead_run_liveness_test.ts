/**
 * A run whose CLI died reads as crashed in `sandbox runs`, and `sandbox logs -f` ends on it, even
 * when its recorded pid now belongs to a live, unrelated process: the record's process is its pid
 * and that process's start time (or, in a record without it, a process started before the run).
 * The real CLI against a state directory of the test's own; a `sleep` plays the unrelated process.
 */
import assert from "node:assert/strict";
import { processStartTicks } from "../../lib/process.ts";
import { explain, runCli, tempDir } from "../_helpers.ts";

console.error("e2e: dead run liveness tests starting");

const EVENT = JSON.stringify({
  type: "thinking",
  content: "before the crash",
  tool_name: null,
  tool_input: null,
  tool_output: null,
  tool_call_id: null,
  session_id: null,
  is_error: false,
  model: null,
  usage: null,
});

async function recordRunning(
  state: string,
  id: string,
  holder: { pid: number; pidStartTicks?: number; startedAt: string },
): Promise<void> {
  const dir = `${state}/sandbox/runs/${id}`;
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeTextFile(`${dir}/events.ndjson`, EVENT + "\n");
  await Deno.writeTextFile(
    `${dir}/meta.json`,
    JSON.stringify({
      id,
      mode: "agentic",
      profile: "p",
      model: "m",
      sandbox: "container",
      status: "running",
      endedAt: null,
      durationMs: null,
      exitCode: null,
      usage: null,
      error: null,
      storeError: null,
      ...holder,
    }),
  );
}

/** A live process that has nothing to do with any run. */
function unrelated(): Deno.ChildProcess & AsyncDisposable {
  const child = new Deno.Command("sleep", { args: ["600"], stdout: "null", stderr: "null" })
    .spawn();
  return Object.assign(child, {
    async [Symbol.asyncDispose]() {
      try {
        child.kill("SIGKILL");
      } catch {
        // Already ended (the test killed it).
      }
      await child.status;
    },
  });
}

async function statusOf(state: string, id: string): Promise<string> {
  const listed = await runCli(["runs", "--json"], { env: { XDG_STATE_HOME: state } });
  assert.equal(listed.exitCode, 0, explain(listed));
  return JSON.parse(listed.stdout).find((meta: { id: string }) => meta.id === id)?.status;
}

async function follow(state: string, id: string) {
  return await runCli(["logs", id, "-f", "--format", "ndjson"], {
    env: { XDG_STATE_HOME: state },
    timeoutMs: 60_000,
  });
}

Deno.test("a dead run whose pid a live unrelated process holds now reads as crashed, and logs -f prints its events and ends", async (t) => {
  await using dir = await tempDir("sandbox-dead-run-");
  const state = dir.path;
  await using other = unrelated();
  const ticks = await processStartTicks(other.pid);
  assert.ok(ticks !== undefined);
  const hourAgo = new Date(Date.now() - 3_600_000).toISOString();
  await recordRunning(state, "r-reused", {
    pid: other.pid,
    pidStartTicks: ticks - 1,
    startedAt: hourAgo,
  });
  // A record from before the start time was kept: the process started after the run did.
  await recordRunning(state, "r-old-record", { pid: other.pid, startedAt: hourAgo });
  for (const id of ["r-reused", "r-old-record"]) {
    await t.step(id, async () => {
      assert.equal(await statusOf(state, id), "crashed");
      const followed = await follow(state, id);
      assert.equal(followed.exitCode, 0, explain(followed));
      assert.ok(!followed.timedOut, "logs -f did not end");
      assert.equal(followed.stdout, EVENT + "\n");
    });
  }
});

Deno.test("twin: a run whose own process lives reads as running, and as crashed once that process dies", async () => {
  await using dir = await tempDir("sandbox-live-run-");
  const state = dir.path;
  await using own = unrelated();
  await recordRunning(state, "r-live", {
    pid: own.pid,
    pidStartTicks: await processStartTicks(own.pid),
    startedAt: new Date().toISOString(),
  });
  await recordRunning(state, "r-live-old-record", {
    pid: own.pid,
    startedAt: new Date(Date.now() + 60_000).toISOString(),
  });
  assert.equal(await statusOf(state, "r-live"), "running");
  assert.equal(await statusOf(state, "r-live-old-record"), "running");
  own.kill("SIGKILL");
  await own.status;
  assert.equal(await statusOf(state, "r-live"), "crashed");
  const followed = await follow(state, "r-live");
  assert.equal(followed.exitCode, 0, explain(followed));
  assert.equal(followed.stdout, EVENT + "\n");
});
