import assert from "node:assert/strict";
import { AccessLog, type AccessLogEntry } from "../../lib/proxy/access_log.ts";
import {
  ANTHROPIC_VERSION,
  type CredentialProxy,
  OAUTH_BETA,
  startCredentialProxy,
  TokenRegistry,
  type UpstreamProvider,
} from "../../lib/proxy/credential_proxy.ts";
import type { LlmPolicy } from "../../lib/proxy/llm_policy.ts";
import { REDACTED, Redactor } from "../../lib/redact.ts";
import { chatChunk, FakeUpstream, RATE_LIMIT_BODY } from "./_fake_upstream.ts";

const REAL_KEY = "sk-real-upstream-key-0123456789";

interface HarnessOptions {
  kind?: UpstreamProvider["kind"];
  /** Defaults to the fake upstream's. */
  baseUrl?: string;
  maxBodyBytes?: number;
  upstreamTimeoutMs?: number;
  policy?: LlmPolicy;
  auth?: "oauth";
}

/** A fake upstream, a proxy in front of it with one issued token, and its access log. */
class Harness implements AsyncDisposable {
  readonly upstream = new FakeUpstream({ key: REAL_KEY });
  readonly redactor = new Redactor();
  readonly tokens = new TokenRegistry({ redactor: this.redactor });
  readonly entries: AccessLogEntry[] = [];
  readonly #entryWaiters: { count: number; resolve: () => void }[] = [];
  readonly logPath = Deno.makeTempFileSync({ prefix: "sandbox-access-", suffix: ".ndjson" });
  readonly log = new AccessLog({
    path: this.logPath,
    redactor: this.redactor,
    onEntry: (entry) => {
      this.entries.push(entry);
      for (const waiter of this.#entryWaiters.filter((w) => this.entries.length >= w.count)) {
        waiter.resolve();
      }
    },
  });
  readonly provider: UpstreamProvider;
  readonly token: string;
  proxy!: CredentialProxy;

  constructor(readonly options: HarnessOptions = {}) {
    this.provider = {
      name: "fake",
      kind: options.kind ?? "openai",
      baseUrl: options.baseUrl ?? this.upstream.baseUrl,
      key: () => Promise.resolve(REAL_KEY),
      auth: options.auth,
    };
    this.token = this.tokens.issue({
      profile: "work",
      runId: "run-1",
      provider: this.provider,
      policy: options.policy,
    });
  }

  static async start(options?: HarnessOptions): Promise<Harness> {
    const harness = new Harness(options);
    harness.proxy = await startCredentialProxy({
      hostnames: ["127.0.0.1"],
      tokens: harness.tokens,
      log: harness.log,
      redactor: harness.redactor,
      maxBodyBytes: options?.maxBodyBytes,
      upstreamTimeoutMs: options?.upstreamTimeoutMs,
    });
    return harness;
  }

  /** `http://127.0.0.1:port/proxy/v1` + path. */
  url(path: string): string {
    return this.proxy.url("127.0.0.1") + path;
  }

  /** Resolves once `count` entries were logged in total (entries are written when bodies end). */
  entriesLogged(count: number): Promise<AccessLogEntry[]> {
    if (this.entries.length >= count) return Promise.resolve(this.entries);
    return new Promise((resolve) =>
      this.#entryWaiters.push({ count, resolve: () => resolve(this.entries) })
    );
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.proxy?.close();
    await this.upstream[Symbol.asyncDispose]();
    await this.log.close();
    await Deno.remove(this.logPath);
  }
}

function chatBody(extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    model: "fake-model",
    messages: [{ role: "user", content: "hi" }],
    ...extra,
  });
}

/** Read from `reader` until the text received so far contains `marker`. */
async function readUntil(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  decoder: TextDecoder,
  marker: string,
  soFar = "",
): Promise<string> {
  let text = soFar;
  while (!text.includes(marker)) {
    const { done, value } = await reader.read();
    if (done) {
      throw new Error(`stream ended before ${JSON.stringify(marker)}; got ${JSON.stringify(text)}`);
    }
    text += decoder.decode(value, { stream: true });
  }
  return text;
}

/** A port on 127.0.0.1 that nothing listens on. */
function closedPort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  listener.close();
  return port;
}

Deno.test("TokenRegistry issues unguessable sbx_ tokens and looks them up exactly", async (t) => {
  const tokens = new TokenRegistry();
  const provider: UpstreamProvider = {
    name: "p",
    kind: "openai",
    baseUrl: "http://127.0.0.1:9/v1",
    key: () => Promise.resolve("k"),
  };
  const grant = { profile: "work", runId: "run-1", provider };
  const token = tokens.issue(grant);

  await t.step("a token is sbx_ and 32 random bytes in base64url", () => {
    assert.match(token, /^sbx_[A-Za-z0-9_-]{43}$/);
    assert.notEqual(tokens.issue(grant), token);
  });
  await t.step("only the exact token finds its grant", () => {
    assert.equal(tokens.lookup(token), grant);
    assert.equal(tokens.lookup(token.slice(0, -1)), undefined);
    assert.equal(tokens.lookup(token + "x"), undefined);
    assert.equal(tokens.lookup(token.slice(0, -1) + (token.endsWith("A") ? "B" : "A")), undefined);
    assert.equal(tokens.lookup(""), undefined);
  });
  await t.step("a revoked token no longer finds its grant", () => {
    tokens.revoke(token);
    assert.equal(tokens.lookup(token), undefined);
  });
});

