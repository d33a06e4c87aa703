/**
 * Start-up and run-path timing, for finding where the milliseconds go: with `SANDBOX_TRACE=1`,
 * `trace("label")` writes `sandbox: trace 123.4 ms label` on stderr, the time counted from the
 * start of the process (Deno's time origin, so the runtime's own start is included). Off by
 * default; costs one environment lookup.
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

/** Is tracing on? */
export function tracing(): boolean {
  return enabled;
}

/** One trace line on stderr (when SANDBOX_TRACE is set). */
export function trace(label: string): void {
  if (!enabled) return;
  Deno.stderr.writeSync(
    encoder.encode(`sandbox: trace ${performance.now().toFixed(1)} ms ${label}\n`),
  );
}
