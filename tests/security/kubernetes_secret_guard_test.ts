/**
 * No secret this process knows enters a pod through the Kubernetes provider: an exec whose
 * environment or argv carries one, and a file whose content does, are refused before any request
 * reaches the API server; the same exec and the same file without it go through. Against the
 * tests' API server (tests/_kube_api.ts), pods as real Docker containers.
 */
import assert from "node:assert/strict";
import { SandboxError } from "../../lib/errors.ts";
import { registerSecret } from "../../lib/secret_guard.ts";
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { assertDocker, dockerTest, profileFrom, tempDir, uniqueProfile } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";

console.error("security: kubernetes secret guard tests starting");

Deno.test({
  name:
    "a known secret in a pod exec's environment or argv, or in a file written into a pod, is refused before the API server sees it; the same without it goes through",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const image = await ensureSandboxImage();
    const previous = Deno.env.get("KUBECONFIG");
    await using kube = new KubeApiServer();
    await using dir = await tempDir("sandbox-kube-guard-");
    await kube.writeKubeconfig(`${dir.path}/kubeconfig`);
    Deno.env.set("KUBECONFIG", `${dir.path}/kubeconfig`);
    const secret = `sk-guard-${crypto.randomUUID().replaceAll("-", "")}`;
    registerSecret(secret, "the test's key");
    try {
      const name = uniqueProfile("sec-kguard");
      const profile = profileFrom(
        `profiles:\n  ${name}:\n    sandbox: {mode: kubernetes, pool: 0, ` +
          `kubernetes: {image: "${image}", pool: own}}\n`,
        name,
      );
      const sandbox = await (await sandboxLifecycle(profile)).acquire({ runId: "guard" });
      const { provider } = sandbox;
      const seen = () => JSON.stringify(kube.execs);
      const refused = async (attempt: Promise<unknown>) => {
        const error = await attempt.then(() => undefined, (e) => e);
        assert.ok(error instanceof SandboxError, `refused: ${error}`);
        assert.equal(error.code, "config_invalid");
        assert.ok(!error.message.includes(secret), "the message never shows the value");
      };
      try {
        await t.step("twin: an exec with a plain variable and argument runs", async () => {
          const result = await provider.exec(["sh", "-c", 'echo "$NOTES $1"', "sh", "plain-arg"], {
            env: { NOTES: "plain-value" },
          });
          assert.equal(result.stdout, "plain-value plain-arg\n");
        });
        await t.step("attack: the secret in the exec's environment is refused", async () => {
          await refused(provider.exec(["true"], { env: { NOTES: secret } }));
          await refused(provider.exec(["echo", `x${secret}`]));
          assert.ok(!seen().includes(secret), "no exec with it reached the API server");
        });
        await t.step("twin: a plain file is written and read back", async () => {
          await provider.writeFile("/tmp/notes.txt", "plain content\n");
          const back = new TextDecoder().decode(await provider.readFile("/tmp/notes.txt"));
          assert.equal(back, "plain content\n");
        });
        await t.step("attack: a file holding the secret is refused", async () => {
          const before = kube.execs.length;
          await refused(provider.writeFile("/tmp/key.txt", `key=${secret}\n`));
          assert.equal(kube.execs.length, before, "no exec was made for it");
        });
      } finally {
        await sandbox.release();
      }
    } finally {
      if (previous === undefined) Deno.env.delete("KUBECONFIG");
      else Deno.env.set("KUBECONFIG", previous);
    }
  },
});
