/**
 * Strict JSON for request bodies the credential proxy decides on: one reading, or none.
 *
 * The proxy refuses or forwards a request on what its body says (which tools, which model), then
 * forwards the same bytes. That is only sound when the upstream reads those bytes exactly as the
 * proxy did. `JSON.parse` keeps the last of two equal keys, other parsers keep the first or fail,
 * so `{"tools": [], "tools": [{"type": "web_fetch_20250910"}]}` would be allowed here and obeyed
 * there. This parser accepts RFC 8259 JSON only, and refuses what parsers disagree on:
 *
 * - a key that appears twice in one object (after unescaping: `"a"` and `"\u0061"` are equal);
 * - a key with an unpaired surrogate (`"\ud800"`), which some parsers replace with U+FFFD, so that
 *   two different keys here could become one key there;
 * - bytes that are not UTF-8, and a byte order mark (some parsers skip it, others refuse it);
 * - nesting deeper than `MAX_DEPTH` (parsers' limits differ; no LLM request comes close).
 */

export type JsonValue = null | boolean | number | string | JsonValue[] | JsonObject;
export interface JsonObject {
  [key: string]: JsonValue;
}

export type StrictJsonResult =
  | { kind: "ok"; value: JsonValue }
  | { kind: "invalid"; reason: string };

export const MAX_DEPTH = 256;

class Invalid extends Error {}

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

/** Parse `bytes` (UTF-8) as strict JSON. */
export function parseStrictJson(bytes: Uint8Array): StrictJsonResult {
  let text: string;
  try {
    // ignoreBOM keeps a BOM in the text, where the parser refuses it like any other stray byte.
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch {
    return { kind: "invalid", reason: "the body is not UTF-8" };
  }
  try {
    return { kind: "ok", value: new Parser(text).document() };
  } catch (error) {
    if (error instanceof Invalid) return { kind: "invalid", reason: error.message };
    throw error;
  }
}

class Parser {
  #at = 0;
  constructor(readonly text: string) {}

  document(): JsonValue {
    this.#space();
    const value = this.#value(0);
    this.#space();
    if (this.#at !== this.text.length) this.#fail("unexpected data after the JSON value");
    return value;
  }

  #fail(what: string): never {
    throw new Invalid(`${what} at offset ${this.#at}`);
  }

  #space(): void {
    const text = this.text;
    while (this.#at < text.length) {
      const c = text.charCodeAt(this.#at);
      // RFC 8259 whitespace only: space, tab, line feed, carriage return.
      if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) return;
      this.#at++;
    }
  }

  #value(depth: number): JsonValue {
    // `depth` containers enclose this value; one more would be nested deeper than the limit.
    if (depth >= MAX_DEPTH && (this.text[this.#at] === "{" || this.text[this.#at] === "[")) {
      this.#fail(`nesting deeper than ${MAX_DEPTH}`);
    }
    const c = this.text[this.#at];
    if (c === "{") return this.#object(depth + 1);
    if (c === "[") return this.#array(depth + 1);
    if (c === '"') return this.#string();
    for (const [word, value] of [["true", true], ["false", false], ["null", null]] as const) {
      if (this.text.startsWith(word, this.#at)) {
        this.#at += word.length;
        return value;
      }
    }
    NUMBER.lastIndex = this.#at;
    const number = NUMBER.exec(this.text);
    if (number === null) {
      this.#fail(c === undefined ? "unexpected end of the body" : "unexpected character");
    }
    this.#at += number[0].length;
    return Number(number[0]);
  }

  #object(depth: number): JsonObject {
    this.#at++;
    const entries: [string, JsonValue][] = [];
    const seen = new Set<string>();
    this.#space();
    if (this.text[this.#at] === "}") {
      this.#at++;
      return {};
    }
    while (true) {
      this.#space();
      if (this.text[this.#at] !== '"') this.#fail("expected a key");
      const keyAt = this.#at;
      const key = this.#string();
      if (!key.isWellFormed()) {
        this.#at = keyAt;
        this.#fail("a key with an unpaired surrogate");
      }
      if (seen.has(key)) {
        this.#at = keyAt;
        this.#fail(`duplicate key ${JSON.stringify(key)}, which parsers read differently`);
      }
      seen.add(key);
      this.#space();
      if (this.text[this.#at] !== ":") this.#fail("expected ':'");
      this.#at++;
      this.#space();
      entries.push([key, this.#value(depth)]);
      this.#space();
      const next = this.text[this.#at];
      this.#at++;
      if (next === "}") break;
      if (next !== ",") {
        this.#at--;
        this.#fail("expected ',' or '}'");
      }
    }
    // fromEntries defines own properties, as JSON.parse does: "__proto__" is a plain key.
    return Object.fromEntries(entries);
  }

  #array(depth: number): JsonValue[] {
    this.#at++;
    const items: JsonValue[] = [];
    this.#space();
    if (this.text[this.#at] === "]") {
      this.#at++;
      return items;
    }
    while (true) {
      this.#space();
      items.push(this.#value(depth));
      this.#space();
      const next = this.text[this.#at];
      this.#at++;
      if (next === "]") return items;
      if (next !== ",") {
        this.#at--;
        this.#fail("expected ',' or ']'");
      }
    }
  }

  #string(): string {
    const text = this.text;
    const start = this.#at;
    let escaped = false;
    let i = start + 1;
    while (true) {
      if (i >= text.length) {
        this.#at = i;
        this.#fail("unterminated string");
      }
      const c = text.charCodeAt(i);
      if (c === 0x22) break;
      if (c < 0x20) {
        this.#at = i;
        this.#fail("a control character in a string");
      }
      if (c === 0x5c) {
        escaped = true;
        const e = text[i + 1];
        if (e === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) {
            this.#at = i;
            this.#fail("a bad \\u escape");
          }
          i += 6;
          continue;
        }
        if (e === undefined || !'"\\/bfnrt'.includes(e)) {
          this.#at = i;
          this.#fail("a bad escape");
        }
        i += 2;
        continue;
      }
      i++;
    }
    this.#at = i + 1;
    const literal = text.slice(start, i + 1);
    // The literal was checked above, so JSON.parse decodes exactly the escapes it holds.
    return escaped ? JSON.parse(literal) : literal.slice(1, -1);
  }
}
