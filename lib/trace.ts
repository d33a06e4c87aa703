/**
 * Start-up and run-path timing, for finding where the milliseconds go: with `SANDBOX_TRACE=1`,
 * `trace("label")` writes `sandbox: trace 123.4 ms label` on stderr, the time counted from the
 * start of the process (Deno's time origin, so the runtime's own start is included) — or, in a
 * process started by one that passed its clock (`traceClock()`: a run's supervisor), from the start
 * of that one, so that the lines of both read on one clock. Off by default; costs one environment
 * lookup.
 */
const enabled = (() => {
  try {
    return Boolean(Deno.env.get("SANDBOX_TRACE"));
  } catch {
    // No --allow-env: tracing stays off.
    return false;
  }
})();
const encoder = new TextEncoder();

/** The time origin (ms since the epoch) of the process whose clock this one's trace lines use. */
const TRACE_ORIGIN_ENV = "SANDBOX_TRACE_ORIGIN";
/** How much later this process started than the one whose clock it uses (0: its own clock). */
const offsetMs = (() => {
  if (!enabled) return 0;
  const origin = Number(Deno.env.get(TRACE_ORIGIN_ENV));
  return Number.isFinite(origin) && origin > 0 ? performance.timeOrigin - origin : 0;
})();

/** Environment for a process this one starts: its trace lines then read on this one's clock. */
export function traceClock(): Record<string, string> {
  return enabled ? { [TRACE_ORIGIN_ENV]: String(performance.timeOrigin - offsetMs) } : {};
}

/** Is tracing on? */
export function tracing(): boolean {
  return enabled;
}

/** One trace line on stderr (when SANDBOX_TRACE is set). */
export function trace(label: string): void {
  if (!enabled) return;
  Deno.stderr.writeSync(
    encoder.encode(`sandbox: trace ${(performance.now() + offsetMs).toFixed(1)} ms ${label}\n`),
  );
}
