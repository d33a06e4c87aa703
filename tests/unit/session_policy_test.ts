/** A profile's `llm.server_tools` and `llm.models` reach the credential proxy a session starts. */
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { KeyStore } from "../../lib/keys.ts";
import { startHostProxies } from "../../lib/proxy/session.ts";
import { tempDir } from "../_helpers.ts";
import { FakeUpstream } from "./_fake_upstream.ts";

const KEY_ENV = "SANDBOX_UNIT_SESSION_KEY";

async function proxiesFor(upstream: FakeUpstream, llmYaml: string, dir: string) {
  const result = parseConfig(
    `profiles:\n  work:\n    llm: {provider: custom, api: anthropic, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}, ${llmYaml}}\n`,
    "test.yaml",
    () => undefined,
  );
  assert.equal(result.kind, "ok", JSON.stringify(result));
  if (result.kind !== "ok") throw new Error("unreachable");
  return await startHostProxies(resolveProfile(result.config, "work"), ["127.0.0.1"], {
    keys: new KeyStore({ env: (name) => (name === KEY_ENV ? upstream.key : undefined) }),
    accessLogPath: `${dir}/access.ndjson`,
  });
}

function messages(proxies: { llmUrl(host: string): string; token: string }, body: unknown) {
  return fetch(`${proxies.llmUrl("127.0.0.1")}/messages`, {
    method: "POST",
    headers: { "x-api-key": proxies.token, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

const WEB_FETCH = [{ type: "web_fetch_20250910", name: "web_fetch" }];

Deno.test("startHostProxies() enforces the profile's llm.models and llm.server_tools", async (t) => {
  await using dir = await tempDir();
  await using upstream = new FakeUpstream();

  await t.step("models: another model is refused, a listed one passes", async () => {
    await using proxies = await proxiesFor(upstream, "models: [claude-listed]", dir.path);
    const refused = await messages(proxies, { model: "claude-other", max_tokens: 1, messages: [] });
    const text = await refused.text();
    assert.equal(refused.status, 403, text);
    assert.match(text, /model \\"claude-other\\" is not allowed/);
    assert.equal(upstream.requests.length, 0);
    const allowed = await messages(proxies, {
      model: "claude-listed",
      max_tokens: 1,
      messages: [],
    });
    assert.equal(allowed.status, 200, await allowed.text());
    assert.equal(upstream.requests.length, 1);
  });

  await t.step("server_tools: deny by default, forwarded with allow", async () => {
    const body = { model: "claude", max_tokens: 1, messages: [], tools: WEB_FETCH };
    {
      await using proxies = await proxiesFor(upstream, "model: claude", dir.path);
      const refused = await messages(proxies, body);
      assert.equal(refused.status, 403, await refused.text());
    }
    await using proxies = await proxiesFor(
      upstream,
      "model: claude, server_tools: allow",
      dir.path,
    );
    const allowed = await messages(proxies, body);
    assert.equal(allowed.status, 200, await allowed.text());
    assert.deepEqual(JSON.parse(upstream.requests.at(-1)!.body).tools, WEB_FETCH);
  });
});
