/**
 * The warm pool's book (lib/sandbox/pool_records.ts): a claim is atomic and happens once, and a
 * container whose holder is gone is found, whatever pid now has its number; what is starting for a
 * pool is told from every other hold.
 */
import assert from "node:assert/strict";
import {
  addReady,
  claimReady,
  holdOwn,
  listClaimed,
  listReady,
  orphaned,
  poolKey,
  processStartTicks,
  releaseOwn,
  startingFor,
} from "../../lib/sandbox/pool_records.ts";
import { tempDir, withEnv } from "../_helpers.ts";

async function inStateDir<T>(fn: () => Promise<T>): Promise<T> {
  await using dir = await tempDir("sandbox-pool-records-");
  return await withEnv({ XDG_STATE_HOME: dir.path }, fn);
}

Deno.test("a claimed container is never offered again: a second claim of it fails, and it is no longer listed as ready", async () => {
  await inStateDir(async () => {
    await addReady({
      name: "sandbox-p-pa",
      key: poolKey("p"),
      configHash: "h",
      imageId: "sha256:i",
    });
    assert.deepEqual((await listReady()).map((r) => r.name), ["sandbox-p-pa"]);
    assert.equal(await claimReady("sandbox-p-pa"), true);
    assert.equal(await claimReady("sandbox-p-pa"), false);
    assert.deepEqual(await listReady(), []);
    assert.deepEqual((await listClaimed()).map((r) => [r.name, r.pid]), [[
      "sandbox-p-pa",
      Deno.pid,
    ]]);
  });
});

Deno.test("of two runs that claim at once, exactly one wins each container (20 pairs, each claim in a process of its own)", async () => {
  await inStateDir(async () => {
    const names = Array.from({ length: 20 }, (_, i) => `sandbox-p-p${i}`);
    for (const name of names) {
      await addReady({ name, key: poolKey("p"), configHash: "h", imageId: "sha256:i" });
    }
    const module = new URL("../../lib/sandbox/pool_records.ts", import.meta.url).href;
    const claimer = (name: string) =>
      new Deno.Command(Deno.execPath(), {
        args: [
          "eval",
          `const { claimReady } = await import(${
            JSON.stringify(module)
          }); console.log(await claimReady(${JSON.stringify(name)}));`,
        ],
        stdout: "piped",
        stderr: "piped",
      }).output();
    const outcomes = await Promise.all(names.flatMap((name) => [claimer(name), claimer(name)]));
    const won = outcomes.map((o) => new TextDecoder().decode(o.stdout).trim());
    for (let i = 0; i < names.length; i++) {
      assert.deepEqual(
        [won[2 * i], won[2 * i + 1]].sort(),
        ["false", "true"],
        `${names[i]}: ${won[2 * i]}, ${won[2 * i + 1]}`,
      );
    }
    assert.equal((await listClaimed()).length, 20);
  });
});

Deno.test("a container whose holder is gone is an orphan; one whose holder lives is not, and a reused pid does not pass for its holder", async () => {
  await inStateDir(async () => {
    await holdOwn("sandbox-p-mine");
    assert.deepEqual(await orphaned(), [], "this process holds it and lives");
    const child = new Deno.Command("sleep", { args: ["0"] }).spawn();
    await child.status;
    // A holder that exited (its pid is free) and one whose pid is taken by a process started later.
    const { userStateDir } = await import("../../lib/paths.ts");
    await Deno.writeTextFile(`${userStateDir()}/pool/claimed/sandbox-p-dead.${child.pid}-1`, "");
    const ticks = await processStartTicks(Deno.pid);
    assert.ok(ticks !== undefined && ticks > 1);
    await Deno.writeTextFile(
      `${userStateDir()}/pool/claimed/sandbox-p-reused.${Deno.pid}-${ticks! - 1}`,
      "",
    );
    assert.deepEqual((await orphaned()).map((r) => r.name).sort(), [
      "sandbox-p-dead",
      "sandbox-p-reused",
    ]);
    await releaseOwn("sandbox-p-mine");
    assert.deepEqual((await listClaimed()).map((r) => r.name).sort(), [
      "sandbox-p-dead",
      "sandbox-p-reused",
    ]);
  });
});

Deno.test("what counts as starting for a pool: only its own key's, held by a live process; not a run's claim, a cold run's hold or a dead filler's", async () => {
  await inStateDir(async () => {
    const key = poolKey("p");
    await holdOwn("sandbox-p-pstarting", key);
    await holdOwn("sandbox-p-pother", poolKey("p", "codex"));
    await holdOwn("sandbox-p-cold");
    await addReady({ name: "sandbox-p-pclaimed", key, configHash: "h", imageId: "sha256:i" });
    assert.equal(await claimReady("sandbox-p-pclaimed"), true);
    const child = new Deno.Command("sleep", { args: ["0"] }).spawn();
    await child.status;
    const { userStateDir } = await import("../../lib/paths.ts");
    await Deno.writeTextFile(
      `${userStateDir()}/pool/claimed/sandbox-p-pdead.${child.pid}-1`,
      `starting for ${key}`,
    );
    assert.deepEqual((await startingFor(key)).map((r) => r.name), ["sandbox-p-pstarting"]);
    // Ready now: no longer starting (twin).
    await releaseOwn("sandbox-p-pstarting");
    assert.deepEqual(await startingFor(key), []);
  });
});
