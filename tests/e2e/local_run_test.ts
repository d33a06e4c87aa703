/**
 * A replayed agentic run (examples/hello) in sandbox mode local, from the CLI: the agent works in
 * a bubblewrap sandbox with no Docker, its model reached through the relay and the host's proxies,
 * and `--repo` brings its commit back as a branch of the user's repository.
 */
import { git } from "../_git.ts";
import assert from "node:assert/strict";
import { decodeMessage } from "../../lib/run/protocol.ts";
import {
  explain,
  profileFrom,
  ROOT,
  runCli,
  tempDir,
  uniqueProfile,
  withEnv,
} from "../_helpers.ts";
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { denoCacheDir, warmDenoCache } from "../../lib/sandbox/local/deno_cache.ts";
import { localSandboxesDir } from "../../lib/sandbox/local/local_sandbox.ts";
import { denoBinaryPath, workerBundlePath } from "../../lib/sandbox/worker_bundle.ts";
import { assertLocal, localTest } from "../_local.ts";

Deno.test({
  name: "a replayed run in mode local streams its events and brings its branch back",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-");
    const profile = uniqueProfile("e2e-local");
    const config = `${dir.path}/sandbox.yaml`;
    await Deno.writeTextFile(config, `profiles:\n  ${profile}:\n    sandbox: {mode: local}\n`);
    await Deno.copyFile(`${ROOT}/examples/hello/prompt.txt`, `${dir.path}/prompt.txt`);
    await Deno.copyFile(`${ROOT}/examples/hello/recording.json`, `${dir.path}/recording.json`);
    const repo = `${dir.path}/repo`;
    await Deno.mkdir(repo);
    await git(repo, "init", "-q");
    await git(
      repo,
      "-c",
      "user.name=t",
      "-c",
      "user.email=t@t.invalid",
      "commit",
      "-q",
      "--allow-empty",
      "-m",
      "init",
    );
    const result = await runCli([
      "run",
      "agentic",
      "-p",
      profile,
      "--prompt-file",
      `${dir.path}/prompt.txt`,
      "--model",
      `replay:${dir.path}/recording.json`,
      "--format",
      "ndjson",
      "--repo",
      repo,
    ], { config, env: { XDG_STATE_HOME: `${dir.path}/state` } });
    assert.equal(result.exitCode, 0, explain(result));
    const messages = result.stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
    const ran = messages.find((m) => m.type === "tool_result" && m.tool_name === "execute");
    assert.match(String(ran?.tool_output), /Hello from the sandbox/);
    assert.equal(messages.filter((m) => m.type === "result").length, 1);
    const branch = /branch (sandbox\/\S+) in /.exec(result.stderr)?.[1];
    assert.ok(branch, explain(result));
    assert.match(await git(repo, "show", `${branch}:greet.sh`), /Hello from the sandbox/);
    const left = await Array.fromAsync(Deno.readDir(`${dir.path}/state/sandbox/local`));
    assert.deepEqual(left.map((e) => e.name), [], "the sandbox's directory is gone");
  },
});

/** Seconds since boot: the clock of a process's start time in /proc. */
async function uptimeS(): Promise<number> {
  return Number((await Deno.readTextFile("/proc/uptime")).split(" ")[0]);
}

/** The disk watcher's sleeps (a host `sleep 1` whose parent runs the watch's `du` loop): pid, start. */
async function watcherSleeps(): Promise<{ pid: number; startS: number }[]> {
  const found: { pid: number; startS: number }[] = [];
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (cmdline !== "sleep\x001\x00") continue;
    const stat = await Deno.readTextFile(`/proc/${entry.name}/stat`).catch(() => "");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const parent = await Deno.readTextFile(`/proc/${fields[1]}/cmdline`).catch(() => "");
    // Field 22 (starttime), in clock ticks: 100 a second on Linux.
    if (parent.includes("du -sk")) {
      found.push({ pid: Number(entry.name), startS: Number(fields[19]) / 100 });
    }
  }
  return found;
}

Deno.test({
  name:
    "a local sandbox's disk watch, closed while its watcher sleeps, kills that sleep instead of waiting it out",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-watch-");
    await withEnv({ XDG_STATE_HOME: `${dir.path}/state` }, async () => {
      const name = uniqueProfile("e2e-local-watch");
      const profile = profileFrom(`profiles:\n  ${name}:\n    sandbox: {mode: local}\n`, name);
      const sandbox = await (await sandboxLifecycle(profile)).acquire({ runId: "watch" });
      try {
        const watch = sandbox.watchDisk({});
        let sleeping: { pid: number; startS: number }[] = [];
        for (let i = 0; i < 400 && sleeping.length === 0; i++) {
          await new Promise((resolve) => setTimeout(resolve, 25));
          sleeping = await watcherSleeps();
        }
        assert.ok(sleeping.length > 0, "the watcher never slept");
        await watch.close();
        // Closed within its sleep's second: the sleep was killed, not waited for.
        const waited = await uptimeS() - Math.max(...sleeping.map((s) => s.startS));
        assert.ok(
          waited < 0.9,
          `the close waited out the watcher's sleep (${waited.toFixed(2)} s)`,
        );
        assert.deepEqual(await watcherSleeps(), [], "no sleep of the watcher outlives the close");
      } finally {
        await sandbox.release();
      }
    });
  },
});

Deno.test({
  name:
    "a Deno cache that cannot be warmed leaves the run cold and says why; none is kept, and the next warm-up makes it",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-warm-");
    // A cache directory of the test's own; the state directory is the user's, where the bundles
    // are already made (a new one would bundle the worker again, ~20 s).
    await withEnv({ XDG_CACHE_HOME: `${dir.path}/cache` }, async () => {
      const name = uniqueProfile("e2e-local-warm");
      const profile = profileFrom(`profiles:\n  ${name}:\n    sandbox: {mode: local}\n`, name);
      const broken = `${dir.path}/worker.js`;
      await Deno.writeTextFile(broken, "throw new Error('not a worker');\n");
      const said: string[] = [];
      const programs = { deno: denoBinaryPath(), worker: broken };
      assert.equal(await warmDenoCache(profile, programs, (line) => said.push(line)), undefined);
      assert.match(
        said.join("\n"),
        /could not be warmed, so this run starts cold: .*not a worker/s,
      );
      const kept = await Array.fromAsync(Deno.readDir(`${dir.path}/cache/sandbox/local-deno`))
        .catch(() => []);
      assert.deepEqual(kept.map((e) => e.name), [], "nothing half-made is kept");
      // The twin: the real worker warms it, read-only, where runs look for it.
      const warmed = await warmDenoCache(profile, {
        ...programs,
        worker: await workerBundlePath(),
      });
      assert.equal(warmed, await denoCacheDir());
      assert.equal((await Deno.stat(`${warmed}/v8_code_cache_v2`)).mode! & 0o777, 0o444);
      const left = (await Array.fromAsync(Deno.readDir(localSandboxesDir())))
        .filter((e) => e.name.startsWith("local-warm-"));
      assert.deepEqual(left.map((e) => e.name), [], "the warm-up sandboxes are gone");
    });
  },
});
