/**
 * Event store write throughput (lib/session/event_store.ts) against writing the same NDJSON lines
 * to a file, as a run log does. Target: at least 50 000 events/s into the store.
 *
 *   deno run -A bench/event_store_bench.ts [EVENTS] [BATCH]
 */
import { EventWriter, type SessionEventInit } from "../lib/session/event_store.ts";

const EVENTS = Number(Deno.args[0] ?? 100_000);
const BATCH = Number(Deno.args[1] ?? 500);
const TARGET_PER_S = 50_000;

function events(): SessionEventInit[] {
  return Array.from({ length: EVENTS }, (_, i) => ({
    channel: "agent",
    type: "output" as const,
    source: "agent" as const,
    data: JSON.stringify({ type: "text", text: `line ${i} of some agent output`, i }),
  }));
}

async function main(): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "event-store-bench-" });
  try {
    const all = events();
    const store = measure(() => {
      using writer = new EventWriter("bench", `${dir}/store.db`);
      for (let i = 0; i < all.length; i += BATCH) writer.appendMany(all.slice(i, i + BATCH));
    });
    const file = measure(() => {
      using out = Deno.openSync(`${dir}/events.ndjson`, { append: true, create: true });
      const encoder = new TextEncoder();
      for (const event of all) out.writeSync(encoder.encode(JSON.stringify(event) + "\n"));
    });
    const line = (name: string, ms: number) =>
      `${name.padEnd(34)} ${
        Math.round(EVENTS / (ms / 1000)).toLocaleString("en").padStart(10)
      } events/s`;
    console.log(`event store: ${EVENTS} events, transactions of ${BATCH}`);
    console.log(line("store.db (SQLite, WAL)", store));
    console.log(line("events.ndjson (one write per line)", file));
    const perS = EVENTS / (store / 1000);
    console.log(`target ${TARGET_PER_S} events/s: ${perS >= TARGET_PER_S ? "met" : "NOT met"}`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function measure(work: () => void): number {
  const start = performance.now();
  work();
  return performance.now() - start;
}

if (import.meta.main) await main();
