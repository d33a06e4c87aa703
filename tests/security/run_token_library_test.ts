/**
 * A run's token dies with the run also for a program that uses the library (`runAgent`) and lives
 * on after it: once `runAgent` has returned, the proxy the run's agent used no longer serves the
 * token the agent saw. Sandbox mode none (the worker on this host) puts the credential proxy on
 * 127.0.0.1, where this test can reach it after the run; the agent captures the URL and token as an
 * attacker would and checks them once while the run lives (the positive control).
 */
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import type { AgenticMessage } from "../../lib/run/protocol.ts";
import { runAgent } from "../../lib/run/run.ts";
import { FAKE_LLM_KEY, FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { tempDir } from "../_helpers.ts";

const KEY_ENV = "SANDBOX_SEC_LIBRARY_KEY";
const DEADLINE_MS = 10_000;

/** The agent's command: prints the URL and the token (base64), and one LLM call's status with them. */
const CAPTURE = [
  `printf 'url=%s\\n' "$SANDBOX_LLM_BASE_URL"`,
  `printf 'captured=%s\\n' "$(printf %s "$SANDBOX_LLM_TOKEN" | base64 -w0)"`,
  `printf 'during=%s\\n' "$(curl -s --noproxy '*' --max-time 60 -o /dev/null -w '%{http_code}' ` +
  `-H "Authorization: Bearer $SANDBOX_LLM_TOKEN" -H 'Content-Type: application/json' ` +
  `--data '{"model":"m","messages":[{"role":"user","content":"hi"}]}' "$SANDBOX_LLM_BASE_URL/chat/completions")"`,
].join("; ");

Deno.test("runAgent: once it returns, the proxy its agent used serves the agent's token no more", async () => {
  await using dir = await tempDir("sandbox-sec-library-");
  await using llm = new FakeLlm([
    toolCall("execute", { command: CAPTURE }),
    text("the control's answer"),
    text("captured"),
  ]);
  const result = parseConfig(
    `profiles:\n  lib:\n    llm: {provider: custom, base_url: "${llm.baseUrl}", key: {env: ${KEY_ENV}}}\n    sandbox: {mode: none}\n`,
    "test.yaml",
    () => undefined,
  );
  assert.equal(result.kind, "ok", JSON.stringify(result));
  if (result.kind !== "ok") throw new Error("unreachable");

  const saved = { state: Deno.env.get("XDG_STATE_HOME") };
  Deno.env.set("XDG_STATE_HOME", `${dir.path}/state`);
  Deno.env.set(KEY_ENV, FAKE_LLM_KEY);
  const messages: AgenticMessage[] = [];
  try {
    const outcome = await runAgent({
      mode: "agentic",
      prompt: "Look around",
      profile: resolveProfile(result.config, "lib"),
      hostCwd: dir.path,
      onEvent: (message) => void messages.push(message),
    });
    const output = messages.find((m) =>
      m.type === "tool_result" && m.tool_name === "execute"
    )?.tool_output ?? "";
    const context = `exit ${outcome.exitCode} ${
      outcome.error?.message ?? ""
    }\n--- agent output\n${output}`;
    assert.equal(outcome.exitCode, 0, context);
    const said = new Map(
      output.split("\n").map((line) => /^([a-z]+)=(.*)$/.exec(line)).filter((m) => m !== null).map((
        m,
      ) => [m[1], m[2]]),
    );
    const url = said.get("url");
    const token = atob(said.get("captured") ?? "");
    assert.match(url ?? "", /^http:\/\/127\.0\.0\.1:\d+\//, context);
    assert.match(token, /^sbx_/, context);
    assert.equal(said.get("during"), "200", `the token did not work during the run\n${context}`);
    const served = llm.completions;

    // After the run, in the same process: the same call with the same token.
    let after: number | "no answer";
    try {
      const response = await fetch(`${url}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
        signal: AbortSignal.timeout(DEADLINE_MS),
      });
      await response.body?.cancel();
      after = response.status;
    } catch (error) {
      if (error instanceof DOMException && error.name === "TimeoutError") throw error;
      after = "no answer";
    }
    assert.ok(
      after === "no answer" || after === 401,
      `the run's proxy still answered ${after} to its token`,
    );
    assert.equal(llm.completions, served, "a request with the dead token reached the LLM");
  } finally {
    if (saved.state === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", saved.state);
    Deno.env.delete(KEY_ENV);
  }
});
