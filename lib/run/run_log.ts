/**
 * Durable run records: `<state dir>/runs/<run id>/` holds `events.ndjson` (append-only, one
 * event per line, written as each event arrives) and `meta.json` (replaced atomically); a run of
 * an agent CLI also keeps `agent-events.ndjson`, every line the agent printed, verbatim (its own
 * event kinds, translated or not, so that nothing it said is lost).
 *
 * Durability: each event is one write(2) to a file opened for append, issued before the event is
 * printed, so a crashed or closed terminal (or a killed CLI) loses nothing the CLI had received; the
 * file is fsynced when the run ends. A power loss can lose the events of the last moments.
 *
 * A store that cannot be written (a full or failing disk) never stops the run nor tears its record:
 * - an append that fails is cut back to the end of the last whole line (should even that fail, the
 *   torn line lacks its newline, and the readers report it); nothing is appended after it, so the
 *   file never holds a gap followed by more events; `storeError` says what was lost;
 * - the final `meta.json` has room kept for it: `meta.reserve`, written when the run starts, is
 *   written over in place (no new space needed) and renamed onto `meta.json` when the ordinary
 *   write fails, so the record never stays `running`. A run whose record is incomplete ends with
 *   `exitCode` `EXIT.storeFailed`.
 */
import type { DatabaseSync } from "node:sqlite";
import { pathExists, userStateDir } from "../paths.ts";
import type { AgenticMessage, DriverUsage } from "./protocol.ts";
import { processStartTicks } from "../process.ts";
import { isRunProcessAlive } from "./liveness.ts";
import type { Redactor } from "../redact.ts";
import { EXIT, SandboxError } from "../errors.ts";
import { EventWriter } from "../session/event_store.ts";
import {
  deleteRun,
  indexedIds,
  type IndexQuery,
  type IndexRebuild,
  indexRun,
  openOrReplaceIndex,
  putRun,
  queryRuns,
  storePath,
} from "./run_index.ts";

/** Room kept for the final `meta.json` (see the module's comment). */
export const META_RESERVE_BYTES = 32 * 1024;
const META_RESERVE_FILE = "meta.reserve";
/** In a `meta.json` written into the reserve, longer `extra` values are left out. */
const RESERVED_EXTRA_CHARS = 1024;
const RESERVED_ERROR_CHARS = 4096;

export type RunStatus =
  | "running"
  | "succeeded"
  | "failed"
  | "timed_out"
  | "interrupted"
  | "crashed";

export interface RunMeta {
  id: string;
  /** `mcp`: an environment an MCP client worked in (lib/mcp). */
  mode: "agentic" | "generate" | "mcp" | "shell" | "exec";
  profile: string;
  model: string;
  /** "container" or "none" (unsafe: on the host). */
  sandbox: string;
  status: RunStatus;
  startedAt: string;
  endedAt: string | null;
  durationMs: number | null;
  exitCode: number | null;
  usage: DriverUsage | null;
  error: string | null;
  /** The CLI process recording the run: a "running" run whose pid is gone has crashed. */
  pid: number;
  /** When that process started (clock ticks since boot): a pid reused since is not the run's. */
  pidStartTicks?: number;
  /** Extra facts from later stages (branch, base commit...). */
  extra?: Record<string, unknown>;
  /**
   * Set when the run's record could not be written in full (a full or failing disk): what failed.
   * `events.ndjson` ends at the last event written before it; stdout had every event.
   */
  storeError: string | null;
}

export function runsDir(): string {
  return `${userStateDir()}/runs`;
}

export { newRunId } from "./run_id.ts";

/** The store's batches of a run's events (RunLog #storeLine). */
const STORE_BATCH_EVENTS = 256;
const STORE_BATCH_MS = 20;

/** An append-only file of the run's record, with the length of its whole lines. */
interface RecordFile {
  name: string;
  file: Deno.FsFile;
  bytes: number;
}

export class RunLog implements AsyncDisposable {
  readonly dir: string;
  meta: RunMeta;
  readonly #events: RecordFile;
  readonly #encoder = new TextEncoder();
  readonly #redactor?: Redactor;
  #agentEvents: RecordFile | undefined;
  /** The run's stream in the event store (lib/session/event_store.ts); null once it failed. */
  #store: EventWriter | null | undefined;
  /** Lines for the store not committed yet, and the timer that commits them (#storeLine). */
  #storePending: string[] = [];
  #storeTimer: ReturnType<typeof setTimeout> | undefined;
  /** The first failed write to the record: nothing is appended after it. */
  #lost: string | undefined;

