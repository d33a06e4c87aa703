/**
 * What one run may spend, enforced where its traffic passes on the host: the credential proxy
 * (LLM tokens, estimated cost, requests) and the egress proxy (bytes both ways, requests). The
 * sandbox holds no handle on any of it.
 *
 * - A request that would start with a budget already used up (or once any budget was passed) is
 *   refused, and counted nowhere.
 *   LLM and egress requests are counted when they start, so many small requests (or many at once)
 *   never pass `requests` / `egress_requests`.
 * - Tokens and cost are charged from the usage the upstream reports in each response: the JSON
 *   body's `usage`, or, in a stream, every event that carries usage (Anthropic's `message_start`
 *   and `message_delta`, OpenAI's final chunk, the Responses API's `response.completed`). A stream
 *   is cut before the event that takes it past the budget. A successful response that reports no
 *   usage is charged an estimate (a token per four bytes of request and of response), never zero.
 * - Egress bytes are charged as they cross, both ways; past the budget every connection is cut.
 * - Passing a budget (a refusal, a cut, a charge past the limit) calls `onExceeded` once, with the
 *   `budget_exceeded` error the run ends with.
 */
import { SandboxError } from "../errors.ts";
import { type CallTokens, costOf, roundUsd } from "../run/prices.ts";
import type { DriverUsage } from "../run/protocol.ts";

/** The budgets, as the profile and the flags name them. */
export const BUDGET_NAMES = [
  "tokens",
  "cost_usd",
  "requests",
  "egress_bytes",
  "egress_requests",
] as const;
export type BudgetName = (typeof BUDGET_NAMES)[number];

/** Limits; an absent one is no limit. */
export type BudgetLimits = Partial<Record<BudgetName, number>>;
/** What was used, every budget counted (limited or not). */
export type BudgetUsage = Record<BudgetName, number>;

/** A token is about four bytes of text: the estimate for a response that reports no usage. */
export const BYTES_PER_ESTIMATED_TOKEN = 4;
/** Past this, a JSON response body is no longer kept for its `usage` (it is then estimated). */
const MAX_METERED_BODY_BYTES = 16 * 1024 * 1024;

/** A budget that was passed: which, its limit, and what was used. */
export interface BudgetOverrun {
  budget: BudgetName;
  limit: number;
  used: number;
  /** When the limit could not be checked at all (a model with no price). */
  reason?: string;
}

/** `tokens limit 1000, used 1234`, with a unit where the budget has one. */
export function describeOverrun(overrun: BudgetOverrun): string {
  const show = (n: number) =>
    overrun.budget === "cost_usd"
      ? `$${roundUsd(n)}`
      : overrun.budget === "egress_bytes"
      ? `${n} bytes`
      : String(n);
  const why = overrun.reason ? `: ${overrun.reason}` : "";
  return `${overrun.budget} limit ${show(overrun.limit)}, used ${show(overrun.used)}${why}`;
}

/** The error a run ends with when it passed a budget (exit `EXIT.budget`). */
export function budgetError(overrun: BudgetOverrun, scope = RUN_SCOPE): SandboxError {
  return new SandboxError(
    "budget_exceeded",
    `Budget exceeded: ${describeOverrun(overrun)} (${scope})`,
  );
}

const RUN_SCOPE = "the run's budget";

export interface RunBudgetOptions {
  /** Called once, with the error the run ends with, when the first budget is passed. */
  onExceeded?: (error: SandboxError) => void;
  /** Whose limit each is, where it is not the run's own (`what is left of the day's budget`). */
  scopes?: Partial<Record<BudgetName, string>>;
}

