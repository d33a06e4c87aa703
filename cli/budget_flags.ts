/** The `--max-*` flags of `sandbox run`: per-run budgets that replace the profile's (lib/proxy/budget.ts). */
import { SandboxError } from "../lib/errors.ts";
import type { BudgetLimits } from "../lib/proxy/budget.ts";
import { parseSize } from "../lib/units.ts";

export interface BudgetFlags {
  maxTokens?: string;
  maxCost?: string;
  maxRequests?: string;
  maxEgress?: string;
}

/** The limits the flags name; a usage error names a flag whose value is not one. */
export function budgetFromFlags(flags: BudgetFlags): BudgetLimits | undefined {
  const limits: BudgetLimits = {};
  if (flags.maxTokens !== undefined) {
    limits.tokens = whole("--max-tokens", flags.maxTokens, "2000000");
  }
  if (flags.maxRequests !== undefined) {
    limits.requests = whole("--max-requests", flags.maxRequests, "200");
  }
  if (flags.maxCost !== undefined) {
    const usd = /^\d+(\.\d+)?$/.test(flags.maxCost) ? Number(flags.maxCost) : NaN;
    if (!(usd > 0)) {
      throw new SandboxError(
        "usage",
        `Invalid --max-cost "${flags.maxCost}": expected an amount in USD above 0, like 5 or 0.5`,
      );
    }
    limits.cost_usd = usd;
  }
  if (flags.maxEgress !== undefined) {
    const bytes = parseSize(flags.maxEgress);
    if (!bytes) {
      throw new SandboxError(
        "usage",
        `Invalid --max-egress "${flags.maxEgress}": expected a size like "100m" or "1g"`,
      );
    }
    limits.egress_bytes = bytes;
  }
  return Object.keys(limits).length > 0 ? limits : undefined;
}

function whole(flag: string, text: string, example: string): number {
  if (!/^\d{1,15}$/.test(text) || Number(text) < 1) {
    throw new SandboxError(
      "usage",
      `Invalid ${flag} "${text}": expected a whole number above 0, like ${example}`,
    );
  }
  return Number(text);
}
