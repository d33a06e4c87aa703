/**
 * `sandbox prune`, `sandbox runs` over the index of runs, and `state.retention`, as a user runs
 * them: the real CLI as a subprocess on a private `$XDG_STATE_HOME` holding run records of known
 * ages. The retention test makes one real run (Docker, the fake LLM).
 */
import assert from "node:assert/strict";
import { processStartTicks, run } from "../../lib/process.ts";
import { pruneImages } from "../../lib/sandbox/image_prune.ts";
import { RunFixture } from "../_run_fixture.ts";
import { FakeLlm, text } from "../_fake_llm.ts";
import type { RunMeta, RunStatus } from "../../lib/run/run_log.ts";
import { AccessLog, type AccessLogEntry } from "../../lib/proxy/access_log.ts";
import { assertDocker, dockerTest, explain, runCli, tempDir } from "../_helpers.ts";

console.error("e2e: sandbox prune tests starting");

const DAY_MS = 86_400_000;
const EVENTS = JSON.stringify({ type: "result", content: "x".repeat(1000) }) + "\n";

/** A state directory with run records written as `RunLog` writes them. */
class StateDir implements AsyncDisposable {
  constructor(readonly dir: { path: string } & AsyncDisposable) {}

  static async make(): Promise<StateDir> {
    return new StateDir(await tempDir("sandbox-e2e-prune-"));
  }

  get runs(): string {
    return `${this.dir.path}/sandbox/runs`;
  }

  /** A run that started `daysAgo` days ago; `pid` records it as this live process's when running. */
  async add(daysAgo: number, status: RunStatus = "succeeded"): Promise<string> {
    const started = new Date(Date.now() - daysAgo * DAY_MS);
    const id = `${started.toISOString().replace(/[-:]/g, "").replace("T", "-").slice(0, 15)}-${
      crypto.randomUUID().slice(0, 6)
    }`;
    const meta: RunMeta = {
      id,
      mode: "agentic",
      profile: "e2e-prune",
      model: "m",
      sandbox: "container",
      status,
      startedAt: started.toISOString(),
      endedAt: status === "running" ? null : new Date(started.getTime() + 60_000).toISOString(),
      durationMs: status === "running" ? null : 60_000,
      exitCode: status === "running" ? null : 0,
      usage: null,
      error: null,
      pid: Deno.pid,
      // This process's start: a running record is this live process's whatever its start date.
      pidStartTicks: await processStartTicks(Deno.pid),
      storeError: null,
    };
    await Deno.mkdir(`${this.runs}/${id}`, { recursive: true });
    await Deno.writeTextFile(`${this.runs}/${id}/meta.json`, JSON.stringify(meta));
    await Deno.writeTextFile(`${this.runs}/${id}/events.ndjson`, EVENTS);
    return id;
  }

  cli(args: string[], env: Record<string, string> = {}) {
    return runCli(args, { env: { XDG_STATE_HOME: this.dir.path, ...env } });
  }

  async ids(): Promise<string[]> {
    return (await Array.fromAsync(Deno.readDir(this.runs))).map((e) => e.name).sort();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.dir[Symbol.asyncDispose]();
  }
}

Deno.test("sandbox prune --older-than removes old finished runs, reports runs and bytes, and never a running run", async () => {
  await using state = await StateDir.make();
  const recent = await state.add(2);
  const old = await state.add(40, "failed");
  const older = await state.add(90);
  const running = await state.add(400, "running");

  const dry = await state.cli(["prune", "--older-than", "30d", "--dry-run", "--json"]);
  assert.equal(dry.exitCode, 0, explain(dry));
  const planned = JSON.parse(dry.stdout);
  assert.deepEqual(planned.removed.map((r: { id: string }) => r.id), [old, older], explain(dry));
  assert.equal(planned.dryRun, true);
  assert.ok(planned.bytes >= 2 * EVENTS.length, explain(dry));
  assert.deepEqual(await state.ids(), [recent, old, older, running].sort(), "a dry run removed");

  const done = await state.cli(["prune", "--older-than", "30d"]);
  assert.equal(done.exitCode, 0, explain(done));
  assert.match(done.stdout, /^removed 2 runs, [\d.]+ KiB; 2 kept$/m, explain(done));
  assert.deepEqual(await state.ids(), [recent, running].sort());
  const listed = await state.cli(["runs", "--json"]);
  assert.equal(listed.exitCode, 0, explain(listed));
  assert.deepEqual(
    JSON.parse(listed.stdout).map((r: RunMeta) => [r.id, r.status]),
    [[recent, "succeeded"], [running, "running"]],
  );
});

