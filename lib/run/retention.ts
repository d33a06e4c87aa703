/**
 * Retention of run records: which finished runs `sandbox prune` (or `state.retention` at the end
 * of a run) removes, and removing them. A run that is running is never selected, whatever its
 * age; a run whose recording process died ("crashed") has finished.
 *
 * A policy names an age (`olderThanMs`: a run ended, or started when it has no end, longer ago
 * than that), a count (`keep`: the newest that many finished runs stay), or both (a run goes only
 * when it is older than the age and not among the newest `keep`).
 *
 * The age also applies to the state directory's other logs, which belong to no run: build logs
 * (`builds/*.log`) last written longer ago, and access log entries (`access.ndjson`) whose request
 * started longer ago. `keep` counts runs only.
 */
import type { RunMeta } from "./run_log.ts";
import { userStateDir } from "../paths.ts";

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
  /** Build logs (file names in `builds/`) removed by age, with their bytes. */
  buildLogs: { name: string; bytes: number }[];
  /** Entries of `access.ndjson` removed by age, and their bytes. */
  accessLog: { entries: number; bytes: number };
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
  const dryRun = options.dryRun ?? false;
  const cutoffMs = policy.olderThanMs === undefined
    ? undefined
    : (options.now ?? new Date()).getTime() - policy.olderThanMs;
  return {
    dryRun,
    removed,
    runs: removed.length,
    bytes,
    kept: runs.length - removed.length,
    buildLogs: cutoffMs === undefined ? [] : await pruneBuildLogs(cutoffMs, dryRun),
    accessLog: cutoffMs === undefined
      ? { entries: 0, bytes: 0 }
      : await pruneAccessLog(`${userStateDir()}/access.ndjson`, cutoffMs, dryRun),
  };
}

/**
 * Remove the build logs last written before `cutoffMs`. A build in progress writes its log as it
 * goes, so it is never among them.
 */
async function pruneBuildLogs(
  cutoffMs: number,
  dryRun: boolean,
): Promise<PruneReport["buildLogs"]> {
  const dir = `${userStateDir()}/builds`;
  const removed: PruneReport["buildLogs"] = [];
  let entries: Deno.DirEntry[];
  try {
    entries = await Array.fromAsync(Deno.readDir(dir));
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return removed;
    throw error;
  }
  for (const entry of entries.sort((a, b) => a.name.localeCompare(b.name))) {
    if (!entry.isFile || !entry.name.endsWith(".log")) continue;
    const info = await Deno.lstat(`${dir}/${entry.name}`);
    if ((info.mtime?.getTime() ?? Infinity) >= cutoffMs) continue;
    if (!dryRun) await Deno.remove(`${dir}/${entry.name}`);
    removed.push({ name: entry.name, bytes: info.size });
  }
  return removed;
}

/**
 * Remove the access log's entries whose request started before `cutoffMs` (a line that is not an
 * entry with a time stays). Live proxies keep appending: the file is moved aside, and once no
 * append to it is in flight (each holds a shared lock, lib/proxy/access_log.ts, and moves on to
 * the file at the path when it has changed), the entries it keeps are appended to the new one.
 */
async function pruneAccessLog(
  path: string,
  cutoffMs: number,
  dryRun: boolean,
): Promise<PruneReport["accessLog"]> {
  const split = (text: string) => {
    const lines = text.split("\n").filter(Boolean);
    const old = lines.filter((line) => entryTimeMs(line) < cutoffMs);
    const bytes = old.reduce((sum, line) => sum + new TextEncoder().encode(line).length + 1, 0);
    return {
      old: old.length,
      bytes,
      kept: lines.filter((line) => !(entryTimeMs(line) < cutoffMs)),
    };
  };
  let before: string;
  try {
    before = await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return { entries: 0, bytes: 0 };
    throw error;
  }
  const planned = split(before);
  // Nothing old (or only a look): the file is left where it is, as it is.
  if (dryRun || planned.old === 0) return { entries: planned.old, bytes: planned.bytes };
  const aside = `${path}.pruning-${crypto.randomUUID().slice(0, 8)}`;
  await Deno.rename(path, aside);
  const file = await Deno.open(aside, { read: true, write: true });
  try {
    await file.lock(true);
    const { old, bytes, kept } = split(await Deno.readTextFile(aside));
    if (kept.length > 0) await appendLocked(path, kept.join("\n") + "\n");
    return { entries: old, bytes };
  } finally {
    file.close();
    await Deno.remove(aside);
  }
}

/** An access log line's `time` in milliseconds; NaN for a line that has none. */
function entryTimeMs(line: string): number {
  try {
    const time = (JSON.parse(line) as { time?: unknown }).time;
    return typeof time === "string" ? Date.parse(time) : NaN;
  } catch {
    return NaN; // not JSON: kept, since no age can be told
  }
}

/** Append `text` to `path` under an exclusive lock, so that no proxy's line lands inside it. */
async function appendLocked(path: string, text: string): Promise<void> {
  const file = await Deno.open(path, { append: true, create: true, mode: 0o600 });
  try {
    await file.lock(true);
    let bytes = new TextEncoder().encode(text);
    while (bytes.length > 0) bytes = bytes.subarray(await file.write(bytes));
  } finally {
    file.close();
  }
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
