/**
 * The index of runs (lib/run/run_index.ts) behind `listRuns()`: kept by `RunLog`, read instead of
 * every run's `meta.json`, reconciled with the run directories, rebuilt when missing or unreadable.
 * No Docker.
 */
import assert from "node:assert/strict";
import { listRuns, newRunId, RunLog, runsDir } from "../../lib/run/run_log.ts";
import type { IndexRebuild } from "../../lib/run/run_index.ts";
import { storePath } from "../../lib/run/run_index.ts";
import { tempDir } from "../_helpers.ts";

async function stateHome(): Promise<AsyncDisposable & { path: string }> {
  const dir = await tempDir("sandbox-runindex-");
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", dir.path);
  return {
    path: dir.path,
    async [Symbol.asyncDispose]() {
      if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
      else Deno.env.set("XDG_STATE_HOME", previous);
      await dir[Symbol.asyncDispose]();
    },
  };
}

/** A finished run, recorded as `sandbox run` records it. */
async function finishedRun(profile = "unit", date = new Date()): Promise<string> {
  const id = newRunId(date);
  await using log = await RunLog.create({
    id,
    mode: "agentic",
    profile,
    model: "fake-model",
    sandbox: "container",
  });
  await log.finish({ status: "succeeded", exitCode: 0, usage: null, error: null });
  return id;
}

async function deadPid(): Promise<number> {
  const child = new Deno.Command("true", { stdin: "null", stdout: "null", stderr: "null" }).spawn();
  await child.status;
  return child.pid;
}

async function editMeta(id: string, change: Record<string, unknown>): Promise<void> {
  const path = `${runsDir()}/${id}/meta.json`;
  const meta = JSON.parse(await Deno.readTextFile(path));
  await Deno.writeTextFile(path, JSON.stringify({ ...meta, ...change }));
}

Deno.test("listRuns() lists a finished run from the index without reading its meta.json", async () => {
  await using _home = await stateHome();
  const id = await finishedRun();
  // Were the file read, this run would vanish from the list (an unreadable record is skipped).
  await Deno.writeTextFile(`${runsDir()}/${id}/meta.json`, "not json");
  const runs = await listRuns();
  assert.deepEqual(runs.map((r) => [r.id, r.status]), [[id, "succeeded"]]);
});

Deno.test("listRuns() shows a run killed mid-way as crashed, and a run whose end the index missed as ended", async () => {
  await using _home = await stateHome();
  const killed = newRunId();
  const ended = newRunId();
  await using _a = await RunLog.create({
    id: killed,
    mode: "agentic",
    profile: "unit",
    model: "m",
    sandbox: "container",
  });
  await using _b = await RunLog.create({
    id: ended,
    mode: "agentic",
    profile: "unit",
    model: "m",
    sandbox: "container",
  });
  // Both rows say "running"; the files say: a dead recorder, and an end written past the index.
  await editMeta(killed, { pid: await deadPid() });
  await editMeta(ended, { status: "failed", exitCode: 1 });
  const status = Object.fromEntries((await listRuns()).map((r) => [r.id, r.status]));
  assert.deepEqual(status, { [killed]: "crashed", [ended]: "failed" });
});

Deno.test("a missing index is rebuilt from the run directories, and the caller is told", async () => {
  await using _home = await stateHome();
  const older = await finishedRun("unit", new Date("2030-01-01T00:00:00Z"));
  const newer = await finishedRun("unit", new Date("2030-01-02T00:00:00Z"));
  await Deno.remove(storePath());
  const rebuilds: IndexRebuild[] = [];
  const runs = await listRuns({ onRebuild: (r) => rebuilds.push(r) });
  assert.deepEqual(runs.map((r) => r.id), [newer, older]);
  assert.deepEqual(rebuilds, [{ reason: "missing", runs: 2 }]);
  const again: IndexRebuild[] = [];
  await listRuns({ onRebuild: (r) => again.push(r) });
  assert.deepEqual(again, [], "an index in good order is not rebuilt again");
});

Deno.test("an unreadable index is moved aside, never deleted, and rebuilt", async () => {
  await using _home = await stateHome();
  const id = await finishedRun();
  await Deno.remove(`${storePath()}-wal`).catch(() => {}); // the checkpointed journal may be gone
  const garbage = "this is not an SQLite database, it is garbage ".repeat(100);
  await Deno.writeTextFile(storePath(), garbage);
  const rebuilds: IndexRebuild[] = [];
  const runs = await listRuns({ onRebuild: (r) => rebuilds.push(r) });
  assert.deepEqual(runs.map((r) => r.id), [id]);
  assert.deepEqual(rebuilds, [{
    reason: "unreadable",
    movedTo: `${storePath()}.corrupt`,
    runs: 1,
  }]);
  assert.equal(await Deno.readTextFile(`${storePath()}.corrupt`), garbage);
});

Deno.test("listRuns() follows the run directories: a removed one is dropped, an unindexed one added", async () => {
  await using _home = await stateHome();
  const removed = await finishedRun();
  const kept = await finishedRun();
  await Deno.remove(`${runsDir()}/${removed}`, { recursive: true });
  // A run recorded without the index (by an older version, or while it could not be written).
  const copied = newRunId();
  await Deno.mkdir(`${runsDir()}/${copied}`);
  const meta = JSON.parse(await Deno.readTextFile(`${runsDir()}/${kept}/meta.json`));
  await Deno.writeTextFile(
    `${runsDir()}/${copied}/meta.json`,
    JSON.stringify({ ...meta, id: copied }),
  );
  assert.deepEqual((await listRuns()).map((r) => r.id).sort(), [copied, kept].sort());
});

Deno.test("listRuns() takes a limit and a profile, newest first", async () => {
  await using _home = await stateHome();
  const day = (n: number) => new Date(`2030-01-0${n}T00:00:00Z`);
  const a1 = await finishedRun("alpha", day(1));
  const b2 = await finishedRun("beta", day(2));
  const a3 = await finishedRun("alpha", day(3));
  assert.deepEqual((await listRuns({ limit: 2 })).map((r) => r.id), [a3, b2]);
  assert.deepEqual((await listRuns({ profile: "alpha" })).map((r) => r.id), [a3, a1]);
  assert.deepEqual((await listRuns({ profile: "alpha", limit: 1 })).map((r) => r.id), [a3]);
});

Deno.test("listRuns() orders runs by their start, not their id (an id's stamp has seconds)", async () => {
  await using _home = await stateHome();
  // The second run's id sorts first, as either of two ids of the same second may.
  const first = await finishedRun("gamma", new Date("2030-01-01T00:00:01Z"));
  await new Promise((resolve) => setTimeout(resolve, 5));
  const second = await finishedRun("gamma", new Date("2030-01-01T00:00:00Z"));
  assert.ok(second < first);
  assert.deepEqual((await listRuns({ limit: 1 })).map((r) => r.id), [second]);
  assert.deepEqual((await listRuns()).map((r) => r.id), [second, first]);
});

Deno.test("listRuns() on a state directory that never held a run creates nothing", async () => {
  await using home = await stateHome();
  assert.deepEqual(await listRuns(), []);
  assert.deepEqual(await Array.fromAsync(Deno.readDir(home.path)), []);
});
