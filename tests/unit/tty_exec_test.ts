import assert from "node:assert/strict";
import { SandboxError } from "../../lib/errors.ts";
import { registerSecret } from "../../lib/secret_guard.ts";
import { startTtyExec } from "../../lib/sandbox/docker_tty.ts";
import { resetEngineSocket } from "../../lib/sandbox/engine_api.ts";

Deno.test("startTtyExec() refuses a key the host holds in the terminal's environment or argv, before the engine is asked", async (t) => {
  const secret = `sk-ant-oat01-${crypto.randomUUID().replaceAll("-", "")}`;
  registerSecret(secret, "the test's subscription token");
  // No engine: a request that got past the guard would fail otherwise, and differently.
  const engine = { DOCKER_HOST: Deno.env.get("DOCKER_HOST") };
  Deno.env.set("DOCKER_HOST", "tcp://127.0.0.1:1");
  resetEngineSocket();
  try {
    const request = {
      container: "sandbox-none",
      argv: ["claude"],
      env: { TERM: "xterm" },
      size: { rows: 24, cols: 80 },
    };
    await t.step("in a variable", async () => {
      const error = await startTtyExec({
        ...request,
        env: { ...request.env, ANTHROPIC_AUTH_TOKEN: secret },
      }).then(() => undefined, (e) => e);
      assert.ok(error instanceof SandboxError, String(error));
      assert.equal(error.code, "config_invalid");
      assert.match(error.message, /ANTHROPIC_AUTH_TOKEN.*the test's subscription token/);
      assert.ok(!error.message.includes(secret));
    });
    await t.step("in argv", async () => {
      const error = await startTtyExec({ ...request, argv: ["claude", secret] })
        .then(() => undefined, (e) => e);
      assert.equal((error as SandboxError).code, "config_invalid");
    });
    await t.step(
      "its twin, without the secret, passes the guard and reaches the engine check",
      async () => {
        const error = await startTtyExec(request).then(() => undefined, (e) => e);
        assert.ok(error instanceof SandboxError, String(error));
        assert.equal(error.code, "unsupported");
      },
    );
  } finally {
    if (engine.DOCKER_HOST === undefined) Deno.env.delete("DOCKER_HOST");
    else Deno.env.set("DOCKER_HOST", engine.DOCKER_HOST);
    resetEngineSocket();
  }
});
