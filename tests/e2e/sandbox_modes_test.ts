/**
 * The commands on a profile's own sandbox (`stop`, `start`, `cp`, `snapshot`) in the modes that
 * have none (local, kubernetes: their sandboxes live for one run): a usage error naming the mode,
 * before anything asks Docker, beside its twin, the same command on a mode container profile,
 * which does reach Docker.
 */
import assert from "node:assert/strict";
import { runCli, tempDir, uniqueProfile, writeConfig } from "../_helpers.ts";
import type { RunResult } from "../../lib/process.ts";
import { fakeDocker } from "../unit/_fake_docker.ts";

console.error("e2e: sandbox modes starting");

function explain(result: RunResult): string {
  return `exit ${result.exitCode}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`;
}

Deno.test({
  name:
    "stop, start, cp and snapshot of a profile in mode local or kubernetes exit 2 naming the mode, and never ask Docker",
  async fn(t) {
    await using dir = await tempDir("sandbox-e2e-modes-");
    const d = dir.path;
    // A docker that records every call: a refused command must not have asked it anything.
    await using docker = await fakeDocker(`echo "fake docker: not expected" >&2; exit 1`);
    const local = uniqueProfile("e2e-modes-local");
    const cluster = uniqueProfile("e2e-modes-kube");
    const config = await writeConfig(
      d,
      `profiles:\n  ${local}:\n    sandbox: {mode: local}\n` +
        `  ${cluster}:\n    sandbox: {mode: kubernetes, kubernetes: {image: "registry.invalid/sandbox:1"}}\n`,
    );
    await Deno.writeTextFile(`${d}/file.txt`, "x\n");
    const env = {
      XDG_STATE_HOME: `${d}/state`,
      PATH: `${docker.dir}:${Deno.env.get("PATH")}`,
      // The CLI's engine, so that nothing goes to the engine's socket in its stead.
      DOCKER_HOST: "tcp://127.0.0.1:1",
    };
    for (const [profile, mode] of [[local, "local"], [cluster, "kubernetes"]]) {
      for (
        const args of [
          ["stop", "-p", profile],
          ["start", "-p", profile],
          ["cp", "-p", profile, `${d}/file.txt`, ":file.txt"],
          ["snapshot", "-p", profile],
        ]
      ) {
        await t.step(`${args[0]} in mode ${mode}`, async () => {
          const result = await runCli(args, { config, env, timeoutMs: 60_000 });
          const context = explain(result);
          assert.equal(result.exitCode, 2, context);
          assert.equal(result.stdout, "", context);
          const lines = result.stderr.trimEnd().split("\n");
          assert.match(
            lines[0],
            new RegExp(`^sandbox: error: Profile "${profile}" uses sandbox mode "${mode}": `),
            context,
          );
          assert.equal(
            lines.filter((line) => line.startsWith("sandbox: error:")).length,
            1,
            context,
          );
          assert.ok(!/^\s+at |file:\/\//m.test(result.stderr), `a stack trace\n${context}`);
        });
      }
    }
    assert.deepEqual(await docker.calls(), [], "a refused command asked docker");
  },
});

Deno.test({
  name: "stop of a profile in mode container asks Docker for its sandbox (the refusal's twin)",
  async fn() {
    await using dir = await tempDir("sandbox-e2e-modes-twin-");
    await using docker = await fakeDocker(`echo "fake docker: no engine here" >&2; exit 1`);
    const profile = uniqueProfile("e2e-modes-container");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
    const result = await runCli(["stop", "-p", profile], {
      config,
      env: {
        XDG_STATE_HOME: `${dir.path}/state`,
        PATH: `${docker.dir}:${Deno.env.get("PATH")}`,
        DOCKER_HOST: "tcp://127.0.0.1:1",
      },
      timeoutMs: 60_000,
    });
    const context = explain(result);
    assert.ok(!result.stderr.includes("uses sandbox mode"), context);
    assert.ok(
      (await docker.calls()).some((argv) => argv.includes(`sandbox-${profile}`)),
      `docker was not asked about sandbox-${profile}\n${context}`,
    );
  },
});
