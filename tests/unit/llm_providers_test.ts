import assert from "node:assert/strict";
import { type LlmConfig, parseConfig, resolveProfile } from "../../lib/config.ts";
import { KeyStore } from "../../lib/keys.ts";
import {
  authFor,
  keySourceFor,
  llmTarget,
  OAUTH_TOKEN_ENV,
} from "../../lib/proxy/llm_providers.ts";

const noEnv = () => undefined;

function llmOf(yaml: string): LlmConfig {
  const result = parseConfig(`profiles:\n  work:\n    llm: ${yaml}\n`, "test.yaml", noEnv);
  assert.equal(result.kind, "ok", JSON.stringify(result));
  return resolveProfile(result.kind === "ok" ? result.config : { profiles: {} }, "work").llm;
}

function issuesOf(yaml: string): string[] {
  const result = parseConfig(`profiles:\n  work:\n    llm: ${yaml}\n`, "test.yaml", noEnv);
  assert.equal(result.kind, "invalid", `expected invalid: ${yaml}`);
  return result.kind === "invalid" ? result.issues.map((i) => `${i.path}: ${i.message}`) : [];
}

Deno.test("llm.server_tools defaults to deny and takes only deny or allow", () => {
  const keys = new KeyStore({ env: noEnv });
  assert.equal(llmOf("{}").server_tools, "deny");
  assert.deepEqual(llmTarget(llmOf("{}"), keys).policy, { serverTools: "deny", models: undefined });
  assert.deepEqual(llmTarget(llmOf("{server_tools: allow}"), keys).policy.serverTools, "allow");
  assert.deepEqual(issuesOf("{server_tools: yes}"), [
    'profiles.work.llm.server_tools: expected one of "deny", "allow"',
  ]);
});

Deno.test("llm.models lists the allowed models, holds the chosen model, and gives the default", () => {
  const keys = new KeyStore({ env: noEnv });
  const target = llmTarget(llmOf("{models: [gpt-4.1-mini, gpt-4.1]}"), keys);
  assert.deepEqual(target.policy.models, ["gpt-4.1-mini", "gpt-4.1"]);
  // With no model named, the first allowed one is used rather than the provider's default.
  assert.equal(
    llmTarget(llmOf("{provider: anthropic, models: [claude-haiku-4-5]}"), keys).model,
    "claude-haiku-4-5",
  );
  assert.equal(
    llmTarget(llmOf("{model: gpt-4.1, models: [gpt-4.1-mini, gpt-4.1]}"), keys).model,
    "gpt-4.1",
  );
  assert.deepEqual(issuesOf("{model: gpt-5, models: [gpt-4.1]}"), [
    'profiles.work.llm.model: "gpt-5" is not one of llm.models',
  ]);
  assert.deepEqual(issuesOf("{models: []}"), [
    "profiles.work.llm.models: expected at least one model",
  ]);
});

Deno.test("a Claude subscription token is a key source of its own, presented as OAuth", () => {
  const env = (vars: Record<string, string>) => (name: string) => vars[name];
  const anthropic = llmOf("{provider: anthropic}");
  assert.deepEqual(keySourceFor(anthropic, env({ ANTHROPIC_API_KEY: "sk-ant-api" })), {
    env: "ANTHROPIC_API_KEY",
  });
  assert.deepEqual(keySourceFor(anthropic, env({ CLAUDE_CODE_OAUTH_TOKEN: "sk-ant-oat" })), {
    env: OAUTH_TOKEN_ENV,
  });
  // The API key wins when both are set; without either, the error names ANTHROPIC_API_KEY.
  assert.deepEqual(
    keySourceFor(anthropic, env({ ANTHROPIC_API_KEY: "a", CLAUDE_CODE_OAUTH_TOKEN: "b" })),
    { env: "ANTHROPIC_API_KEY" },
  );
  assert.deepEqual(keySourceFor(anthropic, env({})), { env: "ANTHROPIC_API_KEY" });
  // Only Anthropic's provider falls back to it.
  assert.deepEqual(keySourceFor(llmOf("{}"), env({ CLAUDE_CODE_OAUTH_TOKEN: "b" })), {
    env: "OPENAI_API_KEY",
  });
  assert.equal(authFor({ env: OAUTH_TOKEN_ENV }), "oauth");
  assert.equal(authFor({ env: "ANTHROPIC_API_KEY" }), undefined);
  assert.equal(authFor({ command: ["pass", "claude"] }), undefined);
  const custom = llmOf(
    '{provider: custom, api: anthropic, base_url: "http://127.0.0.1:9/v1", key: {env: CLAUDE_CODE_OAUTH_TOKEN}}',
  );
  assert.equal(llmTarget(custom, new KeyStore({ env: noEnv })).upstream.auth, "oauth");
});
