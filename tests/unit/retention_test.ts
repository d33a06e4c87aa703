/**
 * Which runs a retention policy removes (lib/run/retention.ts), and the `state.retention`
 * configuration key. No Docker, no files.
 */
import assert from "node:assert/strict";
import { parseAge, retentionPolicy, selectPrunable } from "../../lib/run/retention.ts";
import type { RunMeta, RunStatus } from "../../lib/run/run_log.ts";
import { parseConfig, validateConfigText } from "../../lib/config.ts";

const NOW = new Date("2030-06-30T00:00:00Z");
const DAY_MS = 86_400_000;

/** A run that started `daysAgo` days before NOW and ended an hour later (unless running or crashed). */
function run(id: string, daysAgo: number, status: RunStatus = "succeeded"): RunMeta {
  const started = new Date(NOW.getTime() - daysAgo * DAY_MS);
  const ended = status === "running" || status === "crashed"
    ? null
    : new Date(started.getTime() + 3_600_000).toISOString();
  return {
    id,
    mode: "agentic",
    profile: "unit",
    model: "m",
    sandbox: "container",
    status,
    startedAt: started.toISOString(),
    endedAt: ended,
    durationMs: null,
    exitCode: null,
    usage: null,
    error: null,
    pid: 1,
    storeError: null,
  };
}

const ids = (runs: RunMeta[]) => runs.map((r) => r.id);

Deno.test("selectPrunable() with an age removes the finished runs that ended longer ago", () => {
  const runs = [run("r5", 5), run("r40", 40, "failed"), run("r90", 90, "crashed")];
  assert.deepEqual(ids(selectPrunable(runs, { olderThanMs: 30 * DAY_MS }, NOW)), ["r40", "r90"]);
});

Deno.test("selectPrunable() never selects a running run, however old", () => {
  const runs = [run("live", 400, "running"), run("old", 400)];
  assert.deepEqual(ids(selectPrunable(runs, { olderThanMs: DAY_MS }, NOW)), ["old"]);
  assert.deepEqual(ids(selectPrunable(runs, { keep: 0 }, NOW)), ["old"]);
});

Deno.test("selectPrunable() with a count keeps the newest finished runs; running ones do not count", () => {
  const runs = [run("live", 0, "running"), run("a", 1), run("b", 2), run("c", 3)];
  assert.deepEqual(ids(selectPrunable(runs, { keep: 2 }, NOW)), ["c"]);
  assert.deepEqual(ids(selectPrunable(runs, { keep: 5 }, NOW)), []);
});

Deno.test("selectPrunable() with both removes only what is older and beyond the newest N", () => {
  const runs = [run("a", 40), run("b", 50), run("c", 60), run("d", 1)].sort((x, y) =>
    y.startedAt.localeCompare(x.startedAt)
  );
  assert.deepEqual(ids(selectPrunable(runs, { olderThanMs: 30 * DAY_MS, keep: 2 }, NOW)), [
    "b",
    "c",
  ]);
});

Deno.test("selectPrunable() with a policy naming nothing removes nothing", () => {
  assert.deepEqual(selectPrunable([run("old", 999)], {}, NOW), []);
});

Deno.test("parseAge() reads days, weeks and the units of durations; refuses the rest", () => {
  assert.equal(parseAge("30d"), 30 * DAY_MS);
  assert.equal(parseAge("2w"), 14 * DAY_MS);
  assert.equal(parseAge("1d12h"), 1.5 * DAY_MS);
  assert.equal(parseAge("90s"), 90_000);
  for (const bad of ["", "30", "d", "0d", "-1d", "30x", "1 d"]) {
    assert.equal(parseAge(bad), undefined, bad);
  }
});

Deno.test("state.retention in the user's configuration is read and checked", async (t) => {
  await t.step("a valid one gives its policy", () => {
    const result = parseConfig("state:\n  retention: {older_than: 30d, keep: 10}\n", "c.yaml");
    assert.equal(result.kind, "ok");
    if (result.kind !== "ok") return;
    assert.deepEqual(retentionPolicy(result.config.state!.retention!), {
      olderThanMs: 30 * DAY_MS,
      keep: 10,
    });
  });
  await t.step("absent: nothing is pruned", () => {
    const result = parseConfig("profiles: {}\n", "c.yaml");
    assert.equal(result.kind === "ok" && result.config.state?.retention, undefined);
  });
  for (
    const [yaml, path, message] of [
      ["state: {retention: {older_than: soon}}", "state.retention.older_than", "an age"],
      ["state: {retention: {keep: -1}}", "state.retention.keep", "whole number"],
      ["state: {retention: {}}", "state.retention", "older_than, keep or both"],
      ["state: {retain: {keep: 1}}", "state", 'unknown key "retain"'],
    ]
  ) {
    await t.step(`refused: ${yaml}`, () => {
      const result = parseConfig(yaml + "\n", "c.yaml");
      assert.equal(result.kind, "invalid");
      if (result.kind !== "invalid") return;
      assert.equal(result.issues[0].path, path);
      assert.match(result.issues[0].message, new RegExp(message));
    });
  }
});

Deno.test("state.retention from a project's sandbox.yaml is refused: it would remove every project's runs", () => {
  const text = "state:\n  retention: {keep: 0}\n";
  const project = validateConfigText(text, "/repo/sandbox.yaml", "project");
  assert.equal(project.kind, "invalid");
  if (project.kind === "invalid") assert.equal(project.issues[0].path, "state.retention");
  assert.equal(validateConfigText(text, "/home/u/.config/sandbox/config.yaml", "user").kind, "ok");
  assert.equal(validateConfigText(text, "/tmp/named.yaml", "named").kind, "ok");
});
