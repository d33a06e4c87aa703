/**
 * `pruneBundles` (lib/sandbox/worker_bundle.ts), `sandbox prune --images`'s step for the worker and
 * relay bundles of the state directory: those of other sources and the partial files of a killed
 * bundling go; this CLI's own, a bundling under way and files the tool did not name stay.
 */
import assert from "node:assert/strict";
import { pruneBundles, workerIdentity } from "../../lib/sandbox/worker_bundle.ts";
import { tempDir } from "../_helpers.ts";

Deno.test("pruneBundles removes other sources' bundles and dead partials, keeps the current ones, a live partial and foreign files; a dry run removes nothing", async () => {
  await using state = await tempDir("sandbox-bundle-prune-");
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state.path);
  try {
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
    const removable = [
      "relay-0123456789abcdef.js",
      "worker-0123456789abcdef.js",
      `worker-${current}.js.${deadPid}.partial.js`,
    ].sort();
    const listed = async () => (await Array.fromAsync(Deno.readDir(dir))).map((e) => e.name).sort();

    const dry = await pruneBundles({ dryRun: true });
    assert.deepEqual(dry.removed.map((f) => f.name).sort(), removable);
    assert.deepEqual(dry.removed.find((f) => f.name === "worker-0123456789abcdef.js")?.bytes, 5);
    assert.deepEqual(await listed(), Object.keys(files).sort(), "a dry run removes nothing");

    const done = await pruneBundles();
    assert.deepEqual(done.removed.map((f) => f.name).sort(), removable);
    assert.deepEqual(
      await listed(),
      Object.keys(files).filter((name) => !removable.includes(name)).sort(),
    );
    assert.deepEqual((await pruneBundles()).removed, [], "nothing left to prune");
  } finally {
    if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", previous);
  }
});

Deno.test("pruneBundles with no bundle directory removes nothing", async () => {
  await using state = await tempDir("sandbox-bundle-prune-");
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state.path);
  try {
    assert.deepEqual(await pruneBundles(), { removed: [] });
  } finally {
    if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", previous);
  }
});
