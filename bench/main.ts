/**
 * `deno task bench`: runs every benchmark module in `bench/` (files named `*_bench.ts`, in name
 * order) and prints one table per benchmark. Every figure stands beside its baseline, measured in
 * the same run (raw `docker exec`, a direct upstream…): the ratio, not the absolute time, is what
 * we compare between machines and commits.
 *
 * ```
 * deno task bench                 # every benchmark, tables on stdout
 * deno task bench proxy           # only benchmarks whose name contains "proxy"
 * deno task bench --json          # one JSON object on stdout
 * deno task bench --check         # exit 1 when a figure misses its target
 * ```
 *
 * Progress goes to stderr. A benchmark module exports `benchmark: Benchmark` (see below).
 */

/** One measured figure beside its baseline. */
export interface Figure {
  /** What is measured, e.g. "request latency p50". */
  name: string;
  /** e.g. "ms", "MB/s", "chunks/s", "%". */
  unit: string;
  /** The same figure without the thing under test (e.g. straight to the upstream). */
  baseline: number;
  /** The figure with the thing under test. */
  measured: number;
  /** Which direction is better: decides the sign shown as cost. */
  better: "lower" | "higher";
  /** The DESIGN.md target this figure is checked against, if any. */
  target?: { text: string; met: boolean };
}

export interface BenchResult {
  figures: Figure[];
  /** Context a reader needs: sample sizes, what was held constant. */
  notes?: string[];
}

export interface BenchContext {
  /** Aborted on Ctrl-C; a benchmark stops between measurements. */
  signal: AbortSignal;
  /** A progress line on stderr. */
  progress(message: string): void;
}

export interface Benchmark {
  /** Short, unique, used by the name filter: "proxy". */
  name: string;
  /** One line saying what is compared. */
  title: string;
  /** Column headers for the baseline and the measured figures, e.g. "direct", "proxy". */
  baselineLabel: string;
  measuredLabel: string;
  run(context: BenchContext): Promise<BenchResult>;
}

interface BenchOutcome {
  benchmark: Benchmark;
  durationMs: number;
  result?: BenchResult;
  error?: unknown;
}

const BENCH_FILE = /^[a-z0-9_]+_bench\.ts$/;
const EXIT = { ok: 0, failure: 1, usage: 2, interrupted: 130 } as const;
const encoder = new TextEncoder();

function progress(message: string): void {
  Deno.stderr.writeSync(encoder.encode(`bench: ${message}\n`));
}

/** Every `*_bench.ts` module next to this file, in name order. */
export async function loadBenchmarks(
  dir: URL = new URL(".", import.meta.url),
): Promise<Benchmark[]> {
  const files: string[] = [];
  for await (const entry of Deno.readDir(dir)) {
    if (entry.isFile && BENCH_FILE.test(entry.name)) files.push(entry.name);
  }
  files.sort();
  const benchmarks: Benchmark[] = [];
  for (const file of files) {
    const module = await import(new URL(file, dir).href);
    const benchmark = module.benchmark as Benchmark | undefined;
    if (typeof benchmark?.run !== "function") {
      throw new TypeError(
        `Benchmark module "${file}" does not export "benchmark" with a run() method`,
      );
    }
    benchmarks.push(benchmark);
  }
  return benchmarks;
}

/** The difference that counts as cost: measured − baseline. */
function diff(figure: Figure): number {
  return figure.measured - figure.baseline;
}

function ratio(figure: Figure): number | null {
  return figure.baseline === 0 ? null : figure.measured / figure.baseline;
}

/** Significant digits for humans: 0.0123, 1.23, 12.3, 1,234. */
export function formatNumber(value: number): string {
  if (!Number.isFinite(value)) return String(value);
  const abs = Math.abs(value);
  if (abs >= 1000) return Math.round(value).toLocaleString("en-US");
  if (abs >= 100) return value.toFixed(0);
  if (abs >= 10) return value.toFixed(1);
  if (abs >= 1) return value.toFixed(2);
  if (abs === 0) return "0";
  return value.toFixed(3);
}

function formatDiff(value: number): string {
  return (value > 0 ? "+" : value < 0 ? "−" : "±") + formatNumber(Math.abs(value));
}

/** Columns padded to their widest cell; numeric columns (`right`) aligned right. */
function renderTable(rows: string[][], right: ReadonlySet<number>): string {
  const widths = rows[0].map((_, i) => Math.max(...rows.map((row) => [...row[i]].length)));
  return rows.map((row) =>
    row.map((cell, i) => {
      const pad = " ".repeat(widths[i] - [...cell].length);
      return right.has(i) ? pad + cell : i === row.length - 1 ? cell : cell + pad;
    }).join("  ").trimEnd()
  ).join("\n");
}