/** Headers Deno's fetch adds to every request by itself (the proxy's own client). */
const FETCH_OWN_HEADERS = [
  "accept-encoding",
  "accept-language",
  "content-length",
  "host",
  "user-agent",
];

Deno.test("startCredentialProxy() forwards only the headers the API needs, with the real key", async () => {
  await using h = await Harness.start();
  const response = await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: {
      "authorization": `Bearer ${h.token}`,
      "content-type": "text/plain",
      "accept": "application/json",
      "cookie": "session=abc",
      "x-sandbox-run-id": "run-1",
      "x-sandbox-token": h.token,
      "x-request-tag": "dropped",
      "openai-organization": "org-someone-else",
      "openai-project": "proj-someone-else",
      "openai-beta": "assistants=v2",
      "user-agent": "agent/1.0",
      "x-stainless-os": "Linux",
    },
    body: chatBody(),
  });
  assert.equal(response.status, 200);
  assert.equal((await response.json()).choices[0].message.content, "Hello");

  assert.equal(h.upstream.requests.length, 1);
  const seen = h.upstream.requests[0];
  assert.equal(seen.method, "POST");
  assert.equal(seen.path, "/v1/chat/completions");
  assert.equal(seen.body, chatBody());
  assert.equal(seen.headers.get("authorization"), `Bearer ${REAL_KEY}`);
  assert.equal(seen.headers.get("content-length"), String(chatBody().length));
  // The body was checked as JSON, so that is what the upstream is told it is.
  assert.equal(seen.headers.get("content-type"), "application/json");
  assert.equal(seen.headers.get("accept"), "application/json");
  assert.notEqual(seen.headers.get("user-agent"), "agent/1.0");
  assert.deepEqual(
    [...seen.headers.keys()].filter((name) => !FETCH_OWN_HEADERS.includes(name)).sort(),
    ["accept", "authorization", "content-type"],
  );
});

Deno.test("startCredentialProxy() never forwards a token sent as x-api-key to an OpenAI-style provider", async (t) => {
  // The fake upstream answers 401 unless it gets exactly the real key in exactly one credential
  // header, so a forwarded token (alone or beside the key) fails the request, not just an assert.
  await using h = await Harness.start();
  const cases: [string, Record<string, string>][] = [
    ["x-api-key alone", { "x-api-key": h.token }],
    ["x-api-key beside Authorization", {
      "x-api-key": h.token,
      authorization: `Bearer ${h.token}`,
    }],
  ];
  for (const [name, headers] of cases) {
    await t.step(name, async () => {
      const response = await fetch(h.url("/chat/completions"), {
        method: "POST",
        headers,
        body: chatBody(),
      });
      const text = await response.text();
      assert.equal(response.status, 200, text);
      const seen = h.upstream.requests.at(-1)!;
      assert.equal(seen.headers.get("x-api-key"), null);
      assert.equal(seen.headers.get("authorization"), `Bearer ${REAL_KEY}`);
      for (const [header, value] of seen.headers) {
        assert.ok(!value.includes(h.token), `upstream saw the token in ${header}`);
      }
    });
  }
});

Deno.test("startCredentialProxy() passes a redirect back and never follows it with the key", async () => {
  await using h = await Harness.start();
  // Where the redirect points: it accepts any request it gets as evidence, and must get none.
  await using elsewhere = new FakeUpstream();
  h.upstream.behaviour = "redirect";
  h.upstream.redirectTo = elsewhere.baseUrl;
  const response = await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}` },
    body: chatBody(),
    redirect: "manual",
  });
  await response.body?.cancel();
  assert.equal(response.status, 307);
  assert.equal(response.headers.get("location"), `${elsewhere.baseUrl}/chat/completions`);
  assert.equal(h.upstream.requests.length, 1);
  assert.equal(elsewhere.requests.length, 0, "the redirect target received a request");
  const [entry] = await h.entriesLogged(1);
  assert.equal(entry.status, 307);
});

Deno.test("startCredentialProxy() keeps the query string and forwards GET /models", async () => {
  await using h = await Harness.start();
  const response = await fetch(h.url("/models?limit=5"), {
    headers: { authorization: `Bearer ${h.token}` },
  });
  assert.equal(response.status, 200);
  assert.equal((await response.json()).data[0].id, "fake-model");
  assert.equal(h.upstream.requests[0].path, "/v1/models?limit=5");
  assert.equal(h.upstream.requests[0].method, "GET");
});

Deno.test("startCredentialProxy() forwards embeddings", async () => {
  await using h = await Harness.start();
  const response = await fetch(h.url("/embeddings"), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}` },
    body: JSON.stringify({ model: "e", input: "x" }),
  });
  assert.equal(response.status, 200);
  assert.deepEqual((await response.json()).data[0].embedding, [0.1, 0.2]);
});

Deno.test("startCredentialProxy() gives anthropic providers x-api-key and anthropic-version", async (t) => {
  await using h = await Harness.start({ kind: "anthropic" });

  await t.step(
    "the token is accepted as x-api-key, and the real key goes out the same way",
    async () => {
      const response = await fetch(h.url("/messages"), {
        method: "POST",
        headers: { "x-api-key": h.token, "content-type": "application/json" },
        body: JSON.stringify({ model: "claude", max_tokens: 5, messages: [] }),
      });
      assert.equal(response.status, 200);
      assert.equal((await response.json()).content[0].text, "Hello");
      const seen = h.upstream.requests.at(-1)!;
      assert.equal(seen.path, "/v1/messages");
      assert.equal(seen.headers.get("x-api-key"), REAL_KEY);
      assert.equal(seen.headers.get("anthropic-version"), ANTHROPIC_VERSION);
      assert.equal(seen.headers.get("authorization"), null);
    },
  );

  await t.step("a client's own anthropic-version is kept", async () => {
    const response = await fetch(h.url("/messages"), {
      method: "POST",
      headers: {
        "x-api-key": h.token,
        "anthropic-version": "2024-10-22",
        "anthropic-beta": "tools",
      },
      body: "{}",
    });
    await response.body?.cancel();
    const seen = h.upstream.requests.at(-1)!;
    assert.equal(seen.headers.get("anthropic-version"), "2024-10-22");
    assert.equal(seen.headers.get("anthropic-beta"), "tools");
  });
});

