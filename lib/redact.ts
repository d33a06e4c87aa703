/**
 * Scrubbing secrets (API keys, proxy tokens) out of text before it is logged or shown.
 *
 * Every value that must never leave the host process is registered here once, when it is first
 * known; every log line and error message that could echo it passes through `redact()`.
 */

/** What a secret is replaced with. */
export const REDACTED = "[REDACTED]";

/**
 * Shorter values are not registered: replacing them would mangle ordinary text ("true", a port
 * number), and no real key or token is this short.
 */
export const MIN_SECRET_CHARS = 8;

/** Replaces every registered secret in text, strings of objects, JSON, and byte streams. */
export class Redactor {
  readonly #secrets = new Set<string>();
  /** One alternation of all secrets, longest first; rebuilt lazily after `add()`. */
  #pattern: RegExp | null = null;
  /** The same for bytes (see `ByteForms`); rebuilt lazily after `add()`. */
  #byteForms: ByteForms | null = null;

  /** Register a secret. Values shorter than `MIN_SECRET_CHARS` are ignored. */
  add(secret: string): void {
    if (secret.length < MIN_SECRET_CHARS) return;
    // A secret inside a JSON string is escaped ("\"" and "\\" and control characters), so the
    // escaped spelling is registered too: `redact(JSON.stringify(value))` must catch it.
    for (const form of [secret, JSON.stringify(secret).slice(1, -1)]) {
      if (this.#secrets.has(form)) continue;
      this.#secrets.add(form);
      this.#pattern = null;
      this.#byteForms = null;
    }
  }

  /** How many spellings of secrets are registered (for tests and diagnostics). */
  get size(): number {
    return this.#secrets.size;
  }

  /** `text` with every registered secret replaced by `REDACTED`. */
  redact(text: string): string {
    if (this.#secrets.size === 0) return text;
    this.#pattern ??= new RegExp(
      // Longest first, so that a secret containing another secret is replaced whole.
      [...this.#secrets].sort((a, b) => b.length - a.length).map(escapeRegExp).join("|"),
      "g",
    );
    return text.replace(this.#pattern, REDACTED);
  }

  /**
   * A deep copy of `value` with secrets replaced in every string, object key included.
   * Non-plain objects (Date, class instances) are left as they are.
   */
  redactValue<T>(value: T): T {
    return this.#redactDeep(value) as T;
  }

  /** A JSON string with secrets replaced; the result is still valid JSON. */
  redactJson(json: string): string {
    // Replacing inside string literals keeps JSON valid: REDACTED contains no quote or backslash.
    return this.redact(json);
  }

  /**
   * A redactor for one byte stream (a response body), fed chunk by chunk. It uses the secrets
   * registered at each chunk, so a key registered before the first chunk is always covered.
   */
  stream(): StreamRedactor {
    return new StreamRedactor(() => this.#bytes());
  }

  #bytes(): ByteForms {
    if (this.#byteForms === null) {
      // Longest first, as in `redact()`, so that both give the same answer for the same text.
      const forms = [...this.#secrets].map((secret) => BYTES.decode(UTF8.encode(secret)))
        .sort((a, b) => b.length - a.length);
      this.#byteForms = {
        forms,
        pattern: forms.length === 0 ? null : new RegExp(forms.map(escapeRegExp).join("|"), "g"),
        longest: forms[0]?.length ?? 0,
      };
    }
    return this.#byteForms;
  }

  #redactDeep(value: unknown): unknown {
    if (typeof value === "string") return this.redact(value);
    if (Array.isArray(value)) return value.map((item) => this.#redactDeep(item));
    if (value !== null && typeof value === "object" && isPlainObject(value)) {
      return Object.fromEntries(
        Object.entries(value).map(([key, item]) => [this.redact(key), this.#redactDeep(item)]),
      );
    }
    return value;
  }
}

const UTF8 = new TextEncoder();
/**
 * Bytes as text with one character per byte, so that positions in the text are positions in the
 * bytes and any byte sequence (not only UTF-8) can be searched. The WHATWG "latin1" label is
 * windows-1252: a single-byte encoding that maps each of the 256 byte values to one UTF-16 unit.
 */
const BYTES = new TextDecoder("latin1");
const REDACTED_BYTES = UTF8.encode(REDACTED);

/** Every secret's UTF-8 bytes, in the one-character-per-byte spelling of `BYTES`. */
interface ByteForms {
  forms: string[];
  pattern: RegExp | null;
  longest: number;
}

/**
 * Redacts a byte stream as it passes, without buffering it: each `push()` returns at once every
 * byte that cannot be the start of a secret, and holds back only a tail that could be (at most the
 * longest secret's length minus one, and usually nothing: an SSE event ends in a blank line, which
 * no secret starts with). A secret split across chunks, even one byte per chunk, is caught. The
 * bytes returned over the whole stream are exactly those of `redact()` applied to the whole.
 */
export class StreamRedactor {
  readonly #forms: () => ByteForms;
  #carry: Uint8Array = new Uint8Array(0);

  constructor(forms: () => ByteForms) {
    this.#forms = forms;
  }

  /** The redacted bytes that can be passed on now (possibly none). */
  push(chunk: Uint8Array): Uint8Array {
    return this.#process(concat([this.#carry, chunk]), false);
  }

  /** The rest, at the end of the stream. */
  end(): Uint8Array {
    return this.#process(this.#carry, true);
  }

  #process(bytes: Uint8Array, final: boolean): Uint8Array {
    const { forms, pattern, longest } = this.#forms();
    this.#carry = new Uint8Array(0);
    if (pattern === null || bytes.length === 0) return bytes;
    const text = BYTES.decode(bytes);
    const out: Uint8Array[] = [];
    let position = 0;
    while (true) {
      pattern.lastIndex = position;
      const match = pattern.exec(text);
      // From `hold` on, the text may be the start of a secret that the next chunk completes: a
      // match there is not final (a longer secret may win), and a match before it is (any longer
      // secret starting there would make it the start of a secret, and `hold` would be earlier).
      const hold = final ? text.length : heldFrom(text, forms, longest, position);
      if (match !== null && match.index < hold) {
        out.push(bytes.subarray(position, match.index), REDACTED_BYTES);
        position = match.index + match[0].length;
        continue;
      }
      out.push(bytes.subarray(position, hold));
      this.#carry = bytes.slice(hold);
      return concat(out);
    }
  }
}

/** The first index at or after `from` where the rest of `text` is a proper prefix of a secret. */
function heldFrom(text: string, forms: string[], longest: number, from: number): number {
  for (let start = Math.max(from, text.length - longest + 1); start < text.length; start++) {
    const tail = text.slice(start);
    if (forms.some((form) => form.length > tail.length && form.startsWith(tail))) return start;
  }
  return text.length;
}

function concat(chunks: Uint8Array[]): Uint8Array {
  const nonEmpty = chunks.filter((chunk) => chunk.length > 0);
  if (nonEmpty.length === 1) return nonEmpty[0];
  const joined = new Uint8Array(nonEmpty.reduce((total, chunk) => total + chunk.length, 0));
  let offset = 0;
  for (const chunk of nonEmpty) {
    joined.set(chunk, offset);
    offset += chunk.length;
  }
  return joined;
}

function isPlainObject(value: object): boolean {
  const prototype = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null;
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