/** The human report of one benchmark. */
export function formatOutcome(outcome: BenchOutcome): string {
  const { benchmark, result, error } = outcome;
  const heading = `${benchmark.name}: ${benchmark.title} (${
    (outcome.durationMs / 1000).toFixed(1)
  } s)`;
  if (result === undefined) {
    return `${heading}\n  FAILED: ${
      error instanceof Error ? error.stack ?? error.message : String(error)
    }`;
  }
  const rows = [[
    "FIGURE",
    "UNIT",
    benchmark.baselineLabel.toUpperCase(),
    benchmark.measuredLabel.toUpperCase(),
    "DIFF",
    "RATIO",
    "TARGET",
  ]];
  for (const figure of result.figures) {
    const r = ratio(figure);
    rows.push([
      figure.name,
      figure.unit,
      formatNumber(figure.baseline),
      formatNumber(figure.measured),
      formatDiff(diff(figure)),
      r === null ? "-" : `${r.toFixed(2)}x`,
      figure.target ? `${figure.target.text}: ${figure.target.met ? "met" : "MISSED"}` : "",
    ]);
  }
  const notes = (result.notes ?? []).map((note) => `  ${note}`);
  return [heading, renderTable(rows, new Set([2, 3, 4, 5])), ...notes].join("\n");
}

/** The machine-readable report: one object, snake_case keys. */
export function jsonReport(outcomes: BenchOutcome[]) {
  return {
    deno: Deno.version.deno,
    os: Deno.build.os,
    arch: Deno.build.arch,
    cpus: navigator.hardwareConcurrency,
    benchmarks: outcomes.map(({ benchmark, result, error, durationMs }) => ({
      name: benchmark.name,
      title: benchmark.title,
      baseline_label: benchmark.baselineLabel,
      measured_label: benchmark.measuredLabel,
      duration_ms: Math.round(durationMs),
      ok: result !== undefined,
      error: result === undefined ? (error instanceof Error ? error.message : String(error)) : null,
      figures: (result?.figures ?? []).map((figure) => ({
        name: figure.name,
        unit: figure.unit,
        baseline: figure.baseline,
        measured: figure.measured,
        diff: diff(figure),
        ratio: ratio(figure),
        better: figure.better,
        target: figure.target ?? null,
      })),
      notes: result?.notes ?? [],
    })),
  };
}

const USAGE = `Usage: deno task bench [--json] [--check] [NAME...]

Runs every bench/*_bench.ts module whose name contains one of NAME (all without NAME), and prints
each figure beside its baseline from the same run.

  --json    one JSON object on stdout instead of tables
  --check   exit 1 when a figure misses its DESIGN.md target`;

interface Args {
  json: boolean;
  check: boolean;
  filters: string[];
}

function parseArgs(args: string[]): Args | { help: true } | { error: string } {
  const parsed: Args = { json: false, check: false, filters: [] };
  for (const arg of args) {
    if (arg === "--json") parsed.json = true;
    else if (arg === "--check") parsed.check = true;
    else if (arg === "-h" || arg === "--help") return { help: true };
    else if (arg.startsWith("-")) return { error: `Unknown option "${arg}"` };
    else parsed.filters.push(arg.toLowerCase());
  }
  return parsed;
}

async function main(args: string[]): Promise<number> {
  const parsed = parseArgs(args);
  if ("help" in parsed) {
    console.log(USAGE);
    return EXIT.ok;
  }
  if ("error" in parsed) {
    progress(`error: ${parsed.error}\n${USAGE}`);
    return EXIT.usage;
  }
  const all = await loadBenchmarks();
  const selected = parsed.filters.length === 0
    ? all
    : all.filter((b) => parsed.filters.some((filter) => b.name.toLowerCase().includes(filter)));
  if (selected.length === 0) {
    progress(
      `error: no benchmark matches ${parsed.filters.map((f) => `"${f}"`).join(", ")} (available: ${
        all.map((b) => b.name).join(", ")
      })`,
    );
    return EXIT.usage;
  }

  const interrupt = new AbortController();
  const onSignal = () => interrupt.abort(new Error("Interrupted"));
  Deno.addSignalListener("SIGINT", onSignal);
  const outcomes: BenchOutcome[] = [];
  try {
    for (const benchmark of selected) {
      if (interrupt.signal.aborted) break;
      progress(`${benchmark.name}: ${benchmark.title}`);
      const started = performance.now();
      const outcome: BenchOutcome = { benchmark, durationMs: 0 };
      try {
        outcome.result = await benchmark.run({
          signal: interrupt.signal,
          progress: (message) => progress(`${benchmark.name}: ${message}`),
        });
      } catch (error) {
        outcome.error = error;
      }
      outcome.durationMs = performance.now() - started;
      outcomes.push(outcome);
      if (!parsed.json) console.log(formatOutcome(outcome) + "\n");
    }
  } finally {
    Deno.removeSignalListener("SIGINT", onSignal);
  }
  if (parsed.json) console.log(JSON.stringify(jsonReport(outcomes)));
  if (interrupt.signal.aborted) {
    progress("interrupted");
    return EXIT.interrupted;
  }
  if (outcomes.some((o) => o.result === undefined)) return EXIT.failure;
  const missed = outcomes.flatMap((o) => o.result?.figures ?? []).filter((f) =>
    f.target && !f.target.met
  );
  if (missed.length > 0) {
    progress(`missed targets: ${missed.map((f) => f.name).join(", ")}`);
    if (parsed.check) return EXIT.failure;
  }
  return EXIT.ok;
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
