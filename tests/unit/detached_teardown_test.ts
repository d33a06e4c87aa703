/**
 * A run's own container is removed behind its back: `teardownDetached()` returns while the removal
 * is still under way (a fake docker holds `rm` until the test lets it go), and the removal then
 * finishes on its own — container first, then its volume — though nobody awaits it.
 */
import assert from "node:assert/strict";
import { bareProfile } from "../../lib/config.ts";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import { fakeDocker } from "./_fake_docker.ts";

async function until(what: string, check: () => Promise<boolean>): Promise<void> {
  for (const deadline = Date.now() + 30_000; Date.now() < deadline;) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error(`timed out waiting for ${what}`);
}

Deno.test("teardownDetached() returns before the removal ends, and the container then its volume are removed by themselves", async () => {
  await using docker = await fakeDocker(`
gate="$(dirname "$CALLS")/release"
if [ "$1" = rm ]; then
  : >"$(dirname "$CALLS")/rm-started"
  # Bounded: a test that failed before letting it go must not leave this loop behind.
  for _ in $(seq 1500); do [ -e "$gate" ] && break; sleep 0.02; done
fi
`);
  const provider = new DockerSandboxProvider(bareProfile("work"), {
    docker: docker.program,
    instance: "run-1",
  });
  provider.teardownDetached();
  // The removal has begun and is held by the fake: teardownDetached() did not wait for it.
  await until(
    "docker rm to start",
    async () => (await Deno.stat(`${docker.dir}/rm-started`).then(() => true, () => false)),
  );
  assert.deepEqual(
    await docker.callsStartingWith("volume"),
    [],
    "the volume went before the container was removed",
  );
  await Deno.writeTextFile(`${docker.dir}/release`, "");
  await until(
    "docker volume rm",
    async () => (await docker.callsStartingWith("volume", "rm")).length > 0,
  );
  const calls = await docker.calls();
  assert.deepEqual(calls, [
    ["rm", "--force", "sandbox-work-run-1"],
    ["volume", "rm", "sandbox-work-run-1-workspace"],
  ]);
});
