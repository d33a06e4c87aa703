/**
 * Sandbox mode none runs commands on the host, but not with the host's environment: a command gets
 * PATH, HOME, LANG, TERM, TMPDIR and what the caller passes (the proxy URLs and token), so a key
 * in the `sandbox` process's own environment never reaches the worker or its tools.
 */
import assert from "node:assert/strict";
import { HostProvider } from "../../lib/sandbox/host_provider.ts";

/** `env` output as a map. */
function parseEnv(text: string): Map<string, string> {
  const vars = new Map<string, string>();
  for (const line of text.split("\n")) {
    const eq = line.indexOf("=");
    if (eq > 0) vars.set(line.slice(0, eq), line.slice(eq + 1));
  }
  return vars;
}

Deno.test("HostProvider: a host variable holding a key is absent from the command's environment, the caller's variables present", async (t) => {
  // A value no guard knows as a secret: only the cleared environment keeps it out.
  const value = `host-only-${crypto.randomUUID()}`;
  Deno.env.set("SANDBOX_UNIT_HOST_API_KEY", value);
  try {
    const host = new HostProvider("work");
    const env = { SANDBOX_LLM_TOKEN: "sbx_session_token_for_the_test" };

    await t.step("exec()", async () => {
      const result = await host.exec(["env"], { env });
      assert.equal(result.exitCode, 0, result.stderr);
      const vars = parseEnv(result.stdout);
      assert.equal(vars.get("SANDBOX_LLM_TOKEN"), "sbx_session_token_for_the_test", result.stdout);
      assert.equal(vars.get("PATH"), Deno.env.get("PATH"));
      assert.ok(
        !result.stdout.includes(value),
        `the host's key reached the command:\n${result.stdout}`,
      );
    });

    await t.step("execStream()", async () => {
      const lines: string[] = [];
      const stream = host.execStream(["env"], { env });
      for await (const line of stream) lines.push(line);
      assert.equal((await stream.outcome).exitCode, 0);
      const vars = parseEnv(lines.join("\n"));
      assert.equal(vars.get("SANDBOX_LLM_TOKEN"), "sbx_session_token_for_the_test");
      assert.ok(
        !lines.join("\n").includes(value),
        `the host's key reached the command:\n${lines.join("\n")}`,
      );
    });
  } finally {
    Deno.env.delete("SANDBOX_UNIT_HOST_API_KEY");
  }
});
