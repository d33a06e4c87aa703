/**
 * The access log of the host proxies: one JSON object per line (NDJSON), one line per request
 * or connection, allowed or denied. It is how a user audits what an agent reached, so every
 * decision is written, and every line passes through the `Redactor` first.
 */
import type { Redactor } from "../redact.ts";

/** One request (LLM proxy) or one connection (egress proxy), written when it has ended. */
export interface AccessLogEntry {
  /** When the request arrived, ISO 8601. */
  time: string;
  kind: "llm" | "egress" | "git";
  decision: "allow" | "deny";
  method: string;
  /** The destination host (the upstream), or "" when the request was too malformed to name one. */
  host: string;
  port: number;
  /** Egress: the IP address the proxy actually connected to (after `network.hosts` or DNS). */
  address?: string;
  path?: string;
  /** Git proxy: the request target (path and query) exactly as the sandbox sent it. */
  target?: string;
  /** The HTTP status the sandbox received (200 for an established CONNECT tunnel). */
  status?: number;
  /** Bytes received by the sandbox (upstream → sandbox). */
  bytesIn: number;
  /** Bytes sent by the sandbox (sandbox → upstream): what could carry data out. */
  bytesOut: number;
  durationMs: number;
  profile: string;
  runId: string | null;
  /** Why it was denied or failed, in words. */
  reason?: string;
}

export interface AccessLogOptions {
  /** Append lines to this file (created with mode 0600 when missing). */
  path?: string;
  /** Called with each entry, already redacted. */
  onEntry?: (entry: AccessLogEntry) => void;
  redactor?: Redactor;
}

/**
 * Appends entries to a file and/or hands them to a callback. `write()` never blocks the request
 * that is being logged; `flush()` and `close()` wait for pending writes and raise the first
 * write error, so a log that could not be written does not go unnoticed.
 */
export class AccessLog {
  readonly #path: string | undefined;
  readonly #onEntry: ((entry: AccessLogEntry) => void) | undefined;
  readonly #redactor: Redactor | undefined;
  readonly #encoder = new TextEncoder();
  #file: Deno.FsFile | undefined;
  /** Writes are chained so that lines keep their order and never interleave. */
  #pending: Promise<void> = Promise.resolve();
  /** Lines not yet handed to a write: those that arrive while one is under way go in the next. */
  #queued: Uint8Array[] = [];
  #error: unknown = undefined;
  #closed = false;

  constructor(options: AccessLogOptions = {}) {
    this.#path = options.path;
    this.#onEntry = options.onEntry;
    this.#redactor = options.redactor;
  }

  /** Record one entry. Entries written after `close()` are dropped. */
  write(entry: AccessLogEntry): void {
    if (this.#closed) return;
    const redacted = this.#redactor ? this.#redactor.redactValue(entry) : entry;
    const line = JSON.stringify(redacted) + "\n";
    if (this.#path !== undefined) {
      this.#queued.push(this.#encoder.encode(line));
      if (this.#queued.length === 1) {
        this.#pending = this.#pending.then(() => this.#append(joinQueued(this.#queued.splice(0))))
          .catch((error) => {
            this.#error ??= error;
          });
      }
    }
    this.#onEntry?.(redacted);
  }

  /** Wait until every entry so far is on disk; raises the first write error, if any. */
  async flush(): Promise<void> {
    await this.#pending;
    if (this.#error !== undefined) throw this.#error;
  }

  /** Flush and close the file. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    try {
      await this.flush();
    } finally {
      this.#file?.close();
      this.#file = undefined;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /**
   * Under a shared lock, and to the file that is at the path now: `sandbox prune` moves the file
   * aside and takes an exclusive lock on it before reading it (lib/run/retention.ts), so a line
   * is either in what it reads or in the new file, never lost between them.
   */
  async #append(bytes: Uint8Array): Promise<void> {
    const path = this.#path!;
    while (true) {
      this.#file ??= await Deno.open(path, { append: true, create: true, mode: 0o600 });
      const file = this.#file;
      await file.lock(false);
      try {
        const [open, current] = await Promise.all([
          file.stat(),
          Deno.stat(path).catch(() => undefined), // moved aside and not yet recreated
        ]);
        if (current?.ino === open.ino) {
          // One write of whole lines: with O_APPEND, another process's cannot land inside ours.
          const written = await file.write(bytes);
          if (written < bytes.length) await file.write(bytes.subarray(written));
          return;
        }
      } finally {
        await file.unlock();
      }
      file.close();
      this.#file = undefined;
    }
  }
}

function joinQueued(lines: Uint8Array[]): Uint8Array {
  const joined = new Uint8Array(lines.reduce((sum, line) => sum + line.length, 0));
  let offset = 0;
  for (const line of lines) {
    joined.set(line, offset);
    offset += line.length;
  }
  return joined;
}
