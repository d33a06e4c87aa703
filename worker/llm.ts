/**
 * The LLM connection, from the environment only, and token accounting.
 *
 * - `SANDBOX_LLM_BASE_URL`: the host's credential proxy, e.g. `http://host:port/proxy/v1`
 * - `SANDBOX_LLM_TOKEN`: sent as the API key; a per-run proxy token, never a provider key
 * - `SANDBOX_LLM_MODEL`: the default model (`--model` overrides it)
 * - `SANDBOX_LLM_API`: "openai" (default: Chat Completions at `BASE/chat/completions`) or
 *   "anthropic" (Messages API at `BASE/messages`, the key sent as `x-api-key`)
 * - `SANDBOX_LLM_MAX_RETRIES`: retries per LLM request on transient errors (default 2)
 *
 * Nothing here may reach the network except the base URL: no tracing, no tokenizer downloads
 * (see `createChatModel`).
 */
import { ChatOpenAI } from "@langchain/openai";
import { ChatAnthropic } from "@langchain/anthropic";
import { BaseCallbackHandler } from "@langchain/core/callbacks/base";
import type { LLMResult } from "@langchain/core/outputs";
import type { AIMessage } from "@langchain/core/messages";
import type { DriverUsage } from "../lib/run/protocol.ts";
import { costOf, roundUsd } from "../lib/run/prices.ts";
import type { Emitter } from "./emit.ts";

export const DEFAULT_MAX_RETRIES = 2;

/** Variables removed from the worker's environment at start: no library may pick them up. */
const SCRUBBED_ENV = /^(OPENAI_|ANTHROPIC_|LANGSMITH_|LANGCHAIN_|LANGGRAPH_|AZURE_OPENAI_)/;

export type LlmApi = "openai" | "anthropic";

export interface LlmSettings {
  api: LlmApi;
  baseUrl: string;
  token: string;
  model: string;
  maxRetries: number;
}

/** A setting is missing or malformed; reported as an `is_error` result. */
export class LlmConfigError extends Error {
  override name = "LlmConfigError";
}

/** Settings from the environment; `model` (from `--model`) overrides `SANDBOX_LLM_MODEL`. */
export function llmSettings(env: Record<string, string | undefined>, model?: string): LlmSettings {
  const api = env.SANDBOX_LLM_API || "openai";
  if (api !== "openai" && api !== "anthropic") {
    throw new LlmConfigError(
      `Unsupported SANDBOX_LLM_API "${api}": expected "openai" or "anthropic"`,
    );
  }
  const baseUrl = env.SANDBOX_LLM_BASE_URL;
  if (!baseUrl) throw new LlmConfigError("SANDBOX_LLM_BASE_URL is not set");
  try {
    new URL(baseUrl);
  } catch {
    throw new LlmConfigError(`SANDBOX_LLM_BASE_URL is not a URL: "${baseUrl}"`);
  }
  const token = env.SANDBOX_LLM_TOKEN;
  if (!token) throw new LlmConfigError("SANDBOX_LLM_TOKEN is not set");
  const chosen = model || env.SANDBOX_LLM_MODEL;
  if (!chosen) throw new LlmConfigError("No model: pass --model or set SANDBOX_LLM_MODEL");
  const retries = env.SANDBOX_LLM_MAX_RETRIES;
  const maxRetries = retries === undefined || retries === ""
    ? DEFAULT_MAX_RETRIES
    : Number(retries);
  if (!Number.isInteger(maxRetries) || maxRetries < 0) {
    throw new LlmConfigError(`SANDBOX_LLM_MAX_RETRIES is not a non-negative integer: "${retries}"`);
  }
  return { api, baseUrl, token, model: chosen, maxRetries };
}

/**
 * Remove provider keys and tracing switches from this process's environment, so that no library
 * in the worker picks them up (the `execute` tool still gets the environment as given).
 */
export function scrubEnvironment(): void {
  for (const name of Object.keys(Deno.env.toObject())) {
    if (SCRUBBED_ENV.test(name)) Deno.env.delete(name);
  }
}

/**
 * Sums token usage over every LLM call made through a model it is attached to, and their cost:
 * each call priced for the model its response names (what the provider billed; in a replay, the
 * recorded model), else the model asked for. One call of an unpriced model makes the cost unknown.
 */
export class UsageTracker extends BaseCallbackHandler {
  name = "sandbox_usage_tracker";
  calls = 0;
  #input: number | null = null;
  #output: number | null = null;
  #cacheRead: number | null = null;
  #cacheCreation: number | null = null;
  /** USD so far; null once a call could not be priced (or before any call reported usage). */
  #cost: number | null = null;
  #costKnown = true;
  readonly #requestedModel: string | undefined;

  constructor(requestedModel?: string) {
    super();
    this.#requestedModel = requestedModel;
  }

