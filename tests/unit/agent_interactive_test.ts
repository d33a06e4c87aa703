/**
 * How an agent CLI's TUI is started in a session: Claude Code with permission prompts off, its
 * own traffic off, the session token as its only credential (never as ANTHROPIC_API_KEY, which the
 * TUI would ask about), its first-start screens answered by files in its home, the repository's
 * configuration kept out unless trusted; Codex as a headless run is started, but in its TUI, and
 * refused with a ChatGPT sign-in, saying why.
 */
import assert from "node:assert/strict";
import {
  chatGptSignIn,
  checkCodexSignIn,
  INTERACTIVE_HIDDEN_ENV,
  interactiveLaunch,
} from "../../lib/agents/interactive.ts";
import {
  agentProgram,
  CODEX_HOME,
  codexConfig,
  codexProfileName,
} from "../../lib/agents/launch.ts";
import { SandboxError } from "../../lib/errors.ts";

const TOKEN = "sbx_session-token-0123456789abcdef";
const SESSION_ENV = {
  SANDBOX_LLM_TOKEN: TOKEN,
  SANDBOX_LLM_MODEL: "claude-sonnet-4-5",
  ANTHROPIC_BASE_URL: "http://127.0.0.1:41000/proxy",
  ANTHROPIC_API_KEY: TOKEN,
  OPENAI_BASE_URL: "http://127.0.0.1:41000/proxy/v1",
  OPENAI_API_KEY: TOKEN,
};
const CWD = "/workspace/worktrees/20261127-000000-abcdef";

Deno.test("Claude Code's TUI starts with permission prompts off and the session token as its only credential", () => {
  const launch = interactiveLaunch("claude-code", { env: SESSION_ENV, runId: "s-1", cwd: CWD });
  assert.deepEqual(launch.argv, [
    agentProgram("claude-code"),
    "--dangerously-skip-permissions",
    "--model",
    "claude-sonnet-4-5",
    "--setting-sources",
    "user",
    "--strict-mcp-config",
  ]);
  assert.ok(!launch.argv.includes("--print"), "the TUI, not print mode");
  assert.equal(launch.env.ANTHROPIC_AUTH_TOKEN, TOKEN);
  assert.equal(launch.env.CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, "1");
  assert.deepEqual(INTERACTIVE_HIDDEN_ENV["claude-code"], ["ANTHROPIC_API_KEY"]);
  const files = Object.fromEntries(launch.files.map((f) => [f.path, JSON.parse(f.content)]));
  assert.deepEqual(files["/home/sandbox/.claude.json"], {
    hasCompletedOnboarding: true,
    projects: { [CWD]: { hasTrustDialogAccepted: true } },
  });
  assert.deepEqual(files["/home/sandbox/.claude/settings.json"], {
    skipDangerousModePermissionPrompt: true,
  });
  for (const file of launch.files) assert.ok(!file.content.includes(TOKEN), file.path);
});

Deno.test("Claude Code's TUI reads the repository's configuration only when trusted, and the model given", () => {
  const launch = interactiveLaunch("claude-code", {
    env: SESSION_ENV,
    runId: "s-1",
    cwd: CWD,
    model: "claude-opus-4",
    trustedConfig: [".claude", ".mcp.json"],
  });
  assert.deepEqual(launch.argv.slice(1), [
    "--dangerously-skip-permissions",
    "--model",
    "claude-opus-4",
  ]);
});

Deno.test("Codex's TUI starts as a headless run does, without exec: approvals and its own sandbox off, the proxy its only provider, the project untrusted", () => {
  const launch = interactiveLaunch("codex", {
    env: SESSION_ENV,
    runId: "s-1",
    cwd: CWD,
    model: "gpt-5.5",
  });
  const profile = codexProfileName("s-1");
  assert.deepEqual(launch.argv, [
    agentProgram("codex"),
    "--dangerously-bypass-approvals-and-sandbox",
    "--profile",
    profile,
    "--model",
    "gpt-5.5",
    "-c",
    `projects={"${CWD}"={trust_level="untrusted"}}`,
  ]);
  assert.ok(!launch.argv.includes("exec"), "the TUI, not exec");
  assert.deepEqual(launch.env, { CODEX_HOME });
  assert.deepEqual(launch.files, [{
    path: `${CODEX_HOME}/${profile}.config.toml`,
    content: codexConfig({ env: SESSION_ENV, runId: "s-1" }),
  }]);
  assert.match(launch.files[0].content, /env_key = "SANDBOX_LLM_TOKEN"/);
  assert.ok(!launch.files[0].content.includes(TOKEN), "the config names the token's variable");
  assert.deepEqual(INTERACTIVE_HIDDEN_ENV.codex, []);
  const trusted = interactiveLaunch("codex", {
    env: SESSION_ENV,
    runId: "s-1",
    cwd: CWD,
    model: "gpt-5.5",
    trustedConfig: [".codex"],
  });
  assert.deepEqual(trusted.argv.slice(-3), [
    "-c",
    `projects={"${CWD}"={trust_level="trusted"}}`,
    "--dangerously-bypass-hook-trust",
  ]);
});

/** A JWT with these claims (unsigned: only its claims are read). */
function jwt(claims: Record<string, unknown>): string {
  const part = (value: unknown) =>
    btoa(JSON.stringify(value)).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
  return `${part({ alg: "RS256" })}.${part(claims)}.c2ln`;
}

Deno.test("Codex's TUI is refused with a ChatGPT sign-in, as a usage error that says why, and taken with an API key", async (t) => {
  const API = "https://api.openai.com/v1";
  const signIns: [string, string, string, RegExp][] = [
    ["ChatGPT's backend", "https://chatgpt.com/backend-api/codex", "sk-x", /ChatGPT's backend/],
    [
      "Codex's auth.json",
      API,
      JSON.stringify({ auth_mode: "chatgpt", tokens: { access_token: "a" } }),
      /auth\.json/,
    ],
    [
      "a sign-in's access token",
      API,
      jwt({ iss: "https://auth.openai.com", "https://api.openai.com/auth": {} }),
      /access token/,
    ],
  ];
  for (const [name, baseUrl, key, says] of signIns) {
    await t.step(name, () => {
      assert.throws(() => checkCodexSignIn("p", baseUrl, key), (error) => {
        assert.ok(error instanceof SandboxError);
        assert.equal(error.code, "usage");
        assert.match(error.message, /^--interactive --agent codex cannot use a ChatGPT sign-in/);
        assert.match(error.message, says);
        assert.ok(!error.message.includes(key), "the key is not shown");
        assert.match(error.detail ?? "", /cannot stay outside the sandbox; use an OpenAI API key/);
        return true;
      });
    });
  }
  await t.step("an API key, or another issuer's token, is not a sign-in", () => {
    assert.equal(chatGptSignIn(API, "sk-proj-0123456789abcdef"), undefined);
    assert.equal(chatGptSignIn("http://127.0.0.1:9/v1", "sk-x"), undefined);
    assert.equal(
      chatGptSignIn(API, jwt({ iss: "https://login.microsoftonline.com/t/v2.0" })),
      undefined,
    );
    assert.equal(chatGptSignIn(API, "a.b.c"), undefined);
    checkCodexSignIn("p", API, "sk-proj-0123456789abcdef");
  });
});
