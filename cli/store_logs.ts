/**
 * `sandbox logs ID --from SEQ|TIME`: a run's or a session's events from the event store
 * (lib/session/event_store.ts). A run's events are its NDJSON lines, printed as `logs` prints
 * them; a session's are terminal events, printed as NDJSON objects (or, on a terminal, what the
 * terminal showed). A run recorded before the store held its events is imported first.
 */
import { cliName } from "../lib/cli_name.ts";
import { SandboxError } from "../lib/errors.ts";
import { readEvents, readRun, type RunMeta } from "../lib/run/run_log.ts";
import {
  importLines,
  lastSeq,
  openEventDb,
  parseReplayFrom,
  replayStream,
  type SessionEvent,
} from "../lib/session/event_store.ts";
import { cliState, signal, stdout } from "./context.ts";

/** `logs` from the store when it is asked for (`--from`) or a session's; false: not this case. */
export async function logsFromStore(
  id: string,
  opts: { follow?: boolean; format?: string; from?: string },
): Promise<boolean> {
  const meta = await readRun(id);
  if (opts.from === undefined && meta?.mode !== "shell") return false;
  if (!meta) {
    throw new SandboxError("usage", `No run "${id}"`, {
      detail: `List runs with: ${cliName()} runs`,
    });
  }
  const from = opts.from === undefined ? { seq: 1 } : parseReplayFrom(opts.from);
  if (!from) {
    throw new SandboxError(
      "usage",
      `Invalid --from "${opts.from}": expected an event number or a time like "2025-01-31T12:00:00Z"`,
    );
  }
  if (meta.mode !== "shell" && meta.status !== "running") await importRun(meta);
  const pretty = (opts.format ?? (Deno.stdout.isTerminal() ? "pretty" : "ndjson")) === "pretty";
  const live = async () => (await readRun(id))?.status === "running";
  for await (const batch of replayStream(id, { from, follow: opts.follow, live, signal })) {
    await stdout.write(batch.map((event) => shown(event, meta, pretty)).join(""));
    if (stdout.closed) break;
  }
  if (signal.aborted) cliState.endedBySignal = true;
  return true;
}

function shown(event: SessionEvent, meta: RunMeta, pretty: boolean): string {
  if (meta.mode !== "shell") return event.data + "\n";
  return pretty ? (event.type === "input" ? "" : event.data) : JSON.stringify(event) + "\n";
}

/** An ended run whose events the store lacks in full is imported from its events.ndjson. */
async function importRun(meta: RunMeta): Promise<void> {
  const lines: string[] = [];
  try {
    for await (const line of readEvents(meta.id)) lines.push(line);
  } catch {
    // A torn or incomplete record: the whole lines read are what there is to import.
  }
  const db = openEventDb();
  try {
    if (lastSeq(db, meta.id) >= lines.length) return;
    // The store has fewer (its writes failed during the run): the file is the record.
    db.prepare("DELETE FROM events WHERE stream = ?").run(meta.id);
    importLines(db, meta.id, lines, meta.startedAt);
  } finally {
    db.close();
  }
}
