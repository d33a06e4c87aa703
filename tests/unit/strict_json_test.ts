import assert from "node:assert/strict";
import { MAX_DEPTH, parseStrictJson } from "../../lib/proxy/strict_json.ts";

const encode = (text: string) => new TextEncoder().encode(text);

function parse(text: string) {
  return parseStrictJson(encode(text));
}

function reason(text: string | Uint8Array): string {
  const result = typeof text === "string" ? parse(text) : parseStrictJson(text);
  assert.equal(result.kind, "invalid", `accepted: ${String(text)}`);
  return result.kind === "invalid" ? result.reason : "";
}

Deno.test("parseStrictJson() reads what JSON.parse reads for valid JSON", () => {
  const samples = [
    `{"model":"m","messages":[{"role":"user","content":"h\\u00e9 \\"q\\" \\\\ \\/ \\b\\f\\n\\r\\t"}]}`,
    ` [1, -0, 0.5, -1.25e+3, 1E-2, 12345678901234567890, true, false, null, "", {}, []] `,
    `{"__proto__": {"polluted": true}, "constructor": 1}`,
    `"\\ud83d\\ude00 emoji pair"`,
    `{"a":{"b":{"c":[{"d":"e"}]}}}`,
    "\t\n\r 42 \n",
  ];
  for (const text of samples) {
    const result = parse(text);
    assert.equal(result.kind, "ok", text);
    if (result.kind === "ok") assert.deepEqual(result.value, JSON.parse(text), text);
  }
  const proto = parse(`{"__proto__": {"polluted": true}}`);
  assert.ok(proto.kind === "ok" && Object.hasOwn(proto.value as object, "__proto__"));
  assert.equal(({} as Record<string, unknown>).polluted, undefined);
});

Deno.test("parseStrictJson() refuses duplicate keys, however they are spelled", () => {
  assert.match(reason(`{"tools":[],"tools":[1]}`), /duplicate key "tools"/);
  assert.match(reason(`{"tools":[],"\\u0074ools":[1]}`), /duplicate key "tools"/);
  assert.match(reason(`{"a":{"x":1,"x":2}}`), /duplicate key "x"/);
  assert.match(reason(`[{"ok":1},{"k":1,"k":1}]`), /duplicate key "k"/);
  // The same key in sibling objects is not a duplicate.
  assert.equal(parse(`[{"k":1},{"k":2}]`).kind, "ok");
});

Deno.test("parseStrictJson() refuses what parsers read differently or not at all", () => {
  assert.match(reason(`{"a\\ud800":1}`), /unpaired surrogate/);
  assert.match(reason(`{"\\udc00":1}`), /unpaired surrogate/);
  assert.match(reason(new Uint8Array([0xef, 0xbb, 0xbf, 0x7b, 0x7d])), /unexpected character/);
  assert.match(reason(new Uint8Array([0x22, 0xc3, 0x28, 0x22])), /not UTF-8/);
  const bad = [
    "",
    " ",
    "{",
    "}",
    `{"a":1,}`,
    "[1,]",
    `{'a':1}`,
    `{a:1}`,
    "01",
    "1.",
    ".5",
    "+1",
    "-",
    "NaN",
    "Infinity",
    "tru",
    "nul",
    `"\\x41"`,
    `"\\u12"`,
    `"a\tb"`,
    `"unterminated`,
    "{} {}",
    "/* c */ {}",
    `{"a" 1}`,
    `{"a":1 "b":2}`,
    "[1 2]",
    "\u00a0{}",
  ];
  for (const text of bad) reason(text);
});

Deno.test("parseStrictJson() refuses nesting deeper than its limit and accepts it up to the limit", () => {
  assert.equal(parse("[".repeat(MAX_DEPTH) + "]".repeat(MAX_DEPTH)).kind, "ok");
  assert.match(reason("[".repeat(MAX_DEPTH + 1) + "]".repeat(MAX_DEPTH + 1)), /nesting deeper/);
  assert.match(reason("[".repeat(100_000)), /nesting deeper/);
});