Deno.test("startCredentialProxy() sends a subscription token as Claude Code does: Bearer and the OAuth beta flag", async (t) => {
  await using h = await Harness.start({ kind: "anthropic", auth: "oauth" });
  const send = async (headers: Record<string, string>) => {
    const response = await fetch(h.url("/messages"), {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ model: "claude", max_tokens: 5, messages: [] }),
    });
    assert.equal(response.status, 200);
    await response.body?.cancel();
    return h.upstream.requests.at(-1)!.headers;
  };

  await t.step(
    "the sandbox's placeholder (the token, as Bearer) is replaced by the subscription",
    async () => {
      const seen = await send({ authorization: `Bearer ${h.token}` });
      assert.equal(seen.get("authorization"), `Bearer ${REAL_KEY}`);
      assert.equal(seen.get("x-api-key"), null);
      assert.equal(seen.get("anthropic-beta"), OAUTH_BETA);
    },
  );

  await t.step("a client's own beta flags are kept beside it, the OAuth flag once", async () => {
    const seen = await send({
      "x-api-key": h.token,
      "anthropic-beta": `claude-code-20250219, ${OAUTH_BETA}`,
    });
    assert.equal(seen.get("authorization"), `Bearer ${REAL_KEY}`);
    assert.equal(seen.get("x-api-key"), null);
    assert.equal(seen.get("anthropic-beta"), `claude-code-20250219,${OAUTH_BETA}`);
  });
});

Deno.test("startCredentialProxy() answers 401 and forwards nothing without a valid token", async (t) => {
  await using h = await Harness.start();
  const attempt = async (headers: Record<string, string>) => {
    const response = await fetch(h.url("/chat/completions"), {
      method: "POST",
      headers,
      body: chatBody(),
    });
    const text = await response.text();
    assert.equal(response.status, 401, text);
    assert.equal(JSON.parse(text).error.type, "authentication_error");
    return text;
  };

  await t.step("no token at all", async () => {
    assert.match(await attempt({}), /no proxy token/);
  });
  await t.step("an empty bearer token", async () => {
    await attempt({ authorization: "Bearer " });
  });
  await t.step("a wrong token, which is never echoed back", async () => {
    const text = await attempt({ authorization: "Bearer sbx_wrong-token-value-000000000" });
    assert.ok(!text.includes("sbx_wrong-token"), text);
  });
  await t.step("a real upstream key instead of a token", async () => {
    await attempt({ authorization: `Bearer ${REAL_KEY}` });
  });
  await t.step("two different tokens in Authorization and x-api-key", async () => {
    await attempt({
      authorization: `Bearer ${h.token}`,
      "x-api-key": "sbx_other-token-000000000000",
    });
  });
  await t.step("a revoked token", async () => {
    const token = h.tokens.issue({ profile: "work", runId: "run-2", provider: h.provider });
    h.tokens.revoke(token);
    await attempt({ "x-api-key": token });
  });

  assert.equal(h.upstream.requests.length, 0);
  const entries = await h.entriesLogged(6);
  assert.ok(entries.every((entry) => entry.decision === "deny" && entry.status === 401));
});

Deno.test("startCredentialProxy() answers 404 for routes it does not forward", async () => {
  await using h = await Harness.start();
  const cases: [string, string][] = [
    ["GET", "/chat/completions"],
    ["POST", "/models"],
    ["POST", "/files"],
    ["POST", "/chat/completions/extra"],
    ["DELETE", "/messages"],
  ];
  for (const [method, path] of cases) {
    const response = await fetch(h.url(path), {
      method,
      headers: { authorization: `Bearer ${h.token}` },
      body: method === "GET" ? undefined : "{}",
    });
    const body = await response.json();
    assert.equal(response.status, 404, `${method} ${path}`);
    assert.equal(body.error.type, "not_found_error");
  }
  const outside = await fetch(new URL("/v1/chat/completions", h.url("")), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}` },
    body: "{}",
  });
  await outside.body?.cancel();
  assert.equal(outside.status, 404);
  assert.equal(h.upstream.requests.length, 0);
});

Deno.test("startCredentialProxy() answers 413 for a body over the limit", async (t) => {
  await using h = await Harness.start({ maxBodyBytes: 1024 });

  await t.step("declared by Content-Length, refused before reading", async () => {
    const response = await fetch(h.url("/chat/completions"), {
      method: "POST",
      headers: { authorization: `Bearer ${h.token}` },
      body: "x".repeat(2048),
    });
    assert.equal(response.status, 413);
    assert.equal((await response.json()).error.type, "request_too_large");
  });

  await t.step("sent chunked, refused once it grows past the limit", async () => {
    const chunk = new TextEncoder().encode("y".repeat(600));
    const response = await fetch(h.url("/chat/completions"), {
      method: "POST",
      headers: { authorization: `Bearer ${h.token}` },
      body: ReadableStream.from([chunk, chunk, chunk]),
    });
    assert.equal(response.status, 413);
    await response.body?.cancel();
  });

  await t.step(
    "a chunked body within the limit is forwarded whole with a Content-Length",
    async () => {
      const chunk = new TextEncoder().encode("z".repeat(500));
      const response = await fetch(h.url("/embeddings"), {
        method: "POST",
        headers: { authorization: `Bearer ${h.token}` },
        body: ReadableStream.from([
          new TextEncoder().encode('{"input":"'),
          chunk,
          new TextEncoder().encode('"}'),
        ]),
      });
      assert.equal(response.status, 200);
      await response.body?.cancel();
      const seen = h.upstream.requests.at(-1)!;
      assert.equal(seen.body.length, 512);
      assert.equal(seen.headers.get("content-length"), "512");
    },
  );

  assert.equal(h.upstream.requests.length, 1);
});

Deno.test("startCredentialProxy() passes an upstream 429 through with its body and headers", async () => {
  await using h = await Harness.start();
  h.upstream.behaviour = "rate_limited";
  const response = await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}` },
    body: chatBody(),
  });
  assert.equal(response.status, 429);
  assert.equal(response.headers.get("retry-after"), "7");
  assert.equal(await response.text(), RATE_LIMIT_BODY);
  const [entry] = await h.entriesLogged(1);
  assert.equal(entry.status, 429);
  assert.equal(entry.decision, "allow");
});

