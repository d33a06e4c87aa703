/**
 * What an LLM call cost, from a price table maintained here (and only here).
 *
 * Prices are USD per million tokens, as the providers publish them for standard (not batch,
 * priority or long-context) requests. Sources, transcribed 2026-11-22; update this table when they
 * change:
 * - OpenAI: https://platform.openai.com/docs/pricing ("Text tokens", Standard: input, cached
 *   input, output)
 * - Anthropic: https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing": base
 *   input, 5m cache writes, cache hits, output)
 *
 * A model missing from the table has an unknown cost (`null`), never a guessed one.
 */

export interface ModelPrice {
  /** Uncached input tokens. */
  input: number;
  output: number;
  /** Input tokens read from the provider's prompt cache. */
  cacheRead: number;
  /** Input tokens written to the prompt cache (Anthropic's 5-minute writes; OpenAI has none). */
  cacheWrite: number;
}

const openai = (input: number, cacheRead: number, output: number): ModelPrice => ({
  input,
  output,
  cacheRead,
  cacheWrite: input,
});
const anthropic = (
  input: number,
  cacheWrite: number,
  cacheRead: number,
  output: number,
): ModelPrice => ({ input, output, cacheRead, cacheWrite });

/** Model name (without a date suffix or provider prefix) → price per million tokens. */
export const PRICES: Readonly<Record<string, ModelPrice>> = {
  "gpt-5": openai(1.25, 0.125, 10),
  "gpt-5-mini": openai(0.25, 0.025, 2),
  "gpt-5-nano": openai(0.05, 0.005, 0.4),
  "gpt-4.1": openai(2, 0.5, 8),
  "gpt-4.1-mini": openai(0.4, 0.1, 1.6),
  "gpt-4.1-nano": openai(0.1, 0.025, 0.4),
  "gpt-4o": openai(2.5, 1.25, 10),
  "gpt-4o-mini": openai(0.15, 0.075, 0.6),
  "o3": openai(2, 0.5, 8),
  "o3-mini": openai(1.1, 0.55, 4.4),
  "o4-mini": openai(1.1, 0.275, 4.4),
  "claude-opus-4-5": anthropic(5, 6.25, 0.5, 25),
  "claude-opus-4-1": anthropic(15, 18.75, 1.5, 75),
  "claude-opus-4": anthropic(15, 18.75, 1.5, 75),
  "claude-sonnet-4-5": anthropic(3, 3.75, 0.3, 15),
  "claude-sonnet-4": anthropic(3, 3.75, 0.3, 15),
  "claude-3-7-sonnet": anthropic(3, 3.75, 0.3, 15),
  "claude-haiku-4-5": anthropic(1, 1.25, 0.1, 5),
  "claude-3-5-haiku": anthropic(0.8, 1, 0.08, 4),
  "claude-3-haiku": anthropic(0.25, 0.3, 0.03, 1.25),
};

/**
 * The table's entry for a model name as APIs report it: `gpt-4.1-mini-2025-04-14`,
 * `claude-sonnet-4-5-20250929`, `claude-3-5-haiku-latest`, `openai/gpt-4.1-mini` (OpenRouter) and
 * `claude-opus-4-0` all find theirs; a name that is merely similar does not.
 */
export function priceOf(model: string | null | undefined): ModelPrice | undefined {
  if (!model) return undefined;
  let name = model.trim().toLowerCase().replace(/^(openai|anthropic)\//, "");
  name = name.replace(/-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$/, "");
  if (PRICES[name]) return PRICES[name];
  // Anthropic's aliases for a x.0 model: claude-opus-4-0, claude-sonnet-4-0.
  return PRICES[name.replace(/-0$/, "")];
}

/** Tokens of one call; `input` includes the cached ones, as both APIs count it in LangChain. */
export interface CallTokens {
  input: number;
  output: number;
  cacheRead?: number;
  cacheWrite?: number;
}

/** USD for one call of `model`, or null when the model's price is unknown. */
export function costOf(model: string | null | undefined, tokens: CallTokens): number | null {
  const price = priceOf(model);
  if (!price) return null;
  const cacheRead = tokens.cacheRead ?? 0;
  const cacheWrite = tokens.cacheWrite ?? 0;
  const fresh = Math.max(0, tokens.input - cacheRead - cacheWrite);
  return (fresh * price.input + cacheRead * price.cacheRead + cacheWrite * price.cacheWrite +
    tokens.output * price.output) / 1e6;
}

/** A sum of costs as printed: float noise (0.00020600000000000002) cut at a ten-billionth of a dollar. */
export function roundUsd(usd: number): number {
  return Math.round(usd * 1e10) / 1e10;
}