  private constructor(dir: string, meta: RunMeta, file: Deno.FsFile, redactor?: Redactor) {
    this.dir = dir;
    this.meta = meta;
    this.#events = { name: "events.ndjson", file, bytes: file.statSync().size };
    this.#redactor = redactor;
  }

  /**
   * The run's record, `meta.json` saying it runs. A store that cannot take it raises
   * `SandboxError` "store_failed", leaving nothing of the run behind.
   */
  static async create(
    init: Pick<RunMeta, "id" | "mode" | "profile" | "model" | "sandbox">,
    redactor?: Redactor,
  ): Promise<RunLog> {
    const dir = `${runsDir()}/${init.id}`;
    let file: Deno.FsFile | undefined;
    try {
      await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
      file = await Deno.open(`${dir}/events.ndjson`, { append: true, create: true, mode: 0o600 });
      const meta: RunMeta = {
        ...init,
        status: "running",
        startedAt: new Date().toISOString(),
        endedAt: null,
        durationMs: null,
        exitCode: null,
        usage: null,
        error: null,
        pid: Deno.pid,
        pidStartTicks: await processStartTicks(Deno.pid),
        storeError: null,
      };
      await Deno.writeFile(
        `${dir}/${META_RESERVE_FILE}`,
        new Uint8Array(META_RESERVE_BYTES).fill(0x20),
        { mode: 0o600 },
      );
      const log = new RunLog(dir, meta, file, redactor);
      await log.#writeMeta();
      return log;
    } catch (error) {
      file?.close();
      // What was made of the record goes: a half-made one would read as a run.
      await Deno.remove(dir, { recursive: true }).catch(() => {}); // a leftover is only clutter
      throw new SandboxError(
        "store_failed",
        `Cannot record the run in ${dir}: ${describe(error)}`,
        { cause: error },
      );
    }
  }

  /**
   * What could not be written of the run's record, once a write failed (see the module's comment).
   */
  get storeError(): string | undefined {
    return this.#lost;
  }

  /** The run's record is incomplete: the error to report (exit `EXIT.storeFailed`). */
  storeFailure(): SandboxError | undefined {
    return this.#lost === undefined
      ? undefined
      : new SandboxError("store_failed", `The run's record is incomplete: ${this.#lost}`);
  }