Deno.test("startCredentialProxy() passes a decoded body on when the upstream compresses it", async () => {
  await using h = await Harness.start();
  h.upstream.behaviour = "gzip";
  const response = await fetch(h.url("/models"), {
    headers: { authorization: `Bearer ${h.token}` },
  });
  assert.equal(response.status, 200);
  assert.equal((await response.json()).data[0].id, "fake-model");
});

Deno.test("startCredentialProxy() answers 502 with a generic message when the upstream is down", async () => {
  await using h = await Harness.start({
    baseUrl: `http://user:url-password-123@127.0.0.1:${closedPort()}/v1`,
  });
  const response = await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}` },
    body: chatBody(),
  });
  const text = await response.text();
  assert.equal(response.status, 502, text);
  assert.match(JSON.parse(text).error.message, /cannot reach provider "fake"/);
  for (const secret of [REAL_KEY, h.token, "url-password-123", "127.0.0.1"]) {
    assert.ok(!text.includes(secret), `${secret} in ${text}`);
  }
  const [entry] = await h.entriesLogged(1);
  assert.equal(entry.status, 502);
});

Deno.test("startCredentialProxy() answers 502 when the host cannot produce the API key", async () => {
  await using h = await Harness.start();
  h.provider.key = () => Promise.reject(new Error(`vault said: ${REAL_KEY}`));
  const response = await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}` },
    body: chatBody(),
  });
  const text = await response.text();
  assert.equal(response.status, 502, text);
  assert.match(JSON.parse(text).error.message, /the API key for provider "fake" is not available/);
  assert.ok(!text.includes(REAL_KEY));
  assert.equal(h.upstream.requests.length, 0);
});

Deno.test("startCredentialProxy() answers 504 when the upstream sends no headers in time", async () => {
  await using h = await Harness.start({ upstreamTimeoutMs: 100 });
  h.upstream.behaviour = "hang";
  const arrived = h.upstream.nextRequest();
  const response = await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}` },
    body: chatBody(),
  });
  const body = await response.json();
  assert.equal(response.status, 504);
  assert.equal(body.error.type, "timeout_error");
  // The upstream request was cancelled, not left running.
  await (await arrived).aborted;
});

Deno.test("startCredentialProxy() streams SSE chunks before the upstream has finished", async () => {
  await using h = await Harness.start();
  h.upstream.behaviour = "controlled_stream";
  const streamStarted = h.upstream.nextStream();
  const response = await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}`, accept: "text/event-stream" },
    body: chatBody({ stream: true }),
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get("content-type"), "text/event-stream");
  const upstream = await streamStarted;
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();

  upstream.send(chatChunk("first"));
  // The first chunk arrives while the upstream response is still open: nothing was buffered.
  let text = await readUntil(reader, decoder, chatChunk("first"));
  upstream.send(chatChunk("second"));
  text = await readUntil(reader, decoder, chatChunk("second"), text);
  upstream.end("[DONE]");
  text = await readUntil(reader, decoder, "[DONE]", text);
  assert.equal((await reader.read()).done, true);
  assert.equal(
    text,
    [chatChunk("first"), chatChunk("second"), "[DONE]"].map((d) => `data: ${d}\n\n`).join(""),
  );

  const [entry] = await h.entriesLogged(1);
  assert.equal(entry.bytesIn, new TextEncoder().encode(text).length);
  assert.equal(entry.status, 200);
});

Deno.test("startCredentialProxy() cancels the upstream request when the client goes away", async (t) => {
  await using h = await Harness.start();

  await t.step("while waiting for response headers", async () => {
    h.upstream.behaviour = "hang";
    const arrived = h.upstream.nextRequest();
    const client = new AbortController();
    const response = fetch(h.url("/chat/completions"), {
      method: "POST",
      headers: { authorization: `Bearer ${h.token}` },
      body: chatBody(),
      signal: client.signal,
    });
    const request = await arrived;
    client.abort();
    await assert.rejects(response);
    await request.aborted;
  });

  await t.step("in the middle of a streamed response", async () => {
    h.upstream.behaviour = "controlled_stream";
    const streamStarted = h.upstream.nextStream();
    const arrived = h.upstream.nextRequest();
    const response = await fetch(h.url("/chat/completions"), {
      method: "POST",
      headers: { authorization: `Bearer ${h.token}` },
      body: chatBody({ stream: true }),
    });
    const upstream = await streamStarted;
    const reader = response.body!.getReader();
    upstream.send(chatChunk("first"));
    await readUntil(reader, new TextDecoder(), chatChunk("first"));
    await reader.cancel();
    await upstream.cancelled;
    await (await arrived).aborted;
  });
});

