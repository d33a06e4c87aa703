/**
 * The index of runs: `<state dir>/store.db`, an SQLite database (Deno's built-in `node:sqlite`,
 * WAL) whose `runs` table holds each run's `meta.json` as last written, keyed by run id, so that
 * listing the recent runs reads one table instead of every run's directory.
 *
 * The run directories stay the record; the index is derived from them and never the only copy of
 * anything. `RunLog` updates a run's row whenever it writes `meta.json` (start, notes, end); a
 * failed update never fails the run. Readers reconcile the index with the names in `runs/` (one
 * directory read, no file opened): a run directory without a row is read and indexed, a row
 * without a directory is dropped. A row that says "running" is read again from its `meta.json`
 * (its end may have been recorded while the index could not be written). A missing or unreadable
 * database is rebuilt from the run directories; an unreadable one is first moved aside to
 * `store.db.corrupt`, never deleted.
 */
import { DatabaseSync } from "node:sqlite";
import { userStateDir } from "../config.ts";
import type { RunMeta } from "./run_log.ts";

/** The database file, in the state directory (it is meant to hold more tables than `runs`). */
export const STORE_FILE = "store.db";
/** The schema this code reads and writes (`PRAGMA user_version`); another one is rebuilt. */
const SCHEMA_VERSION = 1;
/** How long a writer waits for another process's write to the database. */
const BUSY_TIMEOUT_MS = 5_000;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY,
  profile TEXT NOT NULL,
  status TEXT NOT NULL,
  started_at TEXT NOT NULL,
  ended_at TEXT,
  meta TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_profile ON runs (profile, id);
`;

export function storePath(): string {
  return `${userStateDir()}/${STORE_FILE}`;
}

/** Why the index was rebuilt: it did not exist, or it could not be read (then moved aside). */
export interface IndexRebuild {
  reason: "missing" | "unreadable";
  /** Where the unreadable database was moved. */
  movedTo?: string;
  /** How many runs the rebuilt index holds. */
  runs: number;
}

/** The database holds something this code cannot read: it is rebuilt. */
class DamagedIndex extends Error {
  override name = "DamagedIndex";
}

/**
 * A damaged database, as opposed to one that cannot be written now (a full disk, a lock held
 * too long), which is left alone. `node:sqlite` gives every error the one code
 * "ERR_SQLITE_ERROR", so SQLite's own messages for SQLITE_NOTADB and SQLITE_CORRUPT are what tell.
 */
function isDamaged(error: unknown): boolean {
  return error instanceof DamagedIndex ||
    (error instanceof Error &&
      /file is not a database|database disk image is malformed/.test(error.message));
}

/** Open (creating if needed) the index; raises when the file is not a usable database. */
export function openIndex(path = storePath()): DatabaseSync {
  const db = new DatabaseSync(path);
  try {
    db.exec(`PRAGMA busy_timeout = ${BUSY_TIMEOUT_MS}`);
    db.exec("PRAGMA journal_mode = WAL");
    const version = (db.prepare("PRAGMA user_version").get() as { user_version: number })
      .user_version;
    if (version !== 0 && version !== SCHEMA_VERSION) {
      throw new DamagedIndex(`schema version ${version}, expected ${SCHEMA_VERSION}`);
    }
    db.exec(SCHEMA);
    db.exec(`PRAGMA user_version = ${SCHEMA_VERSION}`);
    // A database that opens but is damaged inside fails here rather than on some later read.
    db.prepare("SELECT count(*) FROM runs").get();
    return db;
  } catch (error) {
    db.close();
    throw error;
  }
}

/** Insert or replace one run's row. */
export function putRun(db: DatabaseSync, meta: RunMeta): void {
  db.prepare(
    "INSERT OR REPLACE INTO runs (id, profile, status, started_at, ended_at, meta) VALUES (?, ?, ?, ?, ?, ?)",
  ).run(meta.id, meta.profile, meta.status, meta.startedAt, meta.endedAt, JSON.stringify(meta));
}

export function deleteRun(db: DatabaseSync, id: string): void {
  db.prepare("DELETE FROM runs WHERE id = ?").run(id);
}

/**
 * Record `meta` in the index, best effort: the run's `meta.json` is the record, and a reader
 * repairs a row this could not write. False when it could not.
 */
export function indexRun(meta: RunMeta): boolean {
  try {
    const db = openIndex();
    try {
      putRun(db, meta);
    } finally {
      db.close();
    }
    return true;
  } catch {
    // A full disk or a damaged index: the next reader re-reads this run's meta.json.
    return false;
  }
}

/** Forget a run, best effort (a row left behind is dropped by the next reader). */
export function unindexRun(id: string): void {
  try {
    const db = openIndex();
    try {
      deleteRun(db, id);
    } finally {
      db.close();
    }
  } catch {
    // The next reader drops rows whose directory is gone.
  }
}

/** Every indexed id (no metadata parsed). */
export function indexedIds(db: DatabaseSync): Set<string> {
  const rows = db.prepare("SELECT id FROM runs").all() as { id: string }[];
  return new Set(rows.map((row) => row.id));
}

export interface IndexQuery {
  /** At most this many runs, newest first. */
  limit?: number;
  /** Only runs of this profile. */
  profile?: string;
}

/** Indexed runs, newest first (by start time to the millisecond; a run id's stamp has seconds). */
export function queryRuns(db: DatabaseSync, query: IndexQuery = {}): RunMeta[] {
  const where = query.profile === undefined ? "" : "WHERE profile = ?";
  const limit = query.limit === undefined ? "" : "LIMIT ?";
  const params = [
    ...(query.profile === undefined ? [] : [query.profile]),
    ...(query.limit === undefined ? [] : [query.limit]),
  ];
  const rows = db.prepare(
    `SELECT meta FROM runs ${where} ORDER BY started_at DESC, id DESC ${limit}`,
  )
    .all(...params) as { meta: string }[];
  return rows.map((row) => JSON.parse(row.meta) as RunMeta);
}

/**
 * The index, opened; a missing one is created, an unreadable one moved aside and created anew.
 * `rebuild` says which, so that the caller refills it from the run directories.
 */
export async function openOrReplaceIndex(): Promise<
  { db: DatabaseSync; rebuild?: Omit<IndexRebuild, "runs"> }
> {
  const path = storePath();
  let existed = true;
  try {
    await Deno.lstat(path);
  } catch {
    existed = false;
    await Deno.mkdir(userStateDir(), { recursive: true, mode: 0o700 });
  }
  try {
    const db = openIndex(path);
    return existed ? { db } : { db, rebuild: { reason: "missing" } };
  } catch (error) {
    if (!existed || !isDamaged(error)) throw error;
    const movedTo = `${path}.corrupt`;
    await Deno.rename(path, movedTo);
    for (const suffix of ["-wal", "-shm"]) {
      // The journal of the damaged file belongs with it; there may be none.
      await Deno.rename(`${path}${suffix}`, `${movedTo}${suffix}`).catch(() => {});
    }
    return { db: openIndex(path), rebuild: { reason: "unreadable", movedTo } };
  }
}