/** The spending of one run against its limits; shared by the run's proxies. */
export class RunBudget {
  readonly limits: Readonly<BudgetLimits>;
  readonly #used: BudgetUsage = {
    tokens: 0,
    cost_usd: 0,
    requests: 0,
    egress_bytes: 0,
    egress_requests: 0,
  };
  #input = 0;
  #output = 0;
  #costKnown = true;
  #overrun: BudgetOverrun | undefined;
  readonly #onExceeded: ((error: SandboxError) => void) | undefined;
  readonly #scopes: Partial<Record<BudgetName, string>>;

  constructor(limits: BudgetLimits, options: RunBudgetOptions = {}) {
    this.limits = { ...limits };
    this.#onExceeded = options.onExceeded;
    this.#scopes = options.scopes ?? {};
  }

  /** What was used so far. */
  get used(): Readonly<BudgetUsage> {
    return { ...this.#used, cost_usd: roundUsd(this.#used.cost_usd) };
  }

  /** The first budget passed, if one was. */
  get overrun(): BudgetOverrun | undefined {
    return this.#overrun;
  }

  /** True when some limit applies to egress (the egress proxy must then be on the path). */
  get limitsEgress(): boolean {
    return this.limits.egress_bytes !== undefined || this.limits.egress_requests !== undefined;
  }

  /** Why an LLM request may not start (a message for the agent), or undefined: then it is counted. */
  admitLlm(): string | undefined {
    const passed = this.#overrun ?? this.#firstAtLimit(["tokens", "cost_usd", "requests"]);
    if (passed) return this.#refuse(passed);
    this.#used.requests++;
    return undefined;
  }

  /**
   * Charge what one call of `model` (as the upstream names it) reported: its new total less what
   * was charged for it before. False when this takes a budget past its limit; under a cost budget,
   * a model with no price passes it (its cost cannot be held).
   */
  chargeLlm(model: string | null, delta: CallTokens): boolean {
    this.#input += delta.input;
    this.#output += delta.output;
    this.#used.tokens += delta.input + delta.output;
    const cost = costOf(model, delta);
    if (cost === null) this.#costKnown = false;
    else this.#used.cost_usd += cost;
    if (cost === null && this.limits.cost_usd !== undefined) {
      this.#exceed({
        budget: "cost_usd",
        limit: this.limits.cost_usd,
        used: this.used.cost_usd,
        reason: `the price of model "${model}" is unknown, so its cost cannot be held`,
      });
      return false;
    }
    const passed = this.#firstPast(["tokens", "cost_usd"]);
    if (!passed) return true;
    this.#exceed(passed);
    return false;
  }

  /** Why an egress request may not start, or undefined: then it is counted. */
  admitEgress(): string | undefined {
    const passed = this.#overrun ?? this.#firstAtLimit(["egress_bytes", "egress_requests"]);
    if (passed) return this.#refuse(passed);
    this.#used.egress_requests++;
    return undefined;
  }

  /** Charge bytes that crossed the egress proxy: false once past `egress_bytes`. */
  chargeEgress(bytes: number): boolean {
    this.#used.egress_bytes += bytes;
    const passed = this.#firstPast(["egress_bytes"]);
    if (!passed) return true;
    this.#exceed(passed);
    return false;
  }

  /** The LLM usage charged so far, as the closing `usage` record carries it. */
  driverUsage(): Partial<DriverUsage> {
    return {
      input_tokens: this.#input,
      output_tokens: this.#output,
      ...(this.#costKnown ? { cost_usd: roundUsd(this.#used.cost_usd) } : {}),
    };
  }

  /** For the run's record (`sandbox runs --json`): limits, usage, and the budget passed. */
  record(): Record<string, unknown> {
    return {
      limits: this.limits,
      used: this.used,
      exceeded: this.#overrun ? describeOverrun(this.#overrun) : null,
    };
  }

  #firstAtLimit(names: BudgetName[]): BudgetOverrun | undefined {
    for (const budget of names) {
      const limit = this.limits[budget];
      if (limit !== undefined && this.#used[budget] >= limit) {
        return { budget, limit, used: this.used[budget] };
      }
    }
    return undefined;
  }

  #firstPast(names: BudgetName[]): BudgetOverrun | undefined {
    for (const budget of names) {
      const limit = this.limits[budget];
      if (limit !== undefined && this.#used[budget] > limit) {
        return { budget, limit, used: this.used[budget] };
      }
    }
    return undefined;
  }

  #refuse(overrun: BudgetOverrun): string {
    this.#exceed(overrun);
    return `${this.#scopes[overrun.budget] ?? RUN_SCOPE} is used up: ${describeOverrun(overrun)}`;
  }

  #exceed(overrun: BudgetOverrun): void {
    if (this.#overrun) return;
    this.#overrun = overrun;
    this.#onExceeded?.(budgetError(overrun, this.#scopes[overrun.budget]));
  }
}