Deno.test("startCredentialProxy() logs each request as one NDJSON line without key or token", async () => {
  await using h = await Harness.start();
  const auth = { authorization: `Bearer ${h.token}` };
  await (await fetch(h.url("/chat/completions"), {
    method: "POST",
    headers: auth,
    body: chatBody(),
  })).text();
  await (await fetch(h.url("/chat/completions"), { method: "POST", body: chatBody() })).text();
  // The token smuggled into a path and a query string must not reach the log either.
  await (await fetch(h.url(`/models?api_key=${h.token}`), { headers: auth })).text();
  await (await fetch(h.url(`/${h.token}`), { headers: auth })).text();

  await h.entriesLogged(4);
  await h.log.flush();
  const text = await Deno.readTextFile(h.logPath);
  assert.ok(!text.includes(h.token), "token in the access log");
  assert.ok(!text.includes(REAL_KEY), "key in the access log");
  const lines = text.trimEnd().split("\n");
  assert.equal(lines.length, 4);
  const entries: AccessLogEntry[] = lines.map((line) => JSON.parse(line));
  for (const entry of entries) {
    assert.equal(entry.kind, "llm");
    assert.equal(new Date(entry.time).toISOString(), entry.time);
    assert.equal(typeof entry.durationMs, "number");
    assert.equal(typeof entry.bytesIn, "number");
    assert.equal(typeof entry.bytesOut, "number");
  }
  const byStatus = (status: number) => entries.filter((entry) => entry.status === status);

  const [forwarded, models] = byStatus(200);
  assert.deepEqual(
    { ...forwarded, time: undefined, durationMs: undefined },
    {
      time: undefined,
      kind: "llm",
      decision: "allow",
      method: "POST",
      host: "127.0.0.1",
      port: h.upstream.port,
      path: "/v1/chat/completions",
      status: 200,
      bytesIn: forwarded.bytesIn,
      bytesOut: chatBody().length,
      durationMs: undefined,
      profile: "work",
      runId: "run-1",
    },
  );
  assert.ok(forwarded.bytesIn > 0);
  assert.equal(models.path, "/v1/models");

  const [denied] = byStatus(401);
  assert.equal(denied.decision, "deny");
  assert.equal(denied.runId, null);
  assert.match(denied.reason ?? "", /no proxy token/);

  const [notFound] = byStatus(404);
  assert.equal(notFound.path, "/proxy/v1/[REDACTED]");
});

Deno.test("startCredentialProxy() close() ends a response that is still streaming", async () => {
  const h = await Harness.start();
  try {
    h.upstream.behaviour = "controlled_stream";
    const streamStarted = h.upstream.nextStream();
    const response = await fetch(h.url("/chat/completions"), {
      method: "POST",
      headers: { authorization: `Bearer ${h.token}` },
      body: chatBody({ stream: true }),
    });
    const upstream = await streamStarted;
    const reader = response.body!.getReader();
    upstream.send(chatChunk("first"));
    await readUntil(reader, new TextDecoder(), chatChunk("first"));
    await h.proxy.close();
    // The client must see the stream break, not a clean end that would pass for a whole answer.
    const ending = await (async () => {
      try {
        while (!(await reader.read()).done);
        return "ended cleanly";
      } catch {
        return "errored";
      }
    })();
    assert.equal(ending, "errored");
    await upstream.cancelled;
  } finally {
    await h[Symbol.asyncDispose]();
  }
});

Deno.test("startCredentialProxy() refuses to listen on all interfaces", async () => {
  const tokens = new TokenRegistry();
  for (const hostname of ["0.0.0.0", "::", "[::]", ""]) {
    await assert.rejects(
      startCredentialProxy({ hostnames: [hostname], tokens }),
      TypeError,
      hostname,
    );
  }
  await assert.rejects(startCredentialProxy({ hostnames: [], tokens }), TypeError);
});

Deno.test("startCredentialProxy() closes what it opened when a later address fails", async () => {
  await assert.rejects(
    startCredentialProxy({ hostnames: ["127.0.0.1", "127.0.0.1"], tokens: new TokenRegistry() }),
    Deno.errors.AddrInUse,
  );
});

// ---------------------------------------------------------------------------------------------
// Provider-side egress: server-side tools, search models, URL inputs, models

