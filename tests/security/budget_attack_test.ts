/**
 * A run's budget holds where its traffic passes (lib/proxy/budget.ts): many small requests, many
 * at once, a streaming response, a CONNECT tunnel or kept-alive plain HTTP through the egress
 * proxy each stop at the limit; each beside its twin under a larger budget, which goes through.
 */
import assert from "node:assert/strict";
import { RunBudget } from "../../lib/proxy/budget.ts";
import {
  type CredentialProxy,
  startCredentialProxy,
  TokenRegistry,
} from "../../lib/proxy/credential_proxy.ts";
import { startEgressProxy } from "../../lib/proxy/egress_proxy.ts";
import { chatChunk, FakeUpstream } from "../unit/_fake_upstream.ts";

const REAL_KEY = "sk-real-upstream-key-budget-0123456789";
const MODEL = "gpt-4.1-mini";

/** A credential proxy with one token bound to `budget`, in front of a fake upstream. */
async function llmProxy(budget: RunBudget) {
  const upstream = new FakeUpstream({ key: REAL_KEY });
  const tokens = new TokenRegistry();
  const token = tokens.issue({
    profile: "work",
    runId: "run-1",
    budget,
    provider: {
      name: "fake",
      kind: "openai",
      baseUrl: upstream.baseUrl,
      key: () => Promise.resolve(REAL_KEY),
    },
  });
  const proxy: CredentialProxy = await startCredentialProxy({ hostnames: ["127.0.0.1"], tokens });
  const chat = (body: Record<string, unknown> = {}) =>
    fetch(`${proxy.url("127.0.0.1")}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], ...body }),
    });
  return {
    upstream,
    chat,
    async [Symbol.asyncDispose]() {
      await proxy.close();
      await upstream[Symbol.asyncDispose]();
    },
  };
}

Deno.test("LLM budgets cannot be escaped by many small requests", async (t) => {
  for (const [limit, reached] of [[3, 3], [10, 10]] as const) {
    await t.step(
      `10 requests at once under requests: ${limit}: ${reached} reach the upstream`,
      async () => {
        await using llm = await llmProxy(new RunBudget({ requests: limit }));
        const responses = await Promise.all(Array.from({ length: 10 }, () => llm.chat()));
        const bodies = await Promise.all(responses.map((r) => r.text()));
        assert.equal(llm.upstream.requests.length, reached);
        assert.equal(responses.filter((r) => r.status === 200).length, reached);
        for (const [i, r] of responses.entries()) {
          if (r.status === 200) continue;
          assert.equal(r.status, 403, bodies[i]);
          assert.match(bodies[i], /budget is used up: requests limit 3, used 3/);
        }
      },
    );
  }

  await t.step("tokens: requests of 4 tokens each stop at the one that passes 10", async () => {
    const budget = new RunBudget({ tokens: 10 });
    await using llm = await llmProxy(budget);
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) {
      const response = await llm.chat();
      await response.body?.cancel();
      statuses.push(response.status);
    }
    // 4, 8, 12 (past: charged, the run ends), then refused without reaching the upstream.
    assert.deepEqual(statuses, [200, 200, 200, 403, 403]);
    assert.equal(llm.upstream.requests.length, 3);
    assert.equal(budget.overrun?.budget, "tokens");
  });

  await t.step("the twin: the same five requests under tokens: 20 all pass", async () => {
    await using llm = await llmProxy(new RunBudget({ tokens: 20 }));
    for (let i = 0; i < 5; i++) {
      const response = await llm.chat();
      await response.body?.cancel();
      assert.equal(response.status, 200);
    }
  });
});

Deno.test("LLM budgets cannot be escaped by a streaming response", async (t) => {
  for (const limit of [50, 500]) {
    await t.step(`a stream reporting 120 tokens under tokens: ${limit}`, async () => {
      const budget = new RunBudget({ tokens: limit });
      await using llm = await llmProxy(budget);
      llm.upstream.behaviour = "controlled_stream";
      const streaming = llm.upstream.nextStream();
      const response = await llm.chat({ stream: true, stream_options: { include_usage: true } });
      const control = await streaming;
      control.send(chatChunk("Hel"));
      control.send(
        JSON.stringify({
          model: MODEL,
          choices: [],
          usage: { prompt_tokens: 100, completion_tokens: 20 },
        }),
      );
      if (limit === 50) {
        // Read until the stream is cut or the usage chunk came through (then the upstream is ended
        // by the fake's disposal), so that a stream that is not cut fails instead of waiting.
        const text = await readUntil(response, /event: error[\s\S]*\n\n|prompt_tokens/);
        assert.match(text, /"Hel"/);
        assert.doesNotMatch(text, /prompt_tokens|\[DONE\]/, text);
        assert.match(
          text,
          /event: error\ndata: .*cut at the run's budget: tokens limit 50, used 120/,
        );
        await control.cancelled; // the upstream's rest is not read
        assert.equal(budget.overrun?.budget, "tokens");
      } else {
        control.end("[DONE]");
        const text = await response.text();
        assert.match(text, /"Hel"[\s\S]*"prompt_tokens":100[\s\S]*\[DONE\]/, text);
        assert.equal(budget.overrun, undefined);
      }
      assert.equal(budget.used.tokens, 120);
    });
  }

  await t.step("a stream that reports no usage is charged an estimate, not nothing", async () => {
    const budget = new RunBudget({ tokens: 1_000_000 });
    await using llm = await llmProxy(budget);
    const response = await llm.chat({ stream: true });
    await response.text();
    assert.ok(budget.used.tokens > 0, JSON.stringify(budget.used));
  });
});

/** `response`'s body as text, up to the end or the first match of `until`. */
async function readUntil(response: Response, until: RegExp): Promise<string> {
  const decoder = new TextDecoder();
  let text = "";
  for await (const chunk of response.body!) {
    text += decoder.decode(chunk, { stream: true });
    if (until.test(text)) break;
  }
  return text;
}

/** A plain HTTP server on 127.0.0.1 answering `/bytes/N` with N bytes. */
function byteServer() {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    const size = Number(new URL(req.url).pathname.split("/").at(-1));
    return new Response(new Uint8Array(size).fill(0x61));
  });
  return {
    port: server.addr.port,
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

/** An egress proxy allowing `budget.test` (mapped to 127.0.0.1) under `budget`. */
async function egressProxy(port: number, budget: RunBudget) {
  const proxy = await startEgressProxy({
    hostnames: ["127.0.0.1"],
    mode: "allowlist",
    allow: [`budget.test:${port}`],
    hosts: { "budget.test": "127.0.0.1" },
    profile: "work",
    budget,
  });
  const client = Deno.createHttpClient({ proxy: { url: proxy.url("127.0.0.1") } });
  const get = (size: number) => fetch(`http://budget.test:${port}/bytes/${size}`, { client });
  return {
    get,
    proxyPort: proxy.port,
    async [Symbol.asyncDispose]() {
      client.close();
      await proxy.close();
    },
  };
}

Deno.test("egress budgets cannot be escaped through the egress proxy", async (t) => {
  await using server = byteServer();

  for (const [limit, whole] of [[100_000, false], [2_000_000, true]] as const) {
    await t.step(`a 1 MB download under egress_bytes: ${limit}`, async () => {
      const budget = new RunBudget({ egress_bytes: limit });
      await using egress = await egressProxy(server.port, budget);
      const received = await egress.get(1_000_000).then((r) => r.arrayBuffer()).then(
        (body) => body.byteLength,
        () => -1, // the connection was cut mid-body
      );
      if (whole) {
        assert.equal(received, 1_000_000);
        assert.equal(budget.overrun, undefined);
      } else {
        assert.notEqual(received, 1_000_000);
        assert.equal(budget.overrun?.budget, "egress_bytes");
        const next = await egress.get(10);
        assert.equal(next.status, 403);
        assert.match(await next.text(), /budget is used up: egress_bytes limit 100000 bytes/);
      }
    });
  }

  await t.step(
    "kept-alive requests are each admitted: the third of egress_requests: 2 is refused",
    async () => {
      await using egress = await egressProxy(server.port, new RunBudget({ egress_requests: 2 }));
      const statuses = [];
      for (let i = 0; i < 3; i++) {
        const response = await egress.get(10);
        await response.body?.cancel();
        statuses.push(response.status);
      }
      assert.deepEqual(statuses, [200, 200, 403]);
    },
  );

  for (const [limit, whole] of [[100_000, false], [2_000_000, true]] as const) {
    await t.step(`a CONNECT tunnel carrying 1 MB under egress_bytes: ${limit}`, async () => {
      const budget = new RunBudget({ egress_bytes: limit });
      await using egress = await egressProxy(server.port, budget);
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: egress.proxyPort });
      const request = `CONNECT budget.test:${server.port} HTTP/1.1\r\nHost: budget.test\r\n\r\n` +
        `GET /bytes/1000000 HTTP/1.1\r\nHost: budget.test\r\nConnection: close\r\n\r\n`;
      await conn.write(new TextEncoder().encode(request));
      let received = 0;
      try {
        for await (const chunk of conn.readable) received += chunk.byteLength;
      } catch {
        // A reset is one way a cut connection ends.
      }
      if (whole) assert.ok(received > 1_000_000, String(received));
      else {
        assert.ok(received < 1_000_000, String(received));
        assert.equal(budget.overrun?.budget, "egress_bytes");
      }
    });
  }
});
