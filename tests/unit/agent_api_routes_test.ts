/**
 * The APIs the agent CLIs speak, through the credential proxy and in recordings: the OpenAI
 * Responses API (Codex) and Anthropic token counting (Claude Code) are forwarded with the real key
 * under the same token rules as the other routes; `--record` writes Responses API answers as a
 * recording of their own kind, and a replay serves each kind only to its own API.
 */
import assert from "node:assert/strict";
import {
  startCredentialProxy,
  TokenRegistry,
  type UpstreamProvider,
} from "../../lib/proxy/credential_proxy.ts";
import {
  loadRecording,
  type Recording,
  startRecorder,
  startReplayUpstream,
} from "../../lib/run/replay.ts";
import { recordingProblems } from "../../lib/run/recording_check.ts";
import { tempDir } from "../_helpers.ts";
import type { LlmPolicy } from "../../lib/proxy/llm_policy.ts";

const REAL_KEY = "sk-real-agent-routes-0123456789";

interface Seen {
  path: string;
  headers: Headers;
  body: string;
}

/** An upstream on 127.0.0.1 answering every POST with `answer(path)`; it records what it got. */
function upstream(answer: (path: string) => Response) {
  const seen: Seen[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const url = new URL(req.url);
    seen.push({ path: url.pathname + url.search, headers: req.headers, body: await req.text() });
    return answer(url.pathname);
  });
  return {
    seen,
    baseUrl: `http://127.0.0.1:${server.addr.port}/v1`,
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

/** Responses API SSE as Codex receives it. */
function responsesSse(text: string): string {
  const item = {
    type: "message",
    id: "msg_1",
    role: "assistant",
    status: "completed",
    content: [{ type: "output_text", text, annotations: [] }],
  };
  return [
    { type: "response.created", response: { id: "resp_1", status: "in_progress", output: [] } },
    {
      type: "response.output_item.added",
      output_index: 0,
      item: { ...item, status: "in_progress" },
    },
    { type: "response.output_item.done", output_index: 0, item },
    {
      type: "response.completed",
      response: {
        id: "resp_1",
        status: "completed",
        output: [item],
        usage: { input_tokens: 5, output_tokens: 2, total_tokens: 7 },
      },
    },
  ].map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join("");
}

async function proxyFor(provider: UpstreamProvider, policy?: LlmPolicy) {
  const tokens = new TokenRegistry();
  const token = tokens.issue({ profile: "work", runId: "run-1", provider, policy });
  const proxy = await startCredentialProxy({ hostnames: ["127.0.0.1"], tokens });
  return { proxy, token, url: (path: string) => proxy.url("127.0.0.1") + path };
}

Deno.test("The credential proxy forwards the Responses API, streamed, with the real key in place of the token", async () => {
  await using up = upstream(() =>
    new Response(responsesSse("hi"), { headers: { "content-type": "text/event-stream" } })
  );
  const { proxy, token, url } = await proxyFor({
    name: "fake",
    kind: "openai",
    baseUrl: up.baseUrl,
    key: () => Promise.resolve(REAL_KEY),
  });
  await using _ = proxy;
  const response = await fetch(url("/responses"), {
    method: "POST",
    headers: {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
      accept: "text/event-stream",
    },
    body: JSON.stringify({ model: "gpt-5.5", stream: true, input: "hi" }),
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get("content-type"), "text/event-stream");
  assert.equal(await response.text(), responsesSse("hi"));
  assert.equal(up.seen.length, 1);
  assert.equal(up.seen[0].path, "/v1/responses");
  assert.equal(up.seen[0].headers.get("authorization"), `Bearer ${REAL_KEY}`);
  assert.ok(
    ![...up.seen[0].headers.values()].some((v) => v.includes(token)),
    "the token never reaches the upstream",
  );

  // Its twin without a token: refused, and nothing reaches the upstream.
  const refused = await fetch(url("/responses"), {
    method: "POST",
    body: JSON.stringify({ model: "gpt-5.5", input: "hi" }),
  });
  assert.equal(refused.status, 401);
  await refused.body?.cancel();
  assert.equal(up.seen.length, 1);
});

Deno.test("The credential proxy forwards Anthropic token counting with x-api-key, and no other sub-path of /messages", async () => {
  await using up = upstream(() => Response.json({ input_tokens: 42 }));
  const { proxy, token, url } = await proxyFor({
    name: "fake",
    kind: "anthropic",
    baseUrl: up.baseUrl,
    key: () => Promise.resolve(REAL_KEY),
  });
  await using _ = proxy;
  const counted = await fetch(url("/messages/count_tokens?beta=true"), {
    method: "POST",
    headers: { "x-api-key": token, "content-type": "application/json" },
    body: JSON.stringify({
      model: "claude-sonnet-4-5",
      messages: [{ role: "user", content: "hi" }],
    }),
  });
  assert.deepEqual(await counted.json(), { input_tokens: 42 });
  assert.equal(up.seen[0].path, "/v1/messages/count_tokens?beta=true");
  assert.equal(up.seen[0].headers.get("x-api-key"), REAL_KEY);
  const other = await fetch(url("/messages/batches"), {
    method: "POST",
    headers: { "x-api-key": token },
    body: "{}",
  });
  assert.equal(other.status, 404);
  await other.body?.cancel();
  assert.equal(up.seen.length, 1, "an unlisted sub-path never reaches the upstream");
});

Deno.test("--record writes Responses API answers as an openai-responses recording, without token counts", async () => {
  await using dir = await tempDir("sandbox-record-");
  await using up = upstream((path) =>
    path.endsWith("/responses")
      ? new Response(responsesSse(`answer ${path}`), {
        headers: { "content-type": "text/event-stream" },
      })
      : Response.json({ input_tokens: 9 })
  );
  const file = `${dir.path}/codex.json`;
  const recorder = startRecorder({
    name: "fake",
    kind: "openai",
    baseUrl: up.baseUrl,
    key: () => Promise.resolve(REAL_KEY),
  }, file);
  for (const path of ["/responses", "/messages/count_tokens", "/responses"]) {
    const response = await fetch(`${recorder.upstream.baseUrl}${path}`, {
      method: "POST",
      body: JSON.stringify({ stream: true }),
    });
    await response.text();
  }
  await recorder.close();
  const recording = await loadRecording(file);
  assert.equal(recording.kind, "openai-responses");
  assert.equal(recording.responses.length, 2, "the token count is not an answer of the model");
  assert.deepEqual(recording.responses[0], {
    status: 200,
    sse: responsesSse("answer /v1/responses"),
  });
});

Deno.test("A replay serves each kind of recording only to its own API, and estimates token counts without using an answer", async (t) => {
  const recording: Recording = {
    version: 1,
    kind: "openai-responses",
    responses: [{ status: 200, sse: responsesSse("one") }, {
      status: 200,
      sse: responsesSse("two"),
    }],
  };
  await using replay = startReplayUpstream(recording);
  assert.equal(
    replay.upstream.kind,
    "openai",
    "a Responses recording stands in for an OpenAI-style upstream",
  );
  const post = (path: string, body = JSON.stringify({ stream: true })) =>
    fetch(`${replay.upstream.baseUrl}${path}`, { method: "POST", body });
  await t.step("Responses calls get the recorded streams in order", async () => {
    const first = await post("/responses");
    assert.equal(first.headers.get("content-type"), "text/event-stream");
    assert.equal(await first.text(), responsesSse("one"));
  });
  await t.step("a Chat Completions call is refused with a 400 naming the mismatch", async () => {
    const wrong = await post("/chat/completions");
    assert.equal(wrong.status, 400);
    const body = await wrong.json();
    assert.equal(body.error.type, "replay_mismatch");
    assert.match(
      body.error.message,
      /holds OpenAI Responses API answers; the agent called \/v1\/chat\/completions/,
    );
  });
  await t.step("a token count is estimated and uses no recorded answer", async () => {
    const counted = await post("/messages/count_tokens", "x".repeat(400));
    assert.deepEqual(await counted.json(), { input_tokens: 100 });
    assert.equal(
      await (await post("/responses")).text(),
      responsesSse("two"),
      "the next answer is still the second",
    );
    assert.equal(replay.count, 2);
  });
  await t.step("an Anthropic recording is not served to the Responses API", async () => {
    await using anthropic = startReplayUpstream({
      version: 1,
      kind: "anthropic",
      responses: [{ status: 200, sse: "data: {}\n\n" }],
    });
    assert.equal(anthropic.upstream.kind, "anthropic");
    const wrong = await fetch(`${anthropic.upstream.baseUrl}/responses`, {
      method: "POST",
      body: "{}",
    });
    assert.equal(wrong.status, 400);
    await wrong.body?.cancel();
    assert.equal(anthropic.count, 0);
  });
});

/** What Codex 0.169.0 sends as tools (trimmed): all of them run by the client. */
const CODEX_TOOLS = [
  {
    type: "function",
    name: "exec_command",
    parameters: { type: "object", properties: { cmd: { type: "string" } } },
  },
  {
    type: "custom",
    name: "apply_patch",
    format: { type: "grammar", syntax: "lark", definition: "start: x" },
  },
  {
    type: "namespace",
    name: "multi_agent_v1",
    tools: [{ type: "function", name: "spawn_agent", parameters: { type: "object" } }],
  },
  { type: "tool_search", execution: "client", parameters: { type: "object" } },
];

Deno.test("The Responses API route refuses server-side tools and fetched inputs unless the profile allows them; Codex's own tools pass", async (t) => {
  await using up = upstream(() =>
    new Response(responsesSse("ok"), { headers: { "content-type": "text/event-stream" } })
  );
  const provider: UpstreamProvider = {
    name: "fake",
    kind: "openai",
    baseUrl: up.baseUrl,
    key: () => Promise.resolve(REAL_KEY),
  };
  const { proxy, token, url } = await proxyFor(provider);
  await using _ = proxy;
  const send = (body: Record<string, unknown>) =>
    fetch(url("/responses"), {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: JSON.stringify({ model: "gpt-5.5", stream: true, ...body }),
    });

  await t.step("Codex's request, as it sends it, is forwarded", async () => {
    const response = await send({
      tools: CODEX_TOOLS,
      input: [{ type: "message", role: "user", content: [{ type: "input_text", text: "hi" }] }],
    });
    assert.equal(response.status, 200);
    await response.body?.cancel();
    assert.equal(up.seen.length, 1);
  });
  const refused: [string, Record<string, unknown>, RegExp][] = [
    ["a web search tool", {
      tools: [...CODEX_TOOLS, { type: "web_search", external_web_access: true }],
    }, /tools\[4\] has type "web_search"/],
    ["a server tool hidden in a namespace", {
      tools: [{
        type: "namespace",
        name: "n",
        tools: [{ type: "function", name: "f" }, {
          type: "code_interpreter",
          container: { type: "auto" },
        }],
      }],
    }, /tools\[0\]\.tools\[1\] has type "code_interpreter"/],
    ["an MCP connector", {
      tools: [{ type: "mcp", server_label: "x", server_url: "https://mcp.example" }],
    }, /has type "mcp"/],
    [
      "tool search run by the provider",
      { tools: [{ type: "tool_search" }] },
      /has type "tool_search"/,
    ],
    ["an image the provider would fetch", {
      input: [{
        type: "message",
        role: "user",
        content: [{ type: "input_image", image_url: "https://evil.example/x.png" }],
      }],
    }, /input\[0\]\.content\[0\] gives a URL/],
    ["a stored prompt", { prompt: { id: "pmpt_123" } }, /stored prompt/],
    ["a search model", { model: "gpt-5-search-api" }, /searches the web/],
  ];
  for (const [name, body, message] of refused) {
    await t.step(`${name}: 403, and the upstream never hears of it`, async () => {
      const response = await send(body);
      assert.equal(response.status, 403);
      const error = await response.json();
      assert.equal(error.error.type, "permission_error");
      assert.match(error.error.message, message);
      assert.equal(up.seen.length, 1);
    });
  }
  await t.step("with llm.server_tools: allow, the web search tool is forwarded", async () => {
    const allowed = await proxyFor(provider, { serverTools: "allow" });
    await using _ = allowed.proxy;
    const response = await fetch(allowed.url("/responses"), {
      method: "POST",
      headers: { authorization: `Bearer ${allowed.token}` },
      body: JSON.stringify({ model: "gpt-5.5", tools: [{ type: "web_search" }], input: "hi" }),
    });
    assert.equal(response.status, 200);
    await response.body?.cancel();
    assert.equal(up.seen.length, 2);
  });
});

Deno.test("Token counting is held to the Messages rules: a server-side tool in it is refused, its twin forwarded", async () => {
  await using up = upstream(() => Response.json({ input_tokens: 7 }));
  const { proxy, token, url } = await proxyFor({
    name: "fake",
    kind: "anthropic",
    baseUrl: up.baseUrl,
    key: () => Promise.resolve(REAL_KEY),
  });
  await using _ = proxy;
  const count = (tools: unknown[]) =>
    fetch(url("/messages/count_tokens"), {
      method: "POST",
      headers: { "x-api-key": token },
      body: JSON.stringify({
        model: "claude-sonnet-4-5",
        tools,
        messages: [{ role: "user", content: "hi" }],
      }),
    });
  const refused = await count([{ type: "web_fetch_20250910", name: "web_fetch" }]);
  assert.equal(refused.status, 403);
  await refused.body?.cancel();
  assert.equal(up.seen.length, 0);
  const allowed = await count([{ name: "Bash", input_schema: { type: "object" } }]);
  assert.deepEqual(await allowed.json(), { input_tokens: 7 });
  assert.equal(up.seen.length, 1);
});

Deno.test("A Responses API recording is checked at load: streams that end their response, no bodies for successes", () => {
  const recording = (responses: unknown[]) => ({ version: 1, kind: "openai-responses", responses });
  assert.deepEqual(
    recordingProblems(
      recording([{ status: 200, sse: responsesSse("ok") }, {
        status: 429,
        body: { error: { message: "slow down" } },
      }]),
    ),
    [],
  );
  const cut = responsesSse("ok").split("event: response.completed")[0];
  assert.deepEqual(recordingProblems(recording([{ status: 200, sse: cut }])), [
    'responses[0].sse: the stream never ends its response: expected a "response.completed", "response.failed" or "response.incomplete" event',
  ]);
  assert.deepEqual(
    recordingProblems(recording([{ status: 200, body: { object: "response", output: [] } }])),
    [
      'responses[0]: a Responses API answer is replayed to a streaming client: expected an "sse" stream, not a "body"',
    ],
  );
});
