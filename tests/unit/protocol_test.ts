import { MESSAGE_KEYS, USAGE_KEYS } from "../_seed_schema.ts";
import assert from "node:assert/strict";
import { SandboxError } from "../../lib/errors.ts";
import {
  agenticMessage,
  decodeMessage,
  decodeMessages,
  decodeMessageStream,
  encodeMessage,
  MAX_TOOL_OUTPUT_CHARS,
  ProtocolError,
} from "../../lib/run/protocol.ts";

/** Lines that count how many of them were pulled. */
function countingLines(lines: string[]): { lines: AsyncIterable<string>; pulled: () => number } {
  let pulled = 0;
  async function* generate() {
    for (const line of lines) {
      pulled++;
      yield line;
    }
  }
  return { lines: generate(), pulled: () => pulled };
}

async function decodeAll(lines: string[]) {
  return await Array.fromAsync(decodeMessages(lines));
}

Deno.test("encodeMessage writes every field, absent ones as null, in wire order", () => {
  const line = encodeMessage({ type: "thinking", content: "hmm" });
  assert.ok(!line.includes("\n"));
  const parsed = JSON.parse(line);
  assert.deepEqual(Object.keys(parsed), MESSAGE_KEYS);
  assert.deepEqual(parsed, {
    type: "thinking",
    content: "hmm",
    tool_name: null,
    tool_input: null,
    tool_output: null,
    tool_call_id: null,
    session_id: null,
    is_error: false,
    model: null,
    usage: null,
  });
});

Deno.test("encodeMessage fills every usage field, unknown ones as null", () => {
  const parsed = JSON.parse(
    encodeMessage({ type: "usage", usage: { input_tokens: 5, model: "m" } }),
  );
  assert.deepEqual(Object.keys(parsed.usage), USAGE_KEYS);
  assert.deepEqual(parsed.usage, {
    input_tokens: 5,
    output_tokens: null,
    cache_read_tokens: null,
    cache_creation_tokens: null,
    cost_usd: null,
    duration_ms: null,
    num_turns: null,
    model: "m",
  });
});

Deno.test("encode then decode gives back the same message, for every type", async () => {
  const messages = [
    agenticMessage({ type: "thinking", content: "Let me look", model: "m" }),
    agenticMessage({
      type: "tool_call",
      tool_name: "write_file",
      tool_input: { file_path: "/w/a.txt", content: "x\ny", nested: { n: [1, 2] } },
      tool_call_id: "call_1",
    }),
    agenticMessage({
      type: "tool_result",
      tool_output: "ok ✓ 😀",
      tool_call_id: "call_1",
      is_error: true,
    }),
    agenticMessage({ type: "result", content: "Done", session_id: "s-1" }),
    agenticMessage({
      type: "usage",
      usage: {
        input_tokens: 10,
        output_tokens: 3,
        cache_read_tokens: 0,
        cache_creation_tokens: 1,
        cost_usd: 0.0012,
        duration_ms: 1500,
        num_turns: 2,
        model: "m",
      },
    }),
  ];
  const decoded = await decodeAll(messages.map((m) => encodeMessage(m)));
  assert.deepEqual(decoded, messages);
});

Deno.test("encodeMessage truncates tool_output to 10,000 characters, never inside a surrogate pair", () => {
  const long = JSON.parse(encodeMessage({ type: "tool_result", tool_output: "a".repeat(25_000) }));
  assert.equal(long.tool_output, "a".repeat(MAX_TOOL_OUTPUT_CHARS));
  const exact = JSON.parse(encodeMessage({ type: "tool_result", tool_output: "b".repeat(10_000) }));
  assert.equal(exact.tool_output.length, 10_000);
  const emoji = "a".repeat(MAX_TOOL_OUTPUT_CHARS - 1) + "😀tail";
  const cut = JSON.parse(encodeMessage({ type: "tool_result", tool_output: emoji }));
  assert.equal(cut.tool_output, "a".repeat(MAX_TOOL_OUTPUT_CHARS - 1));
  const content = JSON.parse(encodeMessage({ type: "result", content: "c".repeat(20_000) }));
  assert.equal(content.content.length, 20_000, "only tool_output is truncated");
});

Deno.test("decodeMessage reads a missing field as null and drops unknown keys", () => {
  const message = decodeMessage(JSON.stringify({ type: "result", content: "x", extra: 1 }));
  assert.deepEqual(message, agenticMessage({ type: "result", content: "x" }));
  const usage = decodeMessage(JSON.stringify({ type: "usage", usage: { input_tokens: 1 } }));
  assert.equal(usage.usage?.output_tokens, null);
});