Deno.test("sandbox prune --keep keeps the newest finished runs; a usage mistake exits 2 and removes nothing", async () => {
  await using state = await StateDir.make();
  const newest = await state.add(1);
  await state.add(2);
  await state.add(3);
  const none = await state.cli(["prune"]);
  assert.equal(none.exitCode, 2, explain(none));
  assert.match(none.stderr, /^sandbox: .*name --older-than, --keep or both/m);
  const bad = await state.cli(["prune", "--older-than", "a month"]);
  assert.equal(bad.exitCode, 2, explain(bad));
  assert.match(bad.stderr, /Invalid --older-than "a month"/);
  assert.equal((await state.ids()).length, 3);
  const kept = await state.cli(["prune", "--keep", "1", "--json"]);
  assert.equal(kept.exitCode, 0, explain(kept));
  assert.equal(JSON.parse(kept.stdout).runs, 2);
  assert.deepEqual(await state.ids(), [newest]);
});

/** An access log line as the proxies write it, for a request that started `daysAgo` days ago. */
function accessLine(daysAgo: number, id: string): string {
  const entry: AccessLogEntry = {
    time: new Date(Date.now() - daysAgo * DAY_MS).toISOString(),
    kind: "egress",
    decision: "allow",
    method: "GET",
    host: `${id}.test`,
    port: 80,
    profile: "e2e-prune",
    runId: null,
    bytesIn: 1,
    bytesOut: 1,
    durationMs: 1,
  };
  return JSON.stringify(entry) + "\n";
}

Deno.test("sandbox prune --older-than also removes build logs and access log entries past the age, --keep alone leaves them", async () => {
  await using state = await StateDir.make();
  const builds = `${state.dir.path}/sandbox/builds`;
  const accessLog = `${state.dir.path}/sandbox/access.ndjson`;
  await Deno.mkdir(builds, { recursive: true });
  await Deno.writeTextFile(`${builds}/sandbox-runtime-old.log`, "old build\n");
  await Deno.writeTextFile(`${builds}/sandbox-runtime-new.log`, "new build\n");
  const fortyDaysAgo = new Date(Date.now() - 40 * DAY_MS);
  await Deno.utime(`${builds}/sandbox-runtime-old.log`, fortyDaysAgo, fortyDaysAgo);
  const recent = accessLine(2, "new1");
  const lines = [accessLine(40, "old1"), recent, "not an entry\n", accessLine(35, "old2")];
  await Deno.writeTextFile(accessLog, lines.join(""));
  await state.add(40);

  const keepOnly = await state.cli(["prune", "--keep", "0", "--json"]);
  assert.equal(keepOnly.exitCode, 0, explain(keepOnly));
  assert.deepEqual(JSON.parse(keepOnly.stdout).buildLogs, [], explain(keepOnly));
  assert.equal(
    (await Deno.readTextFile(accessLog)).split("\n").length,
    5,
    "--keep touched the log",
  );

  const dry = await state.cli(["prune", "--older-than", "30d", "--dry-run", "--json"]);
  assert.equal(dry.exitCode, 0, explain(dry));
  const planned = JSON.parse(dry.stdout);
  assert.deepEqual(planned.buildLogs.map((l: { name: string }) => l.name), [
    "sandbox-runtime-old.log",
  ]);
  assert.equal(planned.accessLog.entries, 2, explain(dry));
  assert.equal((await Array.fromAsync(Deno.readDir(builds))).length, 2, "a dry run removed");

  const done = await state.cli(["prune", "--older-than", "30d"]);
  assert.equal(done.exitCode, 0, explain(done));
  assert.match(done.stdout, /^removed build log sandbox-runtime-old\.log /m, explain(done));
  assert.match(done.stdout, /^removed 2 access log entries /m, explain(done));
  assert.deepEqual((await Array.fromAsync(Deno.readDir(builds))).map((e) => e.name), [
    "sandbox-runtime-new.log",
  ]);
  assert.equal(await Deno.readTextFile(accessLog), recent + "not an entry\n");
});

