/**
 * A run's budget, made at its start: the profile's per-run limits (`budget`), replaced by the
 * `--max-*` flags, and capped by what is left of the profile's budget for the day
 * (`budget.per_day`). A run that would start with the day's budget used up is refused before
 * anything starts.
 *
 * The day's spending is kept in the state store (`store.db`, table `budget_spend`: one row per
 * run, written when the run ends, attributed to the UTC day it started), apart from the run
 * directories, so that pruning runs does not give their spending back. Runs of one profile that
 * overlap each see only what the others recorded when they started.
 */
import type { DatabaseSync } from "node:sqlite";
import type { Profile } from "../config.ts";
import { SandboxError } from "../errors.ts";
import { parseSize } from "../units.ts";
import {
  BUDGET_NAMES,
  type BudgetLimits,
  type BudgetName,
  type BudgetUsage,
  describeOverrun,
  RunBudget,
} from "../proxy/budget.ts";
import { openIndex, storePath } from "./run_index.ts";

const SPEND_SCHEMA = `
CREATE TABLE IF NOT EXISTS budget_spend (
  run_id TEXT PRIMARY KEY,
  profile TEXT NOT NULL,
  day TEXT NOT NULL,
  tokens INTEGER NOT NULL,
  cost_usd REAL NOT NULL,
  requests INTEGER NOT NULL,
  egress_bytes INTEGER NOT NULL,
  egress_requests INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS budget_spend_by_day ON budget_spend (profile, day);
`;

const DAY_MS = 24 * 60 * 60 * 1000;

/** A run's budget and how its spending is kept for the day's budget. */
export interface RunSpending {
  budget: RunBudget;
  /**
   * Keep what the run spent against the day's budget (when the profile has one); a store that
   * cannot be written is said through `onProgress`, never raised: the run is over.
   */
  record(runId: string): Promise<void>;
}

export interface RunSpendingOptions {
  /** The `--max-*` flags: each replaces the profile's per-run limit of the same name. */
  flags?: BudgetLimits;
  /** Called once, with the error the run ends with, when the run passes a budget. */
  onExceeded?: (error: SandboxError) => void;
  /** Diagnostics for stderr: spending that could not be kept. */
  onProgress?: (line: string) => void;
  /** The state store (default: `<state dir>/store.db`). */
  storePath?: string;
  now?: Date;
}

/**
 * The budget a run of `profile` starts with; raises `budget_exceeded` when the day's budget is
 * used up, and `usage` when an egress budget could not be held (network mode full has no egress
 * proxy).
 */
export function startRunSpending(profile: Profile, options: RunSpendingOptions = {}): RunSpending {
  const configured = profile.budget ?? {};
  const limits: BudgetLimits = { ...limitsOf(configured), ...options.flags };
  const perDay = configured.per_day ? limitsOf(configured.per_day) : undefined;
  const now = options.now ?? new Date();
  const day = now.toISOString().slice(0, 10);
  const path = options.storePath ?? storePath();
  const scopes = perDay
    ? capByDay(profile.name, limits, perDay, spentOn(path, profile.name, day), now)
    : {};
  const budget = new RunBudget(limits, { onExceeded: options.onExceeded, scopes });
  if (budget.limitsEgress && profile.sandbox.network.mode === "full") {
    throw new SandboxError(
      "usage",
      `Cannot hold an egress budget for profile "${profile.name}": network mode "full" has no egress proxy`,
      {
        detail: 'Use network mode "allowlist" (the default), or drop egress_bytes/egress_requests',
      },
    );
  }
  return {
    budget,
    record: (runId) => {
      if (!perDay) return Promise.resolve();
      try {
        recordSpend(path, { runId, profile: profile.name, day, used: budget.used });
      } catch (error) {
        options.onProgress?.(
          `warning: run ${runId}'s spending is not counted against profile "${profile.name}"'s budget per day: ${
            (error as Error).message
          }`,
        );
      }
      return Promise.resolve();
    },
  };
}

/** Limits from the configuration's shape (`egress_bytes` a size string). */
function limitsOf(config: Partial<Record<BudgetName, number | string>>): BudgetLimits {
  const limits: BudgetLimits = {};
  for (const name of BUDGET_NAMES) {
    const value = config[name];
    if (value === undefined) continue;
    limits[name] = typeof value === "string" ? parseSize(value)! : value;
  }
  return limits;
}

/**
 * Lower each of the run's limits to what is left of the day's (naming, for each lowered one,
 * whose limit it is); raises `budget_exceeded` naming the first budget of the day that is used
 * up, and when it resets.
 */
function capByDay(
  profile: string,
  limits: BudgetLimits,
  perDay: BudgetLimits,
  spent: BudgetUsage,
  now: Date,
): Partial<Record<BudgetName, string>> {
  const scopes: Partial<Record<BudgetName, string>> = {};
  for (const name of BUDGET_NAMES) {
    const limit = perDay[name];
    if (limit === undefined) continue;
    const left = limit - spent[name];
    if (left <= 0) {
      const resets = new Date(Math.floor(now.getTime() / DAY_MS) * DAY_MS + DAY_MS);
      throw new SandboxError(
        "budget_exceeded",
        `Budget exceeded: ${
          describeOverrun({ budget: name, limit, used: spent[name] })
        } (profile "${profile}"'s budget per day); resets at ${resets.toISOString()}`,
      );
    }
    if (left < (limits[name] ?? Infinity)) {
      limits[name] = left;
      scopes[name] = `what was left of profile "${profile}"'s budget per day`;
    }
  }
  return scopes;
}

/** What the profile's runs of `day` spent, as recorded; raises `store_failed` if unreadable. */
export function spentOn(path: string, profile: string, day: string): BudgetUsage {
  return withStore(path, (db) => {
    const row = db.prepare(
      `SELECT coalesce(sum(tokens), 0) AS tokens, coalesce(sum(cost_usd), 0) AS cost_usd,
        coalesce(sum(requests), 0) AS requests, coalesce(sum(egress_bytes), 0) AS egress_bytes,
        coalesce(sum(egress_requests), 0) AS egress_requests
      FROM budget_spend WHERE profile = ? AND day = ?`,
    ).get(profile, day) as Record<BudgetName, number>;
    return Object.fromEntries(BUDGET_NAMES.map((name) => [name, Number(row[name])])) as BudgetUsage;
  });
}

function recordSpend(
  path: string,
  spend: { runId: string; profile: string; day: string; used: BudgetUsage },
): void {
  const { used } = spend;
  withStore(path, (db) =>
    db.prepare(
      `INSERT OR REPLACE INTO budget_spend
        (run_id, profile, day, tokens, cost_usd, requests, egress_bytes, egress_requests)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
    ).run(
      spend.runId,
      spend.profile,
      spend.day,
      used.tokens,
      used.cost_usd,
      used.requests,
      used.egress_bytes,
      used.egress_requests,
    ));
}

/** `action` on the store with the spend table; a store that fails raises `store_failed`. */
function withStore<T>(path: string, action: (db: DatabaseSync) => T): T {
  let db: DatabaseSync | undefined;
  try {
    Deno.mkdirSync(path.replace(/\/[^/]*$/, ""), { recursive: true, mode: 0o700 });
    db = openIndex(path);
    db.exec(SPEND_SCHEMA);
    return action(db);
  } catch (error) {
    // Fail closed: a day's budget that cannot be read or kept is not held.
    throw new SandboxError(
      "store_failed",
      `Cannot keep the budget per day in "${path}": ${(error as Error).message}`,
      { cause: error },
    );
  } finally {
    db?.close();
  }
}