Deno.test("decodeMessages raises at once on a bad line, naming it, without reading further", async (t) => {
  const good = encodeMessage({ type: "thinking", content: "ok" });
  const cases: [string, string, RegExp][] = [
    ["malformed JSON", `{"type": "thinking", "content": `, /line 2: not valid JSON/],
    [
      "an unknown type",
      JSON.stringify({ type: "lifecycle", content: "x" }),
      /line 2: unknown type "lifecycle"/,
    ],
    ["a missing type", JSON.stringify({ content: "x" }), /line 2: missing "type"/],
    ["a JSON value that is not an object", "[1,2]", /line 2: not a JSON object/],
    [
      "a schema violation",
      JSON.stringify({ type: "result", is_error: "yes" }),
      /line 2: is_error: /,
    ],
    [
      "a nested schema violation",
      JSON.stringify({ type: "usage", usage: { input_tokens: -1 } }),
      /line 2: usage\.input_tokens: /,
    ],
    [
      "tool_input that is not an object",
      JSON.stringify({ type: "tool_call", tool_input: [1] }),
      /line 2: tool_input: /,
    ],
  ];
  for (const [name, bad, pattern] of cases) {
    await t.step(`${name}`, async () => {
      const source = countingLines([good, bad, good, good]);
      const seen: string[] = [];
      const error = await (async () => {
        try {
          for await (const message of decodeMessages(source.lines)) seen.push(message.type);
        } catch (error) {
          return error;
        }
      })();
      assert.ok(error instanceof ProtocolError, `expected ProtocolError, got ${error}`);
      assert.ok(error instanceof SandboxError);
      assert.equal(error.lineNumber, 2);
      assert.match(error.message, pattern);
      assert.ok(
        error.message.includes(bad.slice(0, 20)),
        `the bad line is quoted: ${error.message}`,
      );
      assert.deepEqual(seen, ["thinking"]);
      assert.equal(source.pulled(), 2, "no line after the bad one is read");
    });
  }
});

Deno.test("ProtocolError quotes a long bad line cut to a few hundred characters", () => {
  const bad = `{"type":"thinking","content":"${"x".repeat(5000)}`;
  assert.throws(() => decodeMessage(bad, 7), (error: unknown) => {
    assert.ok(error instanceof ProtocolError);
    assert.equal(error.lineNumber, 7);
    assert.ok(error.message.length < 400, `message too long: ${error.message.length}`);
    assert.ok(error.line.endsWith("…"));
    return true;
  });
});

Deno.test("decodeMessages passes over blank lines but counts them for line numbers", async () => {
  const good = encodeMessage({ type: "result", content: "x" });
  assert.equal((await decodeAll(["", good, "   ", good])).length, 2);
  await assert.rejects(decodeAll(["", "", "nope"]), (error: unknown) => {
    assert.ok(error instanceof ProtocolError);
    assert.equal(error.lineNumber, 3);
    return true;
  });
});

Deno.test("decodeMessages raises on a line over the cap", async () => {
  const line = encodeMessage({ type: "thinking", content: "x".repeat(100) });
  await assert.rejects(
    Array.fromAsync(decodeMessages([line, line], { maxLineChars: 50 })),
    (error: unknown) =>
      error instanceof ProtocolError && error.lineNumber === 1 &&
      /longer than 50/.test(error.message),
  );
});

Deno.test("decodeMessageStream caps lines while reading bytes, even an unterminated one", async () => {
  const encoder = new TextEncoder();
  const good = encodeMessage({ type: "thinking", content: "ok" });
  const bytes = ReadableStream.from([encoder.encode(`${good}\n`), encoder.encode("x".repeat(300))]);
  const seen: string[] = [];
  await assert.rejects(
    (async () => {
      for await (const message of decodeMessageStream(bytes, { maxLineChars: 200 })) {
        seen.push(message.type);
      }
    })(),
    (error: unknown) =>
      error instanceof ProtocolError && error.lineNumber === 2 &&
      /longer than 200/.test(error.message),
  );
  assert.deepEqual(seen, ["thinking"]);
});

Deno.test("decodeMessageStream decodes messages split across chunk boundaries", async () => {
  const text = [
    encodeMessage({ type: "thinking", content: "héllo" }),
    encodeMessage({ type: "result", content: "wörld" }),
    encodeMessage({ type: "usage", usage: { num_turns: 1 } }),
  ].join("\r\n") + "\n";
  const bytes = new TextEncoder().encode(text);
  const chunks = [bytes.slice(0, 7), bytes.slice(7, 50), bytes.slice(50, 131), bytes.slice(131)];
  const messages = await Array.fromAsync(decodeMessageStream(ReadableStream.from(chunks)));
  assert.deepEqual(messages.map((m) => m.type), ["thinking", "result", "usage"]);
  assert.equal(messages[1].content, "wörld");
});
