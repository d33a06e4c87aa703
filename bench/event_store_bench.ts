/**
 * Event store write throughput (lib/session/event_store.ts): 100,000 session events into
 * `store.db` in transactions of 500, against writing the same NDJSON lines to a file one write
 * each, as a plain log would. Target: at least 50,000 events/s into the store.
 */
import type { BenchContext, Benchmark, BenchResult } from "./main.ts";
import { EventWriter, type SessionEventInit } from "../lib/session/event_store.ts";

const EVENTS = 100_000;
const BATCH = 500;
const TARGET_PER_S = 50_000;

function events(): SessionEventInit[] {
  return Array.from({ length: EVENTS }, (_, i) => ({
    channel: "agent",
    type: "output" as const,
    source: "agent" as const,
    data: JSON.stringify({ type: "text", text: `line ${i} of some agent output`, i }),
  }));
}

async function run(context: BenchContext): Promise<BenchResult> {
  const dir = await Deno.makeTempDir({ prefix: "event-store-bench-" });
  try {
    const all = events();
    context.progress(`event store: ${EVENTS} events into store.db, then into an NDJSON file`);
    const store = measure(() => {
      using writer = new EventWriter("bench", `${dir}/store.db`);
      for (let i = 0; i < all.length; i += BATCH) writer.appendMany(all.slice(i, i + BATCH));
    });
    const file = measure(() => {
      using out = Deno.openSync(`${dir}/events.ndjson`, { append: true, create: true });
      const encoder = new TextEncoder();
      for (const event of all) out.writeSync(encoder.encode(JSON.stringify(event) + "\n"));
    });
    const perS = (ms: number) => Math.round(EVENTS / (ms / 1000));
    return {
      figures: [{
        name: "session events written",
        unit: "events/s",
        baseline: perS(file),
        measured: perS(store),
        better: "higher",
        target: {
          text: `≥ ${TARGET_PER_S.toLocaleString("en")}/s`,
          met: perS(store) >= TARGET_PER_S,
        },
      }],
      notes: [`${EVENTS.toLocaleString("en")} events; the store in transactions of ${BATCH}`],
    };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function measure(work: () => void): number {
  const start = performance.now();
  work();
  return performance.now() - start;
}

export const benchmark: Benchmark = {
  name: "event_store",
  title: "session events into the store (SQLite, WAL) vs the same NDJSON into a file",
  baselineLabel: "ndjson file",
  measuredLabel: "store.db",
  run,
};
