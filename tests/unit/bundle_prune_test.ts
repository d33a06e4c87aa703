/**
 * `pruneBundles` (lib/sandbox/worker_bundle.ts), `sandbox prune --images`'s step for the worker and
 * relay bundles of the state directory and mode local's warmed Deno caches: those of other sources
 * and the partial files of a killed bundling go; this CLI's own, a bundling under way and files the
 * tool did not name stay.
 */
import assert from "node:assert/strict";
import { denoCachesDir, pruneBundles, workerIdentity } from "../../lib/sandbox/worker_bundle.ts";
import { tempDir, withEnv } from "../_helpers.ts";

Deno.test("pruneBundles removes other sources' bundles and dead partials, keeps the current ones, a live partial and foreign files; a dry run removes nothing", async () => {
  await using state = await tempDir("sandbox-bundle-prune-");
  await withEnv({ XDG_STATE_HOME: state.path, XDG_CACHE_HOME: `${state.path}/cache` }, async () => {
    const dir = `${state.path}/sandbox/worker`;
    await Deno.mkdir(dir, { recursive: true });
    const current = (await workerIdentity()).slice(0, 16);
    // A pid no process has: the partial of a bundling that was killed.
    const deadPid = 4_194_304 + 7;
    const files: Record<string, string> = {
      [`worker-${current}.js`]: "current worker",
      [`relay-${current}.js`]: "current relay",
      "worker-0123456789abcdef.js": "stale",
      "relay-0123456789abcdef.js": "stale",
      [`worker-${current}.js.${deadPid}.partial.js`]: "killed",
      [`relay-${current}.js.${Deno.pid}.partial.js`]: "being written",
      "notes.txt": "not the tool's",
    };
    for (const [name, text] of Object.entries(files)) {
      await Deno.writeTextFile(`${dir}/${name}`, text);
    }
    // Mode local's warmed Deno caches: directories of one build each.
    const caches = denoCachesDir();
    const cacheDirs = [
      `${current}-2.9.6`,
      "0123456789abcdef-2.9.6",
      `${current}-2.9.6.${deadPid}.partial`,
      `${current}-2.9.6.${Deno.pid}.partial`,
      "not-the-tools",
    ];
    for (const name of cacheDirs) {
      await Deno.mkdir(`${caches}/${name}`, { recursive: true });
      await Deno.writeTextFile(`${caches}/${name}/v8_code_cache_v2`, "cache");
    }
    const removable = [
      "local-deno/0123456789abcdef-2.9.6",
      `local-deno/${current}-2.9.6.${deadPid}.partial`,
      "relay-0123456789abcdef.js",
      "worker-0123456789abcdef.js",
      `worker-${current}.js.${deadPid}.partial.js`,
    ].sort();
    const cachesLeft = async () =>
      (await Array.fromAsync(Deno.readDir(caches))).map((e) => e.name).sort();
    const listed = async () => (await Array.fromAsync(Deno.readDir(dir))).map((e) => e.name).sort();

    const dry = await pruneBundles({ dryRun: true });
    assert.deepEqual(dry.removed.map((f) => f.name).sort(), removable);
    assert.deepEqual(dry.removed.find((f) => f.name === "worker-0123456789abcdef.js")?.bytes, 5);
    assert.deepEqual(
      dry.removed.find((f) => f.name === "local-deno/0123456789abcdef-2.9.6")?.bytes,
      5,
      "a cache's size is its files'",
    );
    assert.deepEqual(await listed(), Object.keys(files).sort(), "a dry run removes nothing");
    assert.deepEqual(await cachesLeft(), [...cacheDirs].sort(), "a dry run removes no cache");

    const done = await pruneBundles();
    assert.deepEqual(done.removed.map((f) => f.name).sort(), removable);
    assert.deepEqual(
      await listed(),
      Object.keys(files).filter((name) => !removable.includes(name)).sort(),
    );
    assert.deepEqual(
      await cachesLeft(),
      cacheDirs.filter((name) => !removable.includes(`local-deno/${name}`)).sort(),
    );
    assert.deepEqual((await pruneBundles()).removed, [], "nothing left to prune");
  });
});

Deno.test("pruneBundles with no bundle or cache directory removes nothing", async () => {
  await using state = await tempDir("sandbox-bundle-prune-");
  await withEnv({ XDG_STATE_HOME: state.path, XDG_CACHE_HOME: `${state.path}/cache` }, async () => {
    assert.deepEqual(await pruneBundles(), { removed: [] });
  });
});