Deno.test("sandbox prune loses no access log entry that a live proxy writes while it prunes", async () => {
  await using state = await StateDir.make();
  const accessLog = `${state.dir.path}/sandbox/access.ndjson`;
  await Deno.mkdir(`${state.dir.path}/sandbox`, { recursive: true });
  const old = Array.from({ length: 2000 }, (_, i) => accessLine(40, `old${i}`)).join("");
  await Deno.writeTextFile(accessLog, old);
  console.error("e2e: writing access log entries while sandbox prune runs");
  const log = new AccessLog({ path: accessLog });
  const pruning = state.cli(["prune", "--older-than", "30d", "--json"]);
  let written = 0;
  let finished = false;
  pruning.finally(() => (finished = true));
  // Entries keep coming until the prune has ended, and some more after it.
  while (!finished || written % 100 !== 50) {
    log.write(JSON.parse(accessLine(0, `live${written++}`)));
    await log.flush();
  }
  await log.close();
  const done = await pruning;
  assert.equal(done.exitCode, 0, explain(done));
  assert.equal(JSON.parse(done.stdout).accessLog.entries, 2000, explain(done));
  const hosts = (await Deno.readTextFile(accessLog)).split("\n").filter(Boolean)
    .map((line) => (JSON.parse(line) as AccessLogEntry).host);
  assert.equal(hosts.length, written, "entries lost or doubled");
  assert.deepEqual(
    new Set(hosts),
    new Set(Array.from({ length: written }, (_, i) => `live${i}.test`)),
  );
  assert.deepEqual(
    await Array.fromAsync(Deno.readDir(`${state.dir.path}/sandbox`)).then((es) =>
      es.map((e) => e.name).filter((name) => name.startsWith("access"))
    ),
    ["access.ndjson"],
  );
});

Deno.test("sandbox runs rebuilds a missing index, says so on stderr, and takes --limit", async () => {
  await using state = await StateDir.make();
  const first = await state.add(2);
  const second = await state.add(1);
  const listed = await state.cli(["runs", "--json"]);
  assert.equal(listed.exitCode, 0, explain(listed));
  assert.match(listed.stderr, /index of runs was missing; rebuilt from 2 run directories/);
  assert.deepEqual(JSON.parse(listed.stdout).map((r: RunMeta) => r.id), [second, first]);
  const again = await state.cli(["runs", "--limit", "1"]);
  assert.equal(again.exitCode, 0, explain(again));
  assert.equal(again.stderr, "", "an index in good order is not rebuilt");
  assert.match(again.stdout, new RegExp(second));
  assert.doesNotMatch(again.stdout, new RegExp(first));
});

