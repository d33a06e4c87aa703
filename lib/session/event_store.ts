/**
 * The event store: every session's and run's events, in the `events` table of `<state>/store.db`
 * (the database of the runs' index, lib/run/run_index.ts; SQLite through `node:sqlite`, WAL).
 *
 * An event is the seeds' terminal event — `channel`, `type` (input | output | error), `data`,
 * `source` (agent | user | system), `time` — with the number it has in its stream (`seq`, from 1,
 * no gaps). A stream is a run's or a session's id; it has one writer at a time (the run's process
 * or the session's supervisor), which numbers its events. An event is committed before anyone is
 * shown it, so that what a viewer saw can always be replayed, from any `seq` or time.
 *
 * There is no index on `time`: a stream's times grow with its `seq` (one writer), and a replay
 * from a time reads that one stream's rows, keyed by it; an index would halve the write rate.
 *
 * Writes go in transactions of many events where the writer has them (`appendMany`); with
 * `synchronous = NORMAL` a commit in WAL mode is not an fsync, so a power cut can lose the last
 * moments, as with the run logs' files; a killed process loses nothing it committed.
 */
import type { DatabaseSync, StatementSync } from "node:sqlite";
import { openIndex, storePath } from "../run/run_index.ts";

export type EventType = "input" | "output" | "error";
export type EventSource = "agent" | "user" | "system";

/** An event as a writer gives it. */
export interface SessionEventInit {
  /** `terminal` for a terminal's bytes; `agent` for an agent's NDJSON lines; `system` for ours. */
  channel: string;
  type: EventType;
  data: string;
  source: EventSource;
  /** ISO 8601; now when left out. */
  time?: string;
}

/** An event as stored: numbered in its stream. */
export interface SessionEvent extends Required<SessionEventInit> {
  seq: number;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS events (
  stream TEXT NOT NULL,
  seq INTEGER NOT NULL,
  time TEXT NOT NULL,
  channel TEXT NOT NULL,
  type TEXT NOT NULL,
  source TEXT NOT NULL,
  data TEXT NOT NULL,
  PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
`;

/** The store's database, opened with the events table (made when missing). */
export function openEventDb(path = storePath()): DatabaseSync {
  const db = openIndex(path);
  try {
    db.exec("PRAGMA synchronous = NORMAL");
    db.exec(SCHEMA);
    return db;
  } catch (error) {
    db.close();
    throw error;
  }
}

/** The one writer of a stream: numbers its events and commits them. */
export class EventWriter implements Disposable {
  readonly stream: string;
  readonly #db: DatabaseSync;
  readonly #insert: StatementSync;
  #next: number;

  constructor(stream: string, path = storePath()) {
    this.stream = stream;
    this.#db = openEventDb(path);
    this.#insert = this.#db.prepare(
      "INSERT INTO events (stream, seq, time, channel, type, source, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
    );
    this.#next = lastSeq(this.#db, stream) + 1;
  }

  /** The number the next event gets. */
  get nextSeq(): number {
    return this.#next;
  }

  /** Commit one event; it as stored. */
  append(event: SessionEventInit): SessionEvent {
    return this.appendMany([event])[0];
  }

  /** Commit `events` in one transaction (all or none); them as stored. */
  appendMany(events: readonly SessionEventInit[]): SessionEvent[] {
    const stored: SessionEvent[] = [];
    let seq = this.#next;
    this.#db.exec("BEGIN IMMEDIATE");
    try {
      for (const event of events) {
        const row: SessionEvent = {
          seq: seq++,
          time: event.time ?? new Date().toISOString(),
          channel: event.channel,
          type: event.type,
          source: event.source,
          data: event.data,
        };
        this.#insert.run(
          this.stream,
          row.seq,
          row.time,
          row.channel,
          row.type,
          row.source,
          row.data,
        );
        stored.push(row);
      }
      this.#db.exec("COMMIT");
    } catch (error) {
      this.#db.exec("ROLLBACK");
      throw error;
    }
    this.#next = seq;
    return stored;
  }

  /** Close the database; again is nothing. */
  [Symbol.dispose](): void {
    if (this.#db.isOpen) this.#db.close();
  }
}

/** The last `seq` of `stream`, 0 when it has none. */
export function lastSeq(db: DatabaseSync, stream: string): number {
  const row = db.prepare("SELECT max(seq) AS last FROM events WHERE stream = ?").get(stream) as {
    last: number | null;
  };
  return row.last ?? 0;
}

/** Where a replay starts: an event's number, or a time (the first event at or after it). */
export type ReplayFrom = { seq: number } | { time: string };

/** Events of `stream` from `from` (default: the first), at most `limit`, in order. */
export function readStream(
  db: DatabaseSync,
  stream: string,
  from: ReplayFrom = { seq: 1 },
  limit = 10_000,
): SessionEvent[] {
  const where = "seq" in from ? "seq >= ?" : "time >= ?";
  const key = "seq" in from ? from.seq : from.time;
  return db.prepare(
    `SELECT seq, time, channel, type, source, data FROM events WHERE stream = ? AND ${where} ORDER BY seq LIMIT ?`,
  ).all(stream, key, limit) as unknown as SessionEvent[];
}

/** `--from`'s text: a whole number is a `seq`, anything else must be a date or time. */
export function parseReplayFrom(text: string): ReplayFrom | undefined {
  if (/^\d{1,15}$/.test(text)) return { seq: Math.max(1, Number(text)) };
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : { time: new Date(at).toISOString() };
}

export interface FollowOptions {
  from?: ReplayFrom;
  /** Keep reading until `live()` says the stream's writer is gone (and the stream is drained). */
  follow?: boolean;
  live?: () => Promise<boolean>;
  signal?: AbortSignal;
  pollMs?: number;
  path?: string;
}

/** Batches of `stream`'s events from `from`, then (with `follow`) those written after, as they come. */
export async function* replayStream(
  stream: string,
  options: FollowOptions = {},
): AsyncGenerator<SessionEvent[]> {
  const db = openEventDb(options.path);
  try {
    let from: ReplayFrom = options.from ?? { seq: 1 };
    while (true) {
      const batch = readStream(db, stream, from);
      if (batch.length > 0) {
        yield batch;
        from = { seq: batch[batch.length - 1].seq + 1 };
        continue;
      }
      if (!options.follow || options.signal?.aborted) return;
      if (!await (options.live?.() ?? Promise.resolve(false))) {
        // Events committed between the last read and the writer's end.
        const last = readStream(db, stream, from);
        if (last.length > 0) yield last;
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 100));
    }
  } finally {
    db.close();
  }
}

/** Whether `stream` has any event. */
export function hasEvents(db: DatabaseSync, stream: string): boolean {
  return lastSeq(db, stream) > 0;
}

/**
 * Import a run's `events.ndjson` lines into the store (runs recorded before the store held them):
 * each line an `agent` output event at `time` (the run's start: the lines carry none), in order.
 * Done once: a stream with events is left alone.
 */
export function importLines(
  db: DatabaseSync,
  stream: string,
  lines: readonly string[],
  time: string,
): number {
  if (hasEvents(db, stream) || lines.length === 0) return 0;
  const insert = db.prepare(
    "INSERT INTO events (stream, seq, time, channel, type, source, data) VALUES (?, ?, ?, 'agent', 'output', 'agent', ?)",
  );
  db.exec("BEGIN IMMEDIATE");
  try {
    lines.forEach((line, i) => insert.run(stream, i + 1, time, line));
    db.exec("COMMIT");
  } catch (error) {
    db.exec("ROLLBACK");
    throw error;
  }
  return lines.length;
}
