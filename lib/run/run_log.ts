/**
 * Durable run records: `<state dir>/runs/<run id>/` holds `events.ndjson` (append-only, one
 * event per line, written as each event arrives) and `meta.json` (replaced atomically); a run of
 * an agent CLI also keeps `agent-events.ndjson`, every line the agent printed, verbatim (its own
 * event kinds, translated or not, so that nothing it said is lost).
 *
 * Durability: each event is one write(2) to a file opened for append, issued before the event is
 * printed, so a crashed or closed terminal (or a killed CLI) loses nothing the CLI had received; the
 * file is fsynced when the run ends. A power loss can lose the events of the last moments.
 */
import { userStateDir } from "../config.ts";
import type { AgenticMessage, DriverUsage } from "./protocol.ts";
import { isProcessAlive } from "../process.ts";
import type { Redactor } from "../redact.ts";

export type RunStatus = "running" | "succeeded" | "failed" | "timed_out" | "interrupted" | "crashed";

export interface RunMeta {
  id: string;
  mode: "agentic" | "generate";
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
  /** Extra facts from later stages (branch, base commit...). */
  extra?: Record<string, unknown>;
}

export function runsDir(): string {
  return `${userStateDir()}/runs`;
}

/** A new run id: sortable by start time, unique across concurrent runs. */
export function newRunId(now = new Date()): string {
  const stamp = now.toISOString().replace(/[-:]/g, "").replace("T", "-").slice(0, 15);
  return `${stamp}-${crypto.randomUUID().slice(0, 6)}`;
}

export class RunLog implements AsyncDisposable {
  readonly dir: string;
  meta: RunMeta;
  readonly #file: Deno.FsFile;
  readonly #encoder = new TextEncoder();
  readonly #redactor?: Redactor;
  #agentEvents: Deno.FsFile | undefined;

  private constructor(dir: string, meta: RunMeta, file: Deno.FsFile, redactor?: Redactor) {
    this.dir = dir;
    this.meta = meta;
    this.#file = file;
    this.#redactor = redactor;
  }

  static async create(
    init: Pick<RunMeta, "id" | "mode" | "profile" | "model" | "sandbox">,
    redactor?: Redactor,
  ): Promise<RunLog> {
    const dir = `${runsDir()}/${init.id}`;
    await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
    const file = await Deno.open(`${dir}/events.ndjson`, { append: true, create: true, mode: 0o600 });
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
    };
    const log = new RunLog(dir, meta, file, redactor);
    await log.#writeMeta();
    return log;
  }

  /**
   * Append one event (secrets redacted). A synchronous write: a local file write does not block
   * for long, and an awaited one per event would halve the events per second a run can carry.
   */
  append(message: AgenticMessage): Promise<void> {
    let line = JSON.stringify(message);
    if (this.#redactor) line = this.#redactor.redact(line);
    let bytes = this.#encoder.encode(line + "\n");
    while (bytes.length > 0) bytes = bytes.subarray(this.#file.writeSync(bytes));
    return Promise.resolve();
  }

  /** Append one line an agent CLI printed (secrets redacted), to `agent-events.ndjson`. */
  appendAgentEvent(line: string): void {
    this.#agentEvents ??= Deno.openSync(`${this.dir}/agent-events.ndjson`, { append: true, create: true, mode: 0o600 });
    let text = line.replace(/\n/g, " ");
    if (this.#redactor) text = this.#redactor.redact(text);
    let bytes = this.#encoder.encode(text + "\n");
    while (bytes.length > 0) bytes = bytes.subarray(this.#agentEvents.writeSync(bytes));
  }

  /** Record the outcome; the run's files are complete after this. */
  async finish(outcome: Pick<RunMeta, "status" | "exitCode" | "usage" | "error"> & { extra?: Record<string, unknown> }): Promise<void> {
    await this.#file.sync().catch(() => {});
    await this.#agentEvents?.sync().catch(() => {});
    const ended = new Date();
    this.meta = {
      ...this.meta,
      ...outcome,
      error: outcome.error && this.#redactor ? this.#redactor.redact(outcome.error) : outcome.error,
      extra: { ...this.meta.extra, ...outcome.extra },
      endedAt: ended.toISOString(),
      durationMs: ended.getTime() - Date.parse(this.meta.startedAt),
    };
    await this.#writeMeta();
  }

  async #writeMeta(): Promise<void> {
    const partial = `${this.dir}/meta.json.${Deno.pid}.tmp`;
    await Deno.writeTextFile(partial, JSON.stringify(this.meta, null, 2) + "\n", { mode: 0o600 });
    await Deno.rename(partial, `${this.dir}/meta.json`);
  }

  [Symbol.asyncDispose](): Promise<void> {
    this.#file.close();
    this.#agentEvents?.close();
    return Promise.resolve();
  }
}


/** The metadata of one run, with a dead "running" run reported as crashed. */
export async function readRun(id: string): Promise<RunMeta | undefined> {
  try {
    const meta = JSON.parse(await Deno.readTextFile(`${runsDir()}/${id}/meta.json`)) as RunMeta;
    if (meta.status === "running" && !await isProcessAlive(meta.pid)) meta.status = "crashed";
    return meta;
  } catch {
    return undefined;
  }
}

/** Every recorded run, newest first. */
export async function listRuns(): Promise<RunMeta[]> {
  const ids: string[] = [];
  try {
    for await (const entry of Deno.readDir(runsDir())) if (entry.isDirectory) ids.push(entry.name);
  } catch {
    return [];
  }
  const metas = await Promise.all(ids.sort().reverse().map(readRun));
  return metas.filter((m): m is RunMeta => m !== undefined);
}

/**
 * A run's events as lines, from the start. With `follow`, keeps reading as the run appends,
 * until its metadata says it ended (and the file is drained) or `signal` aborts.
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
    if (!options.follow || options.signal?.aborted) return;
    const meta = await readRun(id);
    if (!meta || meta.status !== "running") {
      // One more read: events written between our last read and the status change.
      const last = await file.read(buffer);
      if (last === null || last === 0) return;
      const lines = take(last);
      if (lines.length > 0) yield lines;
      continue;
    }
    await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 100));
  }
}