Deno.test({
  name:
    "sandbox prune --images lists a stale sandbox-runtime tag, keeps one a container was created from, and removes only stale ones; mode local's stale agent files and other sources' bundles too",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using state = await StateDir.make();
    const rand = crypto.randomUUID().slice(0, 8);
    const mine = `e2e-prune-${rand}`;
    const stale = `sandbox-runtime:${mine}-stale`;
    const used = `sandbox-runtime:${mine}-used`;
    const docker = async (...args: string[]) => {
      const result = await run(["docker", ...args]);
      assert.equal(result.exitCode, 0, `docker ${args.join(" ")}: ${result.stderr}`);
      return result.stdout.trim();
    };
    try {
      // Images of their own (new ids, no network): committed from a container never started.
      await docker("create", "--name", `${mine}-src`, "sandbox-base:bookworm", "true");
      for (const tag of [stale, used]) {
        await docker("commit", "--change", `LABEL e2e.prune=${tag}`, `${mine}-src`, tag);
      }
      await docker("rm", `${mine}-src`);
      await docker("create", "--name", `${mine}-user`, used, "true");

      // Mode local's agent files of an earlier pin, in a cache directory of the test's own.
      await using cache = await tempDir("sandbox-e2e-prune-cache-");
      const oldAgent = "codex-0.1.0-amd64-0123456789ab";
      await Deno.mkdir(`${cache.path}/sandbox/agents/${oldAgent}/bin`, { recursive: true });
      await Deno.writeTextFile(`${cache.path}/sandbox/agents/${oldAgent}/bin/codex`, "old\n");
      const env = { XDG_CACHE_HOME: cache.path };
      // A worker bundle of other sources, in the test's state directory.
      const oldBundle = "worker-0123456789abcdef.js";
      await Deno.mkdir(`${state.dir.path}/sandbox/worker`, { recursive: true });
      await Deno.writeTextFile(`${state.dir.path}/sandbox/worker/${oldBundle}`, "old\n");

      // On the shared engine the CLI only lists: a real prune could remove others' images.
      const dry = await state.cli(["prune", "--images", "--dry-run", "--json"], env);
      assert.equal(dry.exitCode, 0, explain(dry));
      assert.deepEqual(JSON.parse(dry.stdout).agents, { removed: [{ name: oldAgent, bytes: 4 }] });
      const said = await state.cli(["prune", "--images", "--dry-run"], env);
      assert.match(said.stdout, new RegExp(`would remove agent files ${oldAgent} \\(4 B\\)`));
      assert.deepEqual(JSON.parse(dry.stdout).bundles, {
        removed: [{ name: oldBundle, bytes: 4 }],
      });
      assert.match(said.stdout, new RegExp(`would remove bundle ${oldBundle} \\(4 B\\)`));
      await Deno.stat(`${state.dir.path}/sandbox/worker/${oldBundle}`);
      // A live sandbox of mode local (its owner is this test's process) binds such files into each
      // command it starts: they are kept while it lives, and the output says why.
      const liveSandbox = `${state.dir.path}/sandbox/local/local-e2e-prune-live`;
      await Deno.mkdir(liveSandbox, { recursive: true });
      await Deno.writeTextFile(
        `${liveSandbox}/owner`,
        `${Deno.pid} ${await processStartTicks(Deno.pid)}\n`,
      );
      const kept = await state.cli(["prune", "--images", "--dry-run", "--json"], env);
      assert.equal(kept.exitCode, 0, explain(kept));
      const keptReport = JSON.parse(kept.stdout);
      assert.deepEqual(keptReport.keptForLocalSandboxes, ["local-e2e-prune-live"], kept.stdout);
      assert.equal(keptReport.agents, undefined);
      assert.equal(keptReport.bundles, undefined);
      const keptText = await state.cli(["prune", "--images", "--dry-run"], env);
      assert.match(
        keptText.stdout,
        /kept agent files and bundles: mode local sandboxes are running/,
      );
      await Deno.remove(liveSandbox, { recursive: true });
      await Deno.stat(`${cache.path}/sandbox/agents/${oldAgent}/bin/codex`);
      const planned = JSON.parse(dry.stdout).images;
      assert.ok(planned.removed.some((i: { tag: string }) => i.tag === stale), explain(dry));
      assert.ok(planned.inUse.includes(used), explain(dry));
      assert.ok(!planned.removed.some((i: { tag: string }) => !i.tag.startsWith("sandbox-")));
      await docker("image", "inspect", stale);

      const report = await pruneImages({ keep: new Set(), only: (tag) => tag.includes(mine) });
      assert.deepEqual(report.removed.map((i) => i.tag), [stale]);
      assert.deepEqual(report.inUse, [used]);
      assert.notEqual((await run(["docker", "image", "inspect", stale])).exitCode, 0);
      await docker("image", "inspect", used);
    } finally {
      await run(["docker", "rm", "-f", `${mine}-src`, `${mine}-user`]);
      await run(["docker", "image", "rm", stale, used]);
    }
  },
});

Deno.test({
  name: "state.retention prunes finished runs past it at the end of a run, keeping the new one",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([text("done")]);
    await using fixture = await RunFixture.make({
      prefix: "e2e-retention",
      llmUrl: llm.baseUrl,
      keyEnv: "SANDBOX_E2E_RETENTION_KEY",
      prompt: "Say done.\n",
    });
    await Deno.writeTextFile(fixture.config, "state:\n  retention: {older_than: 30d}\n", {
      append: true,
    });
    const state = new StateDir({ path: fixture.stateDir, [Symbol.asyncDispose]: async () => {} });
    const old = await state.add(60);
    const recent = await state.add(1);
    const result = await fixture.cli([
      "run",
      "generate",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "ndjson",
    ]);
    assert.equal(result.exitCode, 0, explain(result));
    assert.match(result.stderr, /state\.retention removed 1 finished runs/, explain(result));
    const ids = await state.ids();
    assert.equal(ids.length, 2, explain(result));
    assert.ok(!ids.includes(old) && ids.includes(recent), ids.join(" "));
  },
});