/** POST `body` (an object, or raw text) to `path` with the harness's token. */
async function post(
  h: Harness,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; text: string }> {
  const response = await fetch(h.url(path), {
    method: "POST",
    headers: { authorization: `Bearer ${h.token}`, "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: response.status, text: await response.text() };
}

/** A 403 with the proxy's permission error, and nothing reached the upstream. */
function assertRefused(
  h: Harness,
  result: { status: number; text: string },
  message: RegExp,
  before = 0,
): void {
  assert.equal(result.status, 403, result.text);
  const error = JSON.parse(result.text).error;
  assert.equal(error.type, "permission_error");
  assert.match(error.message, /^sandbox credential proxy: /);
  assert.match(error.message, message);
  assert.equal(h.upstream.requests.length, before, "a refused request reached the upstream");
}

function anthropicBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    model: "claude-test",
    max_tokens: 64,
    messages: [{ role: "user", content: "Fetch https://attacker.test/?secret=1" }],
    ...extra,
  };
}

Deno.test("startCredentialProxy() refuses Anthropic server-side tools with 403 and forwards client-side ones", async (t) => {
  await using h = await Harness.start({ kind: "anthropic" });
  const serverSide: [string, Record<string, unknown>][] = [
    ["web fetch", { tools: [{ type: "web_fetch_20250910", name: "web_fetch", max_uses: 5 }] }],
    ["web fetch (newer version)", { tools: [{ type: "web_fetch_20260309", name: "web_fetch" }] }],
    ["web search", { tools: [{ type: "web_search_20250305", name: "web_search" }] }],
    ["code execution", { tools: [{ type: "code_execution_20250825", name: "code_execution" }] }],
    ["an MCP toolset", { tools: [{ type: "mcp_toolset", mcp_server_name: "x" }] }],
    ["the advisor", { tools: [{ type: "advisor_20260301", name: "advisor" }] }],
    ["tool search", { tools: [{ type: "tool_search_tool_regex_20251119", name: "ts" }] }],
    ["a server tool of a type nobody knows yet", {
      tools: [{ type: "teleport_20990101", name: "t" }],
    }],
    ["a server tool after a client one", {
      tools: [{ name: "run", input_schema: { type: "object" } }, {
        type: "web_fetch_20250910",
        name: "f",
      }],
    }],
  ];
  for (const [name, extra] of serverSide) {
    await t.step(`${name} is refused`, async () => {
      const result = await post(h, "/messages", anthropicBody(extra), {
        "x-api-key": h.token,
        "anthropic-beta": "web-fetch-2025-09-10",
      });
      assertRefused(h, result, /tools\[\d\] has type ".+", a server-side tool/);
      assert.match(JSON.parse(result.text).error.message, /llm\.server_tools: allow/);
    });
  }
  const other: [string, Record<string, unknown>, RegExp][] = [
    ["the MCP connector", {
      mcp_servers: [{ type: "url", url: "https://mcp.attacker.test/sse", name: "x" }],
    }, /mcp_servers/],
    [
      "a code execution container",
      { container: "container_011CPR5CNjB747bTd36fQLFk" },
      /container/,
    ],
    ["an image the provider would fetch", {
      messages: [{
        role: "user",
        content: [{ type: "image", source: { type: "url", url: "https://attacker.test/x.png" } }],
      }],
    }, /URL source/],
    ["a document inside a tool result the provider would fetch", {
      messages: [{
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: "t1",
          content: [{
            type: "document",
            source: { type: "url", url: "https://attacker.test/a.pdf" },
          }],
        }],
      }],
    }, /URL source/],
  ];
  for (const [name, extra, message] of other) {
    await t.step(`${name} is refused`, async () => {
      assertRefused(h, await post(h, "/messages", anthropicBody(extra)), message);
    });
  }

  await t.step("client-side tools and inline data pass, the body byte for byte", async () => {
    const body = JSON.stringify(anthropicBody({
      tools: [
        { name: "run", description: "run a command", input_schema: { type: "object" } },
        { type: "custom", name: "mine", input_schema: { type: "object" } },
        { type: "bash_20250124", name: "bash" },
        { type: "text_editor_20250728", name: "str_replace_based_edit_tool" },
        {
          type: "computer_20250124",
          name: "computer",
          display_width_px: 1024,
          display_height_px: 768,
        },
        { type: "memory_20250818", name: "memory" },
      ],
      messages: [{
        role: "user",
        content: [
          { type: "text", text: "see https://example.test/ (text, not fetched)" },
          { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0K" } },
          {
            type: "tool_use",
            id: "t",
            name: "fetch",
            input: { source: { type: "url", url: "https://a.test" } },
          },
        ],
      }],
    }));
    const result = await post(h, "/messages", body, { "x-api-key": h.token });
    assert.equal(result.status, 200, result.text);
    assert.equal(h.upstream.requests.length, 1);
    assert.equal(h.upstream.requests[0].body, body);
  });
});

Deno.test("startCredentialProxy() drops server-side anthropic-beta flags and keeps the others", async (t) => {
  await t.step("deny (the default)", async () => {
    await using h = await Harness.start({ kind: "anthropic" });
    const result = await post(h, "/messages", anthropicBody(), {
      "x-api-key": h.token,
      "anthropic-beta":
        "web-fetch-2025-09-10, interleaved-thinking-2025-05-14,code-execution-2025-08-25,mcp-client-2025-11-20,skills-2025-10-02,web-search-2025-03-05,context-1m-2025-08-07",
    });
    assert.equal(result.status, 200, result.text);
    assert.equal(
      h.upstream.requests[0].headers.get("anthropic-beta"),
      "interleaved-thinking-2025-05-14,context-1m-2025-08-07",
    );
  });
  await t.step("only server-side flags: no header at all", async () => {
    await using h = await Harness.start({ kind: "anthropic" });
    const result = await post(h, "/messages", anthropicBody(), {
      "x-api-key": h.token,
      "anthropic-beta": "web-fetch-2025-09-10",
    });
    assert.equal(result.status, 200, result.text);
    assert.equal(h.upstream.requests[0].headers.get("anthropic-beta"), null);
  });
  await t.step("allow: every flag passes", async () => {
    await using h = await Harness.start({ kind: "anthropic", policy: { serverTools: "allow" } });
    const result = await post(h, "/messages", anthropicBody(), {
      "x-api-key": h.token,
      "anthropic-beta": "web-fetch-2025-09-10,interleaved-thinking-2025-05-14",
    });
    assert.equal(result.status, 200, result.text);
    assert.equal(
      h.upstream.requests[0].headers.get("anthropic-beta"),
      "web-fetch-2025-09-10,interleaved-thinking-2025-05-14",
    );
  });
});

