/**
 * The docker calls made through the engine's socket (lib/sandbox/engine_api.ts) against a real
 * engine, each beside the same call made by the docker CLI (SANDBOX_DOCKER_API=0): the same
 * output, errors and exit codes either way.
 */
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import { engineSocket, resetEngineSocket } from "../../lib/sandbox/engine_api.ts";
import { SandboxError } from "../../lib/errors.ts";
import { assertDocker, dockerTest, removeProfile, uniqueProfile } from "../_helpers.ts";

console.error("integration: engine API tests starting");

function profileNamed(name: string) {
  const result = parseConfig(`profiles:\n  ${name}: {}\n`, undefined, () => undefined);
  if (result.kind !== "ok") throw new Error(JSON.stringify(result.issues));
  return resolveProfile(result.config, name);
}

/** `fn` once through the engine's socket and once through the CLI; both results. */
async function bothWays<T>(fn: () => Promise<T>): Promise<{ api: T; cli: T }> {
  const saved = Deno.env.get("SANDBOX_DOCKER_API");
  try {
    Deno.env.delete("SANDBOX_DOCKER_API");
    resetEngineSocket();
    const api = await fn();
    Deno.env.set("SANDBOX_DOCKER_API", "0");
    resetEngineSocket();
    assert.equal(engineSocket(), undefined);
    const cli = await fn();
    return { api, cli };
  } finally {
    if (saved === undefined) Deno.env.delete("SANDBOX_DOCKER_API");
    else Deno.env.set("SANDBOX_DOCKER_API", saved);
    resetEngineSocket();
  }
}

Deno.test({
  name:
    "execs and inspects through the engine's socket answer as the docker CLI does, on a real engine",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const name = uniqueProfile("it-engine");
    const provider = new DockerSandboxProvider(profileNamed(name));
    try {
      await provider.ensureRunning();
      if (!Deno.env.get("DOCKER_HOST")) {
        // This machine's engine is the CLI's default one: the socket is what the tool uses.
        resetEngineSocket();
        assert.ok(
          engineSocket(),
          "the engine's socket is not used on a machine where the CLI reaches the default engine",
        );
      }

      await t.step("a command's stdout, stderr and exit code", async () => {
        const { api, cli } = await bothWays(() =>
          provider.exec(["sh", "-c", "echo out; echo err >&2; exit 7"])
        );
        for (const result of [api, cli]) {
          assert.equal(result.exitCode, 7);
          assert.equal(result.stdout, "out\n");
          assert.equal(result.stderr.trim(), "err");
        }
      });

      await t.step(
        "input, to its end, and variables by name (their values on no command line)",
        async () => {
          const { api, cli } = await bothWays(() =>
            provider.exec(["sh", "-c", 'cat; echo "|$GREETING|"'], {
              stdin: "line one\nline two\n",
              env: { GREETING: "hello there" },
            })
          );
          for (const result of [api, cli]) {
            assert.equal(result.exitCode, 0, result.stderr);
            assert.equal(result.stdout, "line one\nline two\n|hello there|\n");
          }
        },
      );

      await t.step(
        "a streamed command's lines as they come, with its working directory and user",
        async () => {
          const { api, cli } = await bothWays(async () => {
            const lines: string[] = [];
            const stream = provider.execStream(["sh", "-c", "pwd; id -u; echo done"], {
              cwd: "/tmp",
            });
            for await (const line of stream) lines.push(line);
            return { lines, outcome: await stream.outcome };
          });
          for (const result of [api, cli]) {
            assert.deepEqual(result.lines, ["/tmp", "10001", "done"]);
            assert.equal(result.outcome.exitCode, 0);
          }
        },
      );

      await t.step("the container's and the workspace volume's inspection", async () => {
        const { api, cli } = await bothWays(async () => ({
          status: await provider.status(),
          quota: await provider.workspaceQuota(),
        }));
        assert.deepEqual(api, cli);
        assert.equal(api.status.state, "running");
      });

      await t.step("a container that does not exist: the same error", async () => {
        const missing = new DockerSandboxProvider(profileNamed(uniqueProfile("it-engine-missing")));
        const { api, cli } = await bothWays(async () => {
          const status = await missing.status();
          const error = await missing.exec(["true"]).then(() => undefined, (e) => e);
          return {
            state: status.state,
            code: error instanceof SandboxError ? error.code : String(error),
          };
        });
        assert.deepEqual(api, { state: "missing", code: "container_not_found" });
        assert.deepEqual(cli, api);
      });
    } finally {
      await removeProfile(name);
    }
  },
});
