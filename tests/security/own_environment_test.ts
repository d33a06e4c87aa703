/**
 * Attack: steer our own programs in the sandbox through the environment the container gives every
 * process (a devcontainer's image or containerEnv, a profile's sandbox.environment): interpreters
 * read it before our first line runs. The exec wrapper starts the worker and the relay from an
 * environment it builds (scripts/sandbox-exec, own_environment); the agent's own commands keep
 * the container's (the twin).
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { DockerSandboxProvider, SANDBOX_USER } from "../../lib/sandbox/docker_provider.ts";
import {
  assertDocker,
  dockerTest,
  profileFrom,
  removeProfile,
  uniqueProfile,
} from "../_helpers.ts";

console.error("security: own environment tests starting");

/** A V8 flag that makes any Deno program die at start (it cannot even load its snapshot). */
const DEADLY = "DENO_V8_FLAGS=--max-old-space-size=1";

Deno.test({
  name:
    "the container's DENO_V8_FLAGS cannot reach the relay or the worker, while the agent's own commands see it",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const name = uniqueProfile("sec-ownenv");
    const provider = new DockerSandboxProvider(profileFrom(`profiles:\n  ${name}: {}\n`, name));
    try {
      await provider.ensureRunning();
      const inSandbox = (id: string, ...argv: string[]) =>
        run([
          "docker",
          "exec",
          "--user",
          SANDBOX_USER,
          "--env",
          DEADLY,
          provider.containerName,
          "sandbox-exec",
          id,
          ...argv,
        ], { timeoutMs: 60_000 });
      await t.step("the relay and the worker start as if it were not there", async () => {
        const relay = await inSandbox(
          "own-relay",
          "deno",
          "run",
          "--no-config",
          "-A",
          "/opt/sandbox/relay.js",
          "--check",
        );
        assert.equal(relay.exitCode, 0, relay.stderr);
        const worker = await inSandbox(
          "own-worker",
          "deno",
          "run",
          "--no-config",
          "-A",
          "/opt/sandbox/worker.js",
          "--help",
        );
        assert.equal(worker.exitCode, 0, worker.stderr);
      });
      await t.step(
        "twin: the agent's commands have it, and a Deno program of the agent's dies of it",
        async () => {
          const seen = await inSandbox("agent-sh", "sh", "-c", "echo $DENO_V8_FLAGS");
          assert.equal(seen.stdout, "--max-old-space-size=1\n");
          const own = await inSandbox(
            "agent-deno",
            "deno",
            "eval",
            "--no-config",
            "console.log(1)",
          );
          assert.notEqual(own.exitCode, 0, "the flag is deadly to a program that reads it");
        },
      );
    } finally {
      await removeProfile(name);
    }
  },
});
