/**
 * What a burst of runs leaves on the host: four `run --repo` at once on a fresh repository, with
 * `pool: 1`, a lock directory and a state directory of their own. Once they (and the refills
 * behind them) are done, the profile has exactly one container, ready in the pool; the lock
 * directory is empty; the only proxy directory is that container's. After `down`, the profile
 * has no proxy directory at all.
 */
import { createRepo } from "../_git.ts";
import assert from "node:assert/strict";
import { FakeLlm, text } from "../_fake_llm.ts";
import { assertDocker, docker, dockerTest, explain, tempDir } from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";
import { run } from "../../lib/process.ts";
import { PROXY_MOUNT_PATH } from "../../lib/sandbox/proxy_mount.ts";

console.error("e2e: pool leftovers tests starting");

const RUNS = 4;
/** How long the refills behind the runs may take to settle. */
const SETTLE_MS = 180_000;

/** A repository with one commit on main. */

async function entries(dir: string): Promise<string[]> {
  return (await Array.fromAsync(Deno.readDir(dir)).catch(() => [])).map((entry) => entry.name);
}

/** The profile's containers, each with its state and the host directory at its proxy mount. */
async function containersOf(profile: string): Promise<{ name: string; proxyDir?: string }[]> {
  const names = (await docker(
    "ps",
    "-a",
    "--filter",
    `label=dev.sandbox.profile=${profile}`,
    "--format",
    "{{.Names}}",
  )).split("\n").filter(Boolean);
  const format =
    `{{range .Mounts}}{{if eq .Destination "${PROXY_MOUNT_PATH}"}}{{.Source}}{{end}}{{end}}`;
  return await Promise.all(names.map(async (name) => ({
    name,
    proxyDir: (await run(["docker", "inspect", "--format", format, name])).stdout.trim() ||
      undefined,
  })));
}

Deno.test({
  name:
    "a burst of runs on a fresh repository with pool: 1 leaves one ready container, no lock file, and only that container's proxy directory; down leaves no proxy directory",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm(Array.from({ length: RUNS }, () => text("Done")));
    await using fixture = await RunFixture.make({
      prefix: "e2e-burst",
      llmUrl: llm.baseUrl,
      keyEnv: "E2E_BURST_KEY",
      prompt: "Say done\n",
      sandboxYaml: "{pool: 1}",
    });
    await using locks = await tempDir("sandbox-e2e-burst-locks-");
    const env = { SANDBOX_LOCK_DIR: locks.path };
    const repo = await createRepo(`${fixture.dir.path}/repo`, "a repository\n");
    const results = await Promise.all(Array.from({ length: RUNS }, () =>
      fixture.cli([
        "run",
        "agentic",
        "--prompt-file",
        fixture.promptFile,
        "--profile",
        fixture.profile,
        "--repo",
        repo,
      ], env)));
    for (const result of results) assert.equal(result.exitCode, 0, explain(result));

    // `up` waits for a refill under way (the pool's lock) and adds nothing to a full pool.
    const up = await fixture.cli(["up", "-p", fixture.profile, "--repo", repo, "--json"], env);
    assert.equal(up.exitCode, 0, explain(up));
    const ready = (JSON.parse(up.stdout) as { ready: string[] }).ready;
    assert.equal(ready.length, 1, explain(up));

    // The runs' own containers go moments after them (removed without waiting).
    const deadline = Date.now() + SETTLE_MS;
    let containers = await containersOf(fixture.profile);
    while (containers.length > 1 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      containers = await containersOf(fixture.profile);
    }
    assert.deepEqual(containers.map((each) => each.name), ready, "containers besides the pool's");
    assert.deepEqual(await entries(locks.path), [], "lock files left");
    const proxyDir = containers[0].proxyDir;
    assert.ok(proxyDir, "the ready container has no proxy directory");
    const parent = proxyDir.slice(0, proxyDir.lastIndexOf("/"));
    const own = proxyDir.slice(proxyDir.lastIndexOf("/") + 1);
    assert.deepEqual(
      (await entries(parent)).filter((name) => !name.startsWith(`${own}.`)),
      [own],
      "proxy directories of removed containers",
    );

    const down = await fixture.cli(["down", "-p", fixture.profile, "--json"], env);
    assert.equal(down.exitCode, 0, explain(down));
    assert.deepEqual(await containersOf(fixture.profile), []);
    assert.deepEqual(await entries(parent), [], "proxy directories left after down");
  },
});
