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

/** Replaces every registered secret in text, strings of objects, and JSON. */
export class Redactor {
  readonly #secrets = new Set<string>();
  /** One alternation of all secrets, longest first; rebuilt lazily after `add()`. */
  #pattern: RegExp | null = null;

  /** Register a secret. Values shorter than `MIN_SECRET_CHARS` are ignored. */
  add(secret: string): void {
    if (secret.length < MIN_SECRET_CHARS) return;
    // A secret inside a JSON string is escaped ("\"" and "\\" and control characters), so the
    // escaped spelling is registered too: `redact(JSON.stringify(value))` must catch it.
    for (const form of [secret, JSON.stringify(secret).slice(1, -1)]) {
      if (this.#secrets.has(form)) continue;
      this.#secrets.add(form);
      this.#pattern = null;
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

function isPlainObject(value: object): boolean {
  const prototype = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null;
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
