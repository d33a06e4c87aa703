/**
 * The leftover check that ends the test command (scripts/leftovers.ts): it fails naming what the
 * suite left of its own (a process carrying its marker, a temporary directory it listed, a Docker
 * object of a profile it listed) and passes over what is not its own. It never removes anything:
 * this test removes what it made itself.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { docker, DOCKER_AVAILABLE, ROOT, tempDir, uniqueProfile } from "../_helpers.ts";

/** `scripts/leftovers.ts` for suite `suite` with `manifest`, looking once (no grace). */
function check(suite: string, manifest: string) {
  return run([Deno.execPath(), "run", "-A", `${ROOT}/scripts/leftovers.ts`], {
    env: {
      SANDBOX_TEST_SUITE: suite,
      SANDBOX_TEST_MANIFEST: manifest,
      SANDBOX_LEFTOVER_GRACE_MS: "0",
    },
  });
}

/** A `sleep` started as a test would start it, in `suite`. */
function sleeper(suite: string): Deno.ChildProcess {
  return new Deno.Command("sleep", {
    args: ["300"],
    env: { SANDBOX_TEST_SUITE: suite },
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
}

Deno.test("the leftover check names a process, a temporary directory and a volume of the suite's own, and passes once they are gone", async () => {
  await using work = await tempDir("sandbox-leftovers-");
  const suite = crypto.randomUUID().slice(0, 8);
  const manifest = `${work.path}/made`;
  const leftDir = `${work.path}/left`;
  await Deno.mkdir(leftDir);
  const profile = uniqueProfile("leftover-check");
  await Deno.writeTextFile(manifest, `tmp ${leftDir}\nprofile ${profile}\n`);
  const child = sleeper(suite);
  let volume: string | undefined;
  try {
    if (DOCKER_AVAILABLE) {
      volume = await docker("volume", "create", "--label", `dev.sandbox.profile=${profile}`);
    }
    const failed = await check(suite, manifest);
    assert.equal(failed.exitCode, 1, failed.stderr);
    assert.match(failed.stderr, new RegExp(`process ${child.pid}: \\S*sleep 300`));
    assert.match(failed.stderr, new RegExp(`temporary directory ${leftDir}`));
    if (volume) {
      assert.match(failed.stderr, new RegExp(`volume ${volume} \\(profile ${profile}\\)`));
    }
    assert.ok(await Deno.lstat(leftDir), "the check removed a directory");
  } finally {
    child.kill("SIGKILL");
    await child.status;
    if (volume) await docker("volume", "rm", volume);
  }
  await Deno.remove(leftDir);
  const passed = await check(suite, manifest);
  assert.equal(passed.exitCode, 0, passed.stderr);
  assert.match(
    passed.stderr,
    /leftovers: none \(1 test profiles, 1 temporary directories checked\)/,
  );
});

Deno.test("the leftover check passes over what is not the suite's own: another suite's process and profile", async () => {
  await using work = await tempDir("sandbox-leftovers-");
  const manifest = `${work.path}/made`;
  await Deno.writeTextFile(manifest, `profile ${uniqueProfile("leftover-mine")}\n`);
  const other = sleeper("another-suite");
  const otherProfile = uniqueProfile("leftover-theirs");
  let volume: string | undefined;
  try {
    if (DOCKER_AVAILABLE) {
      volume = await docker("volume", "create", "--label", `dev.sandbox.profile=${otherProfile}`);
    }
    const result = await check(crypto.randomUUID().slice(0, 8), manifest);
    assert.equal(result.exitCode, 0, result.stderr);
    assert.doesNotMatch(result.stderr, /sleep 300|leftover-theirs/);
  } finally {
    other.kill("SIGKILL");
    await other.status;
    if (volume) await docker("volume", "rm", volume);
  }
});