  override handleLLMEnd(output: LLMResult): void {
    this.calls++;
    for (const generations of output.generations) {
      for (const generation of generations) {
        const message = (generation as { message?: AIMessage }).message;
        const usage = message?.usage_metadata;
        if (!usage) continue;
        this.#input = add(this.#input, usage.input_tokens);
        this.#output = add(this.#output, usage.output_tokens);
        this.#cacheRead = add(this.#cacheRead, usage.input_token_details?.cache_read);
        this.#cacheCreation = add(this.#cacheCreation, usage.input_token_details?.cache_creation);
        const metadata = message?.response_metadata as
          | { model_name?: unknown; model?: unknown }
          | undefined;
        const info = (generation as { generationInfo?: { model_name?: unknown } }).generationInfo;
        const billed = [metadata?.model_name, metadata?.model, info?.model_name].find((m) =>
          typeof m === "string" && m
        );
        const cost = costOf((billed as string | undefined) ?? this.#requestedModel, {
          input: usage.input_tokens ?? 0,
          output: usage.output_tokens ?? 0,
          cacheRead: usage.input_token_details?.cache_read,
          cacheWrite: usage.input_token_details?.cache_creation,
        });
        if (cost === null) this.#costKnown = false;
        else this.#cost = (this.#cost ?? 0) + cost;
      }
    }
  }

  /** The totals; a count is `null` when no response reported it. */
  usage(model: string, durationMs: number): Partial<DriverUsage> {
    return {
      input_tokens: this.#input,
      output_tokens: this.#output,
      cache_read_tokens: this.#cacheRead,
      cache_creation_tokens: this.#cacheCreation,
      cost_usd: this.#costKnown && this.#cost !== null ? roundUsd(this.#cost) : null,
      duration_ms: Math.round(durationMs),
      num_turns: this.calls,
      model,
    };
  }
}

/** `total + value`, where an unreported value (not a number) leaves the total as it was. */
function add(total: number | null, value: unknown): number | null {
  if (typeof value !== "number" || !Number.isFinite(value)) return total;
  return (total ?? 0) + value;
}

/** A chat model of either API. */
export type ChatModel = ChatOpenAI | ChatAnthropic;

/**
 * The chat model for the configured API and endpoint, reporting every call to `tracker`.
 *
 * `invoke()` never streams. For OpenAI with `streamable`, `stream()` really streams (SSE, usage
 * from the final chunk); otherwise LangChain turns `stream()` into `invoke()`. The trap avoided:
 * `ChatOpenAI({ streaming: true })` makes `invoke()` count tokens with a tokenizer it downloads.
 * The Anthropic SDK appends `/v1/messages` itself, so it gets the base URL without `/v1`.
 */
export function createChatModel(
  settings: LlmSettings,
  tracker: UsageTracker,
  options: { streamable?: boolean } = {},
): ChatModel {
  if (settings.api === "anthropic") {
    return new ChatAnthropic({
      model: settings.model,
      apiKey: settings.token,
      anthropicApiUrl: settings.baseUrl.replace(/\/v1\/?$/, ""),
      streaming: false,
      maxRetries: settings.maxRetries,
      callbacks: [tracker],
    });
  }
  return new ChatOpenAI({
    model: settings.model,
    apiKey: settings.token,
    configuration: { baseURL: settings.baseUrl },
    ...(options.streamable ? {} : { streaming: false }),
    maxRetries: settings.maxRetries,
    callbacks: [tracker],
  });
}

/** The text of a model message: a string, or the text blocks of a content array. */
export function messageText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((block) =>
      typeof block === "string"
        ? block
        : block && typeof block === "object" && block.type === "text" &&
            typeof block.text === "string"
        ? block.text
        : ""
    )
    .join("");
}

/** A one-line description of an LLM or agent failure and its causes, without a stack trace. */
export function describeError(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; current !== undefined && current !== null && depth < 20; depth++) {
    const text = (current instanceof Error ? current.message : String(current)).trim().replace(
      /\.$/,
      "",
    );
    if (text && !parts.some((part) => part.includes(text))) parts.push(text);
    current = current instanceof Error ? current.cause : undefined;
  }
  return parts.join(": ") || "unknown error";
}

/** What one worker mode produced: the result's text, and whether it is an error. */
export interface Outcome {
  content: string;
  isError: boolean;
}

/**
 * Run `work`, then emit its result (or the error `describe` words) and the usage: the shape every
 * mode ends with. Never throws after starting.
 */
export async function emitOutcome(
  emit: Emitter,
  model: string,
  work: (tracker: UsageTracker) => Promise<Outcome>,
  describe: (error: unknown) => string,
): Promise<void> {
  const started = performance.now();
  const tracker = new UsageTracker(model);
  let result: Outcome;
  try {
    result = await work(tracker);
  } catch (error) {
    result = { content: describe(error), isError: true };
  }
  await emit.result(result.content, { isError: result.isError, model });
  await emit.usage(tracker.usage(model, performance.now() - started));
}