/** Token counts an upstream reported for one call, as far as it has told so far. */
interface Reported {
  input?: number;
  output?: number;
  cacheRead?: number;
  cacheWrite?: number;
  model?: string;
}

/**
 * Meters one LLM response for `budget`. `push` takes each upstream chunk and returns the bytes
 * that may go on (a stream's complete events under the budget; a partial event waits for its
 * end) and whether the response is cut there. `end` charges what the response never reported.
 */
export class ResponseMeter {
  readonly #budget: RunBudget;
  readonly #stream: boolean;
  readonly #ok: boolean;
  readonly #requestBytes: number;
  #model: string | null;
  #charged: CallTokens = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 };
  #reported = false;
  #bytes = 0;
  #pending = new Uint8Array(0);
  #body: Uint8Array[] | undefined = [];
  #cut = false;
  readonly #decoder = new TextDecoder();

  constructor(
    budget: RunBudget,
    request: { model: string | null; bodyBytes: number },
    response: { status: number; contentType: string | null },
  ) {
    this.#budget = budget;
    this.#model = request.model;
    this.#requestBytes = request.bodyBytes;
    this.#ok = response.status >= 200 && response.status < 300;
    this.#stream = /^text\/event-stream/i.test(response.contentType ?? "");
  }

  push(chunk: Uint8Array): { pass: Uint8Array; cut: boolean } {
    if (this.#cut) return { pass: new Uint8Array(0), cut: true };
    this.#bytes += chunk.byteLength;
    if (!this.#stream) {
      if (this.#body && this.#bytes <= MAX_METERED_BODY_BYTES) this.#body.push(chunk);
      else this.#body = undefined;
      return { pass: chunk, cut: false };
    }
    const joined = concat(this.#pending, chunk);
    let passEnd = 0;
    for (const end of eventEnds(joined)) {
      const event = joined.subarray(passEnd, end);
      if (!this.#account(sseUsage(this.#decoder.decode(event)))) {
        this.#cut = true;
        return { pass: joined.slice(0, passEnd), cut: true };
      }
      passEnd = end;
    }
    this.#pending = joined.slice(passEnd);
    return { pass: joined.slice(0, passEnd), cut: false };
  }

  /**
   * The SSE error event a cut stream ends with, in the shape both SDKs raise as an API error
   * (Anthropic's `event: error`; OpenAI's chunk with an `error` object).
   */
  cutEvent(): Uint8Array {
    const overrun = this.#budget.overrun;
    const message = `sandbox credential proxy: the response was cut at the run's budget: ${
      overrun ? describeOverrun(overrun) : "used up"
    }`;
    const data = JSON.stringify({ type: "error", error: { type: "permission_error", message } });
    return new TextEncoder().encode(`event: error\ndata: ${data}\n\n`);
  }

  /** At the end of the upstream body: what was held back, after charging what was not reported. */
  end(): Uint8Array {
    if (this.#cut) return new Uint8Array(0);
    if (!this.#stream && this.#body) {
      try {
        this.#account(reportedUsage(JSON.parse(this.#decoder.decode(concat(...this.#body)))));
      } catch {
        // Not JSON (an error page): nothing reported; estimated below if it was a success.
      }
    }
    if (!this.#reported && this.#ok) {
      this.#charge({
        input: Math.ceil(this.#requestBytes / BYTES_PER_ESTIMATED_TOKEN),
        output: Math.ceil(this.#bytes / BYTES_PER_ESTIMATED_TOKEN),
      });
    }
    const rest = this.#pending;
    this.#pending = new Uint8Array(0);
    return rest;
  }

  /** Charge a report (the call's totals so far); false when that passes a budget. */
  #account(reported: Reported | undefined): boolean {
    if (!reported) return true;
    if (reported.model) this.#model = reported.model;
    const has = (n: number | undefined) => n !== undefined;
    if (!has(reported.input) && !has(reported.output)) return true;
    this.#reported = true;
    const total: CallTokens = {
      input: Math.max(this.#charged.input, reported.input ?? 0),
      output: Math.max(this.#charged.output, reported.output ?? 0),
      cacheRead: Math.max(this.#charged.cacheRead ?? 0, reported.cacheRead ?? 0),
      cacheWrite: Math.max(this.#charged.cacheWrite ?? 0, reported.cacheWrite ?? 0),
    };
    return this.#charge({
      input: total.input - this.#charged.input,
      output: total.output - this.#charged.output,
      cacheRead: total.cacheRead! - this.#charged.cacheRead!,
      cacheWrite: total.cacheWrite! - this.#charged.cacheWrite!,
    }, total);
  }

  #charge(delta: CallTokens, total?: CallTokens): boolean {
    this.#charged = total ?? {
      input: this.#charged.input + delta.input,
      output: this.#charged.output + delta.output,
      cacheRead: this.#charged.cacheRead,
      cacheWrite: this.#charged.cacheWrite,
    };
    return this.#budget.chargeLlm(this.#model, delta);
  }
}

/** Offsets just past each complete SSE event (a blank line ends one) in `bytes`. */
function* eventEnds(bytes: Uint8Array): Generator<number> {
  for (let i = 0; i + 1 < bytes.length; i++) {
    if (bytes[i] !== 0x0a) continue;
    if (bytes[i + 1] === 0x0a) {
      yield i + 2;
      i++;
    } else if (bytes[i + 1] === 0x0d && bytes[i + 2] === 0x0a) {
      yield i + 3;
      i += 2;
    }
  }
}

/** The usage one SSE event reports, if any (its `data:` lines as JSON). */
function sseUsage(event: string): Reported | undefined {
  const data = event.split(/\r?\n/).filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).trimStart()).join("\n");
  if (data === "" || data === "[DONE]") return undefined;
  try {
    return reportedUsage(JSON.parse(data));
  } catch {
    return undefined; // Not JSON: an event that reports nothing.
  }
}

/**
 * The usage in an OpenAI (Chat Completions or Responses) or Anthropic body or stream event, in
 * one shape: `input` counts every input token, cached ones included (Anthropic reports those
 * apart from `input_tokens`).
 */
export function reportedUsage(value: unknown): Reported | undefined {
  if (typeof value !== "object" || value === null) return undefined;
  const v = value as Record<string, unknown>;
  const inner = (v.message ?? v.response) as Record<string, unknown> | undefined;
  const usage = (v.usage ?? inner?.usage) as Record<string, unknown> | undefined | null;
  const model = typeof (v.model ?? inner?.model) === "string"
    ? (v.model ?? inner?.model) as string
    : undefined;
  if (typeof usage !== "object" || usage === null) return model ? { model } : undefined;
  const n = (x: unknown) => (typeof x === "number" && Number.isFinite(x) && x >= 0 ? x : undefined);
  if (n(usage.prompt_tokens) !== undefined || n(usage.completion_tokens) !== undefined) {
    const details = usage.prompt_tokens_details as Record<string, unknown> | undefined;
    return {
      model,
      input: n(usage.prompt_tokens),
      output: n(usage.completion_tokens),
      cacheRead: n(details?.cached_tokens),
    };
  }
  const cacheRead = n(usage.cache_read_input_tokens);
  const cacheWrite = n(usage.cache_creation_input_tokens);
  const details = usage.input_tokens_details as Record<string, unknown> | undefined;
  const input = n(usage.input_tokens);
  const anthropic = cacheRead !== undefined || cacheWrite !== undefined || v.type === "message" ||
    v.type === "message_start" || v.type === "message_delta";
  return {
    model,
    input: anthropic && input !== undefined ? input + (cacheRead ?? 0) + (cacheWrite ?? 0) : input,
    output: n(usage.output_tokens),
    cacheRead: anthropic ? cacheRead : n(details?.cached_tokens),
    cacheWrite: anthropic ? cacheWrite : undefined,
  };
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const total = parts.reduce((sum, part) => sum + part.byteLength, 0);
  const joined = new Uint8Array(total);
  let offset = 0;
  for (const part of parts) {
    joined.set(part, offset);
    offset += part.byteLength;
  }
  return joined;
}