Deno.test("startCredentialProxy() refuses OpenAI-style provider-side tools, search models and URL inputs", async (t) => {
  await using h = await Harness.start();
  const refused: [string, Record<string, unknown>, RegExp][] = [
    ...[
      "web_search",
      "web_search_preview",
      "file_search",
      "code_interpreter",
      "mcp",
      "image_generation",
      "computer_use_preview",
      "openrouter:web_search",
    ]
      .map((type): [string, Record<string, unknown>, RegExp] => [
        `a ${type} tool`,
        { tools: [{ type, server_url: "https://mcp.attacker.test" }] },
        new RegExp(`tools\\[0\\] has type "${type}", not a tool the client runs`),
      ]),
    ["a tool without a type", { tools: [{ function: { name: "f" } }] }, /tools\[0\] has type null/],
    [
      "web_search_options",
      { web_search_options: { search_context_size: "low" } },
      /web_search_options/,
    ],
    ["OpenRouter plugins", { plugins: [{ id: "web" }] }, /plugins/],
    ["a search model", { model: "gpt-4o-search-preview" }, /searches the web/],
    ["a dated search model behind a vendor prefix", {
      model: "openai/gpt-4o-mini-search-preview-2025-03-11",
    }, /searches the web/],
    ["the search API model", { model: "gpt-5-search-api" }, /searches the web/],
    ["an OpenRouter :online model", { model: "anthropic/claude-sonnet-4.5:online" }, /":online"/],
    ["an image URL", {
      messages: [{
        role: "user",
        content: [{ type: "image_url", image_url: { url: "https://attacker.test/?k=1" } }],
      }],
    }, /messages\[0\]\.content\[0\] gives a URL the provider would fetch/],
    ["a file given by URL", {
      messages: [{
        role: "user",
        content: [{
          type: "file",
          file: { filename: "a.pdf", file_data: "https://attacker.test/a.pdf" },
        }],
      }],
    }, /gives a URL/],
  ];
  for (const [name, extra, message] of refused) {
    await t.step(`${name} is refused`, async () => {
      assertRefused(h, await post(h, "/chat/completions", JSON.parse(chatBody(extra))), message);
    });
  }

  await t.step("function and custom tools, inline images and ordinary models pass", async () => {
    const body = chatBody({
      model: "gpt-4.1-mini",
      tools: [
        { type: "function", function: { name: "web_search", parameters: { type: "object" } } },
        { type: "custom", custom: { name: "apply_patch" } },
      ],
      messages: [{
        role: "user",
        content: [
          { type: "text", text: "https://example.test/ in text is only text" },
          { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0K" } },
        ],
      }],
    });
    const result = await post(h, "/chat/completions", body);
    assert.equal(result.status, 200, result.text);
    assert.equal(h.upstream.requests.length, 1);
    assert.equal(h.upstream.requests[0].body, body);
  });

  const entries = await h.entriesLogged(refused.length + 1);
  const denied = entries.filter((entry) => entry.status === 403);
  assert.equal(denied.length, refused.length);
  assert.ok(
    denied.every((entry) =>
      entry.decision === "deny" && /llm\.server_tools/.test(entry.reason ?? "")
    ),
  );
});

Deno.test("startCredentialProxy() forwards server-side tools when the profile allows them", async () => {
  await using h = await Harness.start({ kind: "anthropic", policy: { serverTools: "allow" } });
  const body = JSON.stringify(anthropicBody({
    tools: [{ type: "web_fetch_20250910", name: "web_fetch" }],
    mcp_servers: [{ type: "url", url: "https://mcp.example.test/sse", name: "x" }],
  }));
  const result = await post(h, "/messages", body, { "x-api-key": h.token });
  assert.equal(result.status, 200, result.text);
  assert.equal(h.upstream.requests[0].body, body);
});

Deno.test("startCredentialProxy() refuses models outside llm.models with 403", async (t) => {
  await using h = await Harness.start({
    policy: { serverTools: "deny", models: ["fake-model", "small"] },
  });
  await t.step("another model", async () => {
    assertRefused(
      h,
      await post(h, "/chat/completions", JSON.parse(chatBody({ model: "gpt-4.1" }))),
      /model "gpt-4\.1" is not allowed; profile "work" allows only the models in llm\.models \("fake-model", "small"\)/,
    );
  });
  await t.step("no model at all (the provider's default could be any)", async () => {
    assertRefused(h, await post(h, "/chat/completions", { messages: [] }), /names no model/);
  });
  await t.step("embeddings with another model", async () => {
    assertRefused(
      h,
      await post(h, "/embeddings", { model: "text-embedding-3-large", input: "x" }),
      /not allowed/,
    );
  });
  await t.step("a listed model passes", async () => {
    const result = await post(h, "/chat/completions", chatBody({ model: "small" }));
    assert.equal(result.status, 200, result.text);
    assert.equal(h.upstream.requests.length, 1);
  });
});

Deno.test("startCredentialProxy() refuses a body that could be read two ways, and forwards the bytes it read", async (t) => {
  await using h = await Harness.start({ kind: "anthropic" });
  const invalid: [string, string | Uint8Array<ArrayBuffer>, RegExp][] = [
    // JSON.parse keeps the last "tools" (empty), a first-wins parser the web_fetch tool.
    [
      "a duplicate key",
      `{"model":"m","max_tokens":1,"messages":[],"tools":[{"type":"web_fetch_20250910","name":"f"}],"tools":[]}`,
      /duplicate key "tools"/,
    ],
    [
      "a duplicate key spelled with an escape",
      `{"model":"m","tools":[],"\\u0074ools":[{"type":"web_fetch_20250910","name":"f"}]}`,
      /duplicate key "tools"/,
    ],
    [
      "a duplicate key in a nested object",
      `{"model":"m","tools":[{"type":"bash_20250124","type":"web_fetch_20250910","name":"f"}]}`,
      /duplicate key "type"/,
    ],
    ["a key with an unpaired surrogate", `{"model":"m","tools\\ud800":[]}`, /unpaired surrogate/],
    ["not JSON", `{"model": "m",}`, /not strict JSON/],
    ["a byte order mark", "\ufeff{}", /not strict JSON/],
    [
      "bytes that are not UTF-8",
      new Uint8Array([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]),
      /not UTF-8/,
    ],
    ["an empty body", "", /not strict JSON/],
    ["an array", "[]", /not a JSON object/],
  ];
  for (const [name, body, message] of invalid) {
    await t.step(`${name} is refused with 400`, async () => {
      const response = await fetch(h.url("/messages"), {
        method: "POST",
        headers: { "x-api-key": h.token },
        body,
      });
      const text = await response.text();
      assert.equal(response.status, 400, text);
      assert.equal(JSON.parse(text).error.type, "invalid_request_error");
      assert.match(JSON.parse(text).error.message, message);
      assert.equal(h.upstream.requests.length, 0);
    });
  }
  await t.step("the same request without the duplicate passes, byte for byte", async () => {
    // Spacing, an escape and a number JSON.stringify would rewrite: the upstream gets these bytes.
    const body =
      `{ "model" : "m", "max_tokens": 1.0, "seed": 12345678901234567890,\n"messages": [], "tools": [], "note": "\\u0041" }`;
    const result = await post(h, "/messages", body, { "x-api-key": h.token });
    assert.equal(result.status, 200, result.text);
    assert.equal(h.upstream.requests[0].body, body);
  });
});

// ---------------------------------------------------------------------------------------------
// Secrets reflected back

Deno.test("startCredentialProxy() redacts a key an upstream echoes in the body, a header and the status", async (t) => {
  for (const kind of ["openai", "anthropic"] as const) {
    await t.step(kind, async () => {
      await using h = await Harness.start({ kind });
      h.upstream.behaviour = "echo_credentials";
      const response = await fetch(h.url(kind === "openai" ? "/chat/completions" : "/messages"), {
        method: "POST",
        headers: { authorization: `Bearer ${h.token}` },
        body: kind === "openai" ? chatBody() : JSON.stringify(anthropicBody()),
      });
      const text = await response.text();
      // The upstream did receive the key, and echoed it: that is what is being defended against.
      assert.equal(h.upstream.requests.length, 1);
      assert.equal(response.status, 400);
      const headers = [...response.headers].map(([name, value]) => `${name}: ${value}`).join("\n");
      assert.ok(!text.includes(REAL_KEY), `the key in the body: ${text}`);
      assert.ok(!headers.includes(REAL_KEY), `the key in the headers: ${headers}`);
      const echoed = kind === "openai" ? `Bearer ${REDACTED}` : REDACTED;
      assert.equal(JSON.parse(text).error.received, echoed);
      assert.equal(response.headers.get("x-echo-credential"), echoed);
    });
  }
});

Deno.test("startCredentialProxy() redacts a key echoed in SSE split at every byte boundary", async (t) => {
  await using h = await Harness.start();
  h.upstream.behaviour = "controlled_stream";
  const echo = `Bearer ${REAL_KEY}`;
  const preamble = 'data: {"leak":"';
  const expected = `data: {"leak":"Bearer ${REDACTED}"}\n\ndata: [DONE]\n\n`;
  const decoder = new TextDecoder();

  await t.step("two chunks, split at each position of the echoed header", async () => {
    for (let split = 0; split <= echo.length; split++) {
      const started = h.upstream.nextStream();
      const response = await fetch(h.url("/chat/completions"), {
        method: "POST",
        headers: { authorization: `Bearer ${h.token}` },
        body: chatBody({ stream: true }),
      });
      const upstream = await started;
      const reader = response.body!.getReader();
      upstream.sendRaw(preamble + echo.slice(0, split));
      // Everything that cannot be the start of a secret is passed on at once: the preamble arrives
      // while the upstream still holds the rest, so the split really happens at the proxy.
      let text = await readUntil(reader, decoder, preamble);
      upstream.sendRaw(echo.slice(split) + '"}\n\n');
      upstream.end("[DONE]");
      text = await readUntil(reader, decoder, "[DONE]", text);
      assert.equal((await reader.read()).done, true);
      assert.equal(text, expected, `split at ${split}`);
    }
  });

  await t.step("one byte per chunk", async () => {
    const started = h.upstream.nextStream();
    const response = await fetch(h.url("/chat/completions"), {
      method: "POST",
      headers: { authorization: `Bearer ${h.token}` },
      body: chatBody({ stream: true }),
    });
    const upstream = await started;
    for (const char of `${preamble}${echo}"}\n\n`) upstream.sendRaw(char);
    upstream.end("[DONE]");
    assert.equal(await response.text(), expected);
  });
});
