import assert from "node:assert/strict";
import { agenticMessage } from "../../lib/run/protocol.ts";
import { escapeControls, renderMessage } from "../../lib/run/transcript.ts";

/** Any control character a terminal could act on: C0 but newline and tab, DEL, C1, bidi overrides. */
// deno-lint-ignore no-control-regex
const ACTIVE = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/;

Deno.test("escapeControls() shows each control character as a visible escape and keeps newline and tab", () => {
  assert.equal(escapeControls("\x1b]0;pwned\x07"), "\\e]0;pwned\\a");
  assert.equal(escapeControls("\x1b[2J\x1b[H"), "\\e[2J\\e[H");
  assert.equal(escapeControls("safe\rEVIL"), "safe\\rEVIL");
  assert.equal(escapeControls("a\r\nb"), "a\nb");
  assert.equal(escapeControls("\u009b31m red \u009d0;t\u009c"), "\\u009b31m red \\u009d0;t\\u009c");
  assert.equal(
    escapeControls("del\x7f nul\0 bs\b vt\v ff\f x\x01 y\x1f"),
    "del\\x7f nul\\0 bs\\b vt\\v ff\\f x\\x01 y\\x1f",
  );
  assert.equal(escapeControls("rm -rf \u202e/ txt.exe"), "rm -rf \\u202e/ txt.exe");
  assert.equal(
    escapeControls("line one\n\tindented — ünïcödé ✓"),
    "line one\n\tindented — ünïcödé ✓",
  );
  for (let code = 0; code < 0xa0; code++) {
    const shown = escapeControls(String.fromCharCode(code));
    if (code === 0x0a || code === 0x09 || (code >= 0x20 && code < 0x7f)) {
      assert.equal(shown, String.fromCharCode(code));
    } else {assert.ok(
        !ACTIVE.test(shown) && shown.startsWith("\\"),
        `U+${code.toString(16)} shown as ${JSON.stringify(shown)}`,
      );}
  }
});

Deno.test("renderMessage() escapes the agent's control characters in every kind of message", () => {
  const hostile = "\x1b]0;title\x07\x1b[2J\u009b2Jx\rY";
  const messages = [
    agenticMessage({ type: "thinking", content: hostile }),
    agenticMessage({
      type: "tool_call",
      tool_name: `exec${hostile}`,
      tool_input: { command: `printf '${hostile}'` },
    }),
    agenticMessage({
      type: "tool_result",
      tool_name: "execute",
      tool_output: `out\n${hostile}\nend`,
    }),
    agenticMessage({
      type: "tool_result",
      tool_name: hostile,
      tool_output: hostile,
      is_error: true,
    }),
    agenticMessage({ type: "result", content: hostile }),
    agenticMessage({
      type: "usage",
      usage: {
        input_tokens: 1,
        output_tokens: 2,
        cache_read_tokens: null,
        cache_creation_tokens: null,
        cost_usd: null,
        duration_ms: 5,
        num_turns: 1,
        model: hostile,
      },
    }),
  ];
  for (const message of messages) {
    const text = renderMessage(message);
    assert.ok(!ACTIVE.test(text), `${message.type}: ${JSON.stringify(text)}`);
    if (message.type !== "tool_call") {
      assert.match(text, /\\e\]0;title\\a\\e\[2J\\u009b2Jx\\rY/, message.type);
    }
  }
  // JSON already escapes C0 in tool input; C1 is escaped on top.
  assert.match(renderMessage(messages[1]), /\\u001b\]0;title\\u0007/);
  assert.match(renderMessage(messages[1]), /\\u009b2J/);
  assert.equal(
    renderMessage(messages[2]).split("\n").length,
    4,
    "newlines in the output stay line breaks",
  );
});