  /**
   * Append one event (secrets redacted). A synchronous write: a local file write does not block
   * for long, and an awaited one per event would halve the events per second a run can carry.
   * Never raises for the store: a failed write is kept in `storeError`.
   */
  append(message: AgenticMessage): Promise<void> {
    let line = JSON.stringify(message);
    if (this.#redactor) line = this.#redactor.redact(line);
    this.#appendLine(this.#events, line);
    this.#storeLine(line);
    return Promise.resolve();
  }

  /**
   * The event into the store too, best effort: `events.ndjson` is the run's record. Committed in
   * batches (one transaction each costs about what a hundred rows do): at STORE_BATCH_EVENTS
   * events, or STORE_BATCH_MS after the first of a batch, and at the run's end. A follower of the
   * store (`attach`) sees an event that much later; an ended run whose store lacks events (its
   * process killed before a commit) is completed from its file by `logs`.
   */
  #storeLine(line: string): void {
    if (this.#store === null) return;
    this.#storePending.push(line);
    if (this.#storePending.length >= STORE_BATCH_EVENTS) this.#commitStore();
    else this.#storeTimer ??= setTimeout(() => this.#commitStore(), STORE_BATCH_MS);
  }

  #commitStore(): void {
    clearTimeout(this.#storeTimer);
    this.#storeTimer = undefined;
    const lines = this.#storePending;
    this.#storePending = [];
    if (this.#store === null || lines.length === 0) return;
    try {
      this.#store ??= new EventWriter(this.meta.id);
      this.#store.appendMany(
        lines.map((data) => ({ channel: "agent", type: "output", source: "agent", data })),
      );
    } catch {
      // A store that cannot be written: `sandbox logs --from` imports events.ndjson instead.
      this.#store?.[Symbol.dispose]();
      this.#store = null;
    }
  }

  /** Append one line an agent CLI printed (secrets redacted), to `agent-events.ndjson`. */
  appendAgentEvent(line: string): void {
    if (this.#lost !== undefined) return;
    if (!this.#agentEvents) {
      const name = "agent-events.ndjson";
      try {
        const file = Deno.openSync(`${this.dir}/${name}`, {
          append: true,
          create: true,
          mode: 0o600,
        });
        this.#agentEvents = { name, file, bytes: file.statSync().size };
      } catch (error) {
        this.#lost = `cannot write ${this.dir}/${name}: ${describe(error)}`;
        return;
      }
    }
    let text = line.replace(/\n/g, " ");
    if (this.#redactor) text = this.#redactor.redact(text);
    this.#appendLine(this.#agentEvents, text);
  }

  /** One whole line, or none: a failed write is cut back to the last whole line. */
  #appendLine(record: RecordFile, text: string): void {
    if (this.#lost !== undefined) return;
    const line = this.#encoder.encode(text + "\n");
    try {
      let rest = line;
      while (rest.length > 0) rest = rest.subarray(record.file.writeSync(rest));
      record.bytes += line.length;
    } catch (error) {
      this.#lost = `cannot write ${this.dir}/${record.name}: ${describe(error)}`;
      try {
        record.file.truncateSync(record.bytes);
      } catch {
        // The torn line stays: it lacks its newline, and the readers report it as torn.
      }
    }
  }

  /**
   * Add facts known while the run is live (its sandbox, say) to its metadata. A failure to write
   * them is not the run's: they are written again, with the outcome, by `finish`.
   */
  async note(extra: Record<string, unknown>): Promise<void> {
    this.meta = { ...this.meta, extra: { ...this.meta.extra, ...extra } };
    await this.#writeMeta().catch(() => {}); // finish() writes them again
  }

  /**
   * Record the outcome; the run's files are complete after this, or `storeError` says what is
   * missing (then `exitCode` is `EXIT.storeFailed`). Never raises.
   */
  async finish(
    outcome: Pick<RunMeta, "status" | "exitCode" | "usage" | "error"> & {
      extra?: Record<string, unknown>;
    },
  ): Promise<void> {
    this.#commitStore();
    await this.#events.file.sync().catch(() => {}); // the lines are written; only a power cut could lose them
    await this.#agentEvents?.file.sync().catch(() => {}); // as above
    const ended = new Date();
    const record = (): void => {
      this.meta = {
        ...this.meta,
        ...outcome,
        exitCode: this.#lost === undefined ? outcome.exitCode : EXIT.storeFailed,
        error: outcome.error && this.#redactor
          ? this.#redactor.redact(outcome.error)
          : outcome.error,
        extra: { ...this.meta.extra, ...outcome.extra },
        endedAt: ended.toISOString(),
        durationMs: ended.getTime() - Date.parse(this.meta.startedAt),
        storeError: this.#lost ?? null,
      };
    };
    record();
    try {
      await this.#writeMeta();
      // Not needed any more (and gone, should finish() be called again).
      await Deno.remove(`${this.dir}/${META_RESERVE_FILE}`).catch(() => {}); // already gone
      return;
    } catch (error) {
      this.#lost ??= `cannot write ${this.dir}/meta.json: ${describe(error)}`;
    }
    record();
    if (!await this.#writeReservedMeta()) {
      this.#lost = `${this.#lost}; meta.json was not written either`;
    }
  }

  async #writeMeta(): Promise<void> {
    const partial = `${this.dir}/meta.json.${Deno.pid}.tmp`;
    try {
      await Deno.writeTextFile(partial, JSON.stringify(this.meta, null, 2) + "\n", { mode: 0o600 });
      await Deno.rename(partial, `${this.dir}/meta.json`);
    } catch (error) {
      await Deno.remove(partial).catch(() => {}); // never made, or already renamed
      throw error;
    }
    indexRun(this.meta);
  }

  /** `meta.json` written over the reserve, in place, then renamed onto it. False if it could not be. */
  async #writeReservedMeta(): Promise<boolean> {
    let bytes = this.#encoder.encode(JSON.stringify(this.meta, null, 2) + "\n");
    if (bytes.length > META_RESERVE_BYTES) {
      bytes = this.#encoder.encode(JSON.stringify(reservedMeta(this.meta)) + "\n");
    }
    const reserve = `${this.dir}/${META_RESERVE_FILE}`;
    try {
      {
        using file = await Deno.open(reserve, { write: true });
        let rest = bytes;
        while (rest.length > 0) rest = rest.subarray(await file.write(rest));
        await file.truncate(bytes.length);
      }
      await Deno.rename(reserve, `${this.dir}/meta.json`);
      indexRun(this.meta);
      return true;
    } catch {
      // No reserve (a run finished twice), or even it failed: the dead pid reads as crashed.
      return false;
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    this.#commitStore();
    this.#events.file.close();
    this.#agentEvents?.file.close();
    this.#store?.[Symbol.dispose]();
    // Closed: a line appended after this (a late event of an MCP environment) is not stored.
    this.#store = null;
    return Promise.resolve();
  }
}

/** A `meta` that fits the reserve: long `extra` values and the error's tail left out. */
function reservedMeta(meta: RunMeta): RunMeta {
  const extra = Object.fromEntries(
    Object.entries(meta.extra ?? {}).filter(([, value]) =>
      (JSON.stringify(value) ?? "").length <= RESERVED_EXTRA_CHARS
    ),
  );
  return { ...meta, error: meta.error?.slice(0, RESERVED_ERROR_CHARS) ?? null, extra };
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The metadata of one run as recorded (a dead "running" run still says "running"). */
async function readMetaFile(id: string): Promise<RunMeta | undefined> {
  try {
    const meta = JSON.parse(await Deno.readTextFile(`${runsDir()}/${id}/meta.json`)) as RunMeta;
    meta.storeError ??= null; // (records from before the field)
    return meta;
  } catch {
    return undefined;
  }
}

/**
 * Record what became of run `id`, whose process died before it could record its end: `crashed`,
 * with `error` and the facts in `extra` (lib/run/recover.ts). Written by the process that found it.
 */
export async function recordCrashed(
  id: string,
  outcome: { error: string; extra: Record<string, unknown> },
): Promise<void> {
  const dir = `${runsDir()}/${id}`;
  const meta = JSON.parse(await Deno.readTextFile(`${dir}/meta.json`)) as RunMeta;
  const updated: RunMeta = {
    ...meta,
    status: "crashed",
    error: outcome.error,
    extra: { ...meta.extra, ...outcome.extra },
  };
  const partial = `${dir}/meta.json.${Deno.pid}.tmp`;
  await Deno.writeTextFile(partial, JSON.stringify(updated, null, 2) + "\n", { mode: 0o600 });
  await Deno.rename(partial, `${dir}/meta.json`);
  indexRun(updated);
  await Deno.remove(`${dir}/${META_RESERVE_FILE}`).catch(() => {}); // the dead run's; gone is fine
}

/** `meta` with a "running" run whose recording process is gone reported as crashed. */
async function withLiveness(meta: RunMeta): Promise<RunMeta> {
  if (meta.status === "running" && !await isRunProcessAlive(meta)) {
    return { ...meta, status: "crashed" };
  }
  return meta;
}

/** The metadata of one run, with a dead "running" run reported as crashed. */
export async function readRun(id: string): Promise<RunMeta | undefined> {
  const meta = await readMetaFile(id);
  return meta && await withLiveness(meta);
}

export interface ListRunsOptions extends IndexQuery {
  /** Told when the index was missing or unreadable and has been rebuilt from the run directories. */
  onRebuild?: (rebuild: IndexRebuild) => void;
}

/**
 * Recorded runs, newest first, from the index (lib/run/run_index.ts): no run's files are read
 * but those of runs not yet indexed and of runs indexed as running. A state directory whose index
 * cannot be opened nor written is listed by reading every run's `meta.json`.
 */
export async function listRuns(options: ListRunsOptions = {}): Promise<RunMeta[]> {
  const ids = await runDirectoryNames();
  if (ids.length === 0 && !await pathExists(storePath())) return [];
  let opened;
  try {
    opened = await openOrReplaceIndex();
  } catch {
    // No index can be made here (a read-only or full disk): the run directories are the record.
    return await listRunsFromDirectories(ids, options);
  }
  const { db, rebuild } = opened;
  try {
    const added = await reconcile(db, ids);
    if (rebuild && (rebuild.reason === "unreadable" || added > 0)) {
      options.onRebuild?.({ ...rebuild, runs: added });
    }
    return await Promise.all(
      queryRuns(db, options).map(async (meta) =>
        // Its end may have been recorded while the index could not be written.
        meta.status === "running" ? (await readRun(meta.id)) ?? await withLiveness(meta) : meta
      ),
    );
  } catch {
    // The index could not be brought up to date: the run directories are the record.
    return await listRunsFromDirectories(ids, options);
  } finally {
    db.close();
  }
}

/** Index the run directories the index lacks, drop rows whose directory is gone; how many were added. */
async function reconcile(db: DatabaseSync, ids: string[]): Promise<number> {
  const indexed = indexedIds(db);
  const present = new Set(ids);
  const missing = ids.filter((id) => !indexed.has(id));
  const metas = (await Promise.all(missing.map(readMetaFile)))
    .filter((m): m is RunMeta => m !== undefined);
  const gone = [...indexed].filter((id) => !present.has(id));
  if (metas.length === 0 && gone.length === 0) return 0;
  db.exec("BEGIN IMMEDIATE");
  try {
    for (const meta of metas) putRun(db, meta);
    for (const id of gone) deleteRun(db, id);
    db.exec("COMMIT");
  } catch (error) {
    db.exec("ROLLBACK");
    throw error;
  }
  return metas.length;
}

/** Newest start first; two runs started in the same millisecond by id. */
function newestFirst(a: RunMeta, b: RunMeta): number {
  return b.startedAt.localeCompare(a.startedAt) || b.id.localeCompare(a.id);
}

/** Every run read from its own directory, newest first. */
async function listRunsFromDirectories(ids: string[], query: IndexQuery): Promise<RunMeta[]> {
  const metas = (await Promise.all(ids.map(readRun)))
    .filter((m): m is RunMeta => m !== undefined)
    .filter((m) => query.profile === undefined || m.profile === query.profile)
    .sort(newestFirst);
  return query.limit === undefined ? metas : metas.slice(0, query.limit);
}

/** The names of the directories in `runs/` (none when it does not exist). */
async function runDirectoryNames(): Promise<string[]> {
  const ids: string[] = [];
  try {
    for await (const entry of Deno.readDir(runsDir())) if (entry.isDirectory) ids.push(entry.name);
  } catch {
    // No runs directory: no run was ever recorded here.
  }
  return ids;
}

/**
 * A run's events as lines, from the start. With `follow`, keeps reading as the run appends,
 * until its metadata says it ended (and the file is drained) or `signal` aborts.
 *
 * The end of an ended run's record is checked once every line is out: a last line without its
 * newline (torn by a failed write or a killed writer) is never passed off as an event, and a
 * record that says it is incomplete (`storeError`) is not passed off as whole: either raises
 * `SandboxError` "store_failed". (A live run's unfinished last line is simply not read yet.)
 */
export async function* readEvents(
  id: string,
  options: { follow?: boolean; signal?: AbortSignal; pollMs?: number } = {},
): AsyncGenerator<string> {
  for await (const batch of readEventBatches(id, options)) yield* batch;
}

/** Like `readEvents`, in batches of the lines each read of the file completed (fast to print). */
export async function* readEventBatches(
  id: string,
  options: { follow?: boolean; signal?: AbortSignal; pollMs?: number } = {},
): AsyncGenerator<string[]> {
  const path = `${runsDir()}/${id}/events.ndjson`;
  using file = await Deno.open(path, { read: true });
  const decoder = new TextDecoder();
  const buffer = new Uint8Array(256 * 1024);
  let pending = "";
  const take = (n: number): string[] => {
    pending += decoder.decode(buffer.subarray(0, n), { stream: true });
    const lines = pending.split("\n");
    pending = lines.pop() ?? "";
    return lines;
  };
  while (true) {
    const n = await file.read(buffer);
    if (n !== null && n > 0) {
      const lines = take(n);
      if (lines.length > 0) yield lines;
      continue;
    }
    if (options.signal?.aborted) return;
    if (!options.follow) return await checkRecordEnd(id, pending);
    const meta = await readRun(id);
    if (!meta || meta.status !== "running") {
      // One more read: events written between our last read and the status change.
      const last = await file.read(buffer);
      if (last === null || last === 0) return await checkRecordEnd(id, pending);
      const lines = take(last);
      if (lines.length > 0) yield lines;
      continue;
    }
    await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 100));
  }
}

/** Raises if an ended run's record is torn (`rest`: what follows its last newline) or incomplete. */
async function checkRecordEnd(id: string, rest: string): Promise<void> {
  const meta = await readRun(id);
  if (!meta || meta.status === "running") return;
  const why = meta.storeError ? ` (${meta.storeError})` : "";
  if (rest !== "") {
    throw new SandboxError(
      "store_failed",
      `The log of run "${id}" ends in a torn line (${rest.length} characters without their newline): its record is incomplete${why}`,
    );
  }
  if (meta.storeError) {
    throw new SandboxError(
      "store_failed",
      `The log of run "${id}" is incomplete: ${meta.storeError}`,
    );
  }
}
