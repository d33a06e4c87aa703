/**
 * `sandbox run agentic --interactive` refuses, before anything starts (no session, no sandbox),
 * what it cannot do: exit 2 and one line naming the problem. (The TUI itself, in a real terminal
 * against the real engine: tests/security/subscription_token_test.ts.)
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
      "",
    ].join("\n"),
  );
  const env = { XDG_STATE_HOME: `${dir.path}/state`, SANDBOX_TEST_KEY: "sk-test-0123456789abcdef" };
  const cases: { name: string; args: string[]; says: RegExp }[] = [
    {
      name: "Codex, whose ChatGPT sign-in cannot stay on the host",
      args: ["--agent", "codex", "-p", "openai", "--detach"],
      says:
        /^sandbox: error: --interactive is not available for agent "codex": .*\nsandbox: {3}Codex keeps its ChatGPT sign-in/m,
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
