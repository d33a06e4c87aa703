/**
 * `sandbox run agentic --interactive` refuses, before anything starts (no session, no sandbox),
 * what it cannot do: exit 2 and one line naming the problem. (The TUIs themselves, in a real
 * terminal against the real engine: tests/security/subscription_token_test.ts,
 * tests/security/codex_tui_key_test.ts.)
 */
import assert from "node:assert/strict";
import { explain, runCli, tempDir, writeConfig } from "../_helpers.ts";

Deno.test("run agentic --interactive refuses what it cannot do, before anything starts", async (t) => {
  await using dir = await tempDir();
  const config = await writeConfig(
    dir.path,
    [
      "profiles:",
      "  claude:",
      '    llm: {provider: custom, api: anthropic, base_url: "http://127.0.0.1:9/v1", key: {env: SANDBOX_TEST_NO_SUCH_TOKEN}, model: m}',
      "  openai:",
      '    llm: {provider: custom, api: openai, base_url: "http://127.0.0.1:9/v1", key: {env: SANDBOX_TEST_KEY}, model: m}',
      "  chatgpt:",
      '    llm: {provider: custom, api: openai, base_url: "http://127.0.0.1:9/v1", key: {env: SANDBOX_TEST_CHATGPT_TOKEN}, model: m}',
      "",
    ].join("\n"),
  );
  // A ChatGPT sign-in's access token, as `codex login` keeps it in auth.json (a JWT from auth.openai.com).
  const claims = btoa(JSON.stringify({ iss: "https://auth.openai.com", exp: 4102444800 }))
    .replace(/=+$/, "");
  const env = {
    XDG_STATE_HOME: `${dir.path}/state`,
    SANDBOX_TEST_KEY: "sk-test-0123456789abcdef",
    SANDBOX_TEST_CHATGPT_TOKEN: `eyJhbGciOiJSUzI1NiJ9.${claims}.c2ln`,
  };
  const cases: { name: string; args: string[]; says: RegExp }[] = [
    {
      name: "Codex with a ChatGPT sign-in, which cannot stay on the host",
      args: ["--agent", "codex", "-p", "chatgpt", "--detach"],
      says:
        /^sandbox: error: --interactive --agent codex cannot use a ChatGPT sign-in: profile "chatgpt": its key is a ChatGPT sign-in's access token .*\nsandbox: {3}Codex refreshes its ChatGPT sign-in itself/m,
    },
    {
      name: "Codex against a provider of another API",
      args: ["--agent", "codex", "-p", "claude", "--detach"],
      says: /^sandbox: error: Agent "codex" speaks the OpenAI Responses API/m,
    },
    {
      name: "the built-in worker, which has no terminal UI",
      args: ["-p", "claude", "--detach"],
      says: /^sandbox: error: --interactive needs an agent CLI: --agent claude-code/m,
    },
    {
      name: "a headless run's flags",
      args: ["--agent", "claude-code", "--prompt-file", "p.txt", "--format", "ndjson"],
      says:
        /^sandbox: error: --interactive does not take --prompt-file, --format: type the prompt/m,
    },
    {
      name: "stdin that is not a terminal, without --detach",
      args: ["--agent", "claude-code", "-p", "claude"],
      says:
        /^sandbox: error: sandbox run agentic --interactive needs a terminal: stdin is not one$/m,
    },
    {
      name: "a profile whose provider speaks another API",
      args: ["--agent", "claude-code", "-p", "openai", "--detach"],
      says: /^sandbox: error: Agent "claude-code" speaks the Anthropic Messages API/m,
    },
    {
      name: "a key (or subscription token) the host cannot read",
      args: ["--agent", "claude-code", "-p", "claude", "--detach"],
      says:
        /^sandbox: error: Cannot start profile "claude": .*"SANDBOX_TEST_NO_SUCH_TOKEN" is not set/m,
    },
  ];
  for (const { name, args, says } of cases) {
    await t.step(name, async () => {
      const result = await runCli(["run", "agentic", "--interactive", ...args], {
        env,
        config,
        stdin: "",
      });
      assert.equal(result.exitCode, 2, explain(result));
      assert.match(result.stderr, says, explain(result));
      assert.equal(result.stdout, "", "no session id was printed");
    });
  }
  await assert.rejects(Deno.stat(`${dir.path}/state/sandbox/sessions`), Deno.errors.NotFound);
});
