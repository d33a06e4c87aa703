/**
 * Retention of run records: which finished runs `sandbox prune` (or `state.retention` at the end
 * of a run) removes, and removing them. A run that is running is never selected, whatever its
 * age; a run whose recording process died ("crashed") has finished.
 *
 * A policy names an age (`olderThanMs`: a run ended, or started when it has no end, longer ago
 * than that), a count (`keep`: the newest that many finished runs stay), or both (a run goes only
 * when it is older than the age and not among the newest `keep`).
 */
import type { RunMeta } from "./run_log.ts";

export interface RetentionPolicy {
  olderThanMs?: number;
  keep?: number;
}

const AGE_UNITS_MS: Record<string, number> = {
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
  w: 604_800_000,
};

/** "30d", "12h", "2w", "1d12h" in milliseconds; undefined when not such an age (or not above 0). */
export function parseAge(text: string): number | undefined {
  const trimmed = text.trim();
  if (!/^(\d+(?:\.\d+)?(ms|s|m|h|d|w))+$/.test(trimmed)) return undefined;
  let total = 0;
  for (const [, value, unit] of trimmed.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d|w)/g)) {
    total += Number(value) * AGE_UNITS_MS[unit];
  }
  return total > 0 ? Math.round(total) : undefined;
}

/** When a run stopped counting as recent: its end, or its start when it has none (crashed). */
function lastActivityMs(run: RunMeta): number {
  return Date.parse(run.endedAt ?? run.startedAt);
}

/**
 * The runs `policy` removes, newest first. `runs` is every run, newest first, with liveness
 * applied (as `listRuns` gives them). A policy naming nothing removes nothing.
 */
export function selectPrunable(
  runs: readonly RunMeta[],
  policy: RetentionPolicy,
  now: Date = new Date(),
): RunMeta[] {
  if (policy.olderThanMs === undefined && policy.keep === undefined) return [];
  const finished = runs.filter((run) => run.status !== "running");
  return finished.filter((run, newest) =>
    (policy.keep === undefined || newest >= policy.keep) &&
    (policy.olderThanMs === undefined ||
      now.getTime() - lastActivityMs(run) > policy.olderThanMs)
  );
}

/** What a prune removed (or, dry, would remove). */
export interface PruneReport {
  dryRun: boolean;
  /** Each removed run: its id, status, start and the bytes of its directory. */
  removed: { id: string; status: RunMeta["status"]; startedAt: string; bytes: number }[];
  runs: number;
  bytes: number;
  /** Runs left. */
  kept: number;
}

/**
 * Remove the run records `policy` selects (their whole directories and index rows). Each run is
 * read again just before it goes: one that reads as running then is left alone.
 */
export async function pruneRuns(
  policy: RetentionPolicy,
  options: { dryRun?: boolean; now?: Date } = {},
): Promise<PruneReport> {
  const { listRuns, readRun, runsDir } = await import("./run_log.ts");
  const { unindexRun } = await import("./run_index.ts");
  const runs = await listRuns();
  const selected = selectPrunable(runs, policy, options.now);
  const removed: PruneReport["removed"] = [];
  for (const run of selected) {
    const dir = `${runsDir()}/${run.id}`;
    const current = await readRun(run.id);
    // Gone meanwhile (another prune), or started again under its id: not ours to remove.
    if (current === undefined || current.status === "running") continue;
    const bytes = await directoryBytes(dir);
    if (!options.dryRun) {
      await Deno.remove(dir, { recursive: true });
      unindexRun(run.id);
    }
    removed.push({ id: run.id, status: run.status, startedAt: run.startedAt, bytes });
  }
  const bytes = removed.reduce((sum, run) => sum + run.bytes, 0);
  return {
    dryRun: options.dryRun ?? false,
    removed,
    runs: removed.length,
    bytes,
    kept: runs.length - removed.length,
  };
}

/** The bytes of the files under `dir` (links not followed). */
async function directoryBytes(dir: string): Promise<number> {
  let total = 0;
  for await (const entry of Deno.readDir(dir)) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) total += await directoryBytes(path);
    else total += (await Deno.lstat(path)).size;
  }
  return total;
}

/** `state.retention` as written in the configuration (lib/config.ts). */
export interface RetentionSetting {
  older_than?: string;
  keep?: number;
}

/** The policy a configured `state.retention` names (an age the schema let through parses). */
export function retentionPolicy(setting: RetentionSetting): RetentionPolicy {
  return {
    ...(setting.older_than === undefined ? {} : { olderThanMs: parseAge(setting.older_than) }),
    ...(setting.keep === undefined ? {} : { keep: setting.keep }),
  };
}
