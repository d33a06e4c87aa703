/**
 * lib/trace.ts: a process started with another's clock (`traceClock()`, as a run's supervisor is)
 * writes its trace lines on that clock, and passes the same clock on; without it, on its own.
 */
import assert from "node:assert/strict";
import { ROOT } from "../_helpers.ts";
import { run } from "../../lib/process.ts";

/** A child that traces once and prints what it would pass on (`traceClock()`) as JSON. */
async function child(env: Record<string, string>): Promise<{ ms: number; passed: unknown }> {
  const code = `import { trace, traceClock } from "${ROOT}/lib/trace.ts";\n` +
    `trace("here"); console.log(JSON.stringify(traceClock()));`;
  const result = await run([Deno.execPath(), "eval", "--no-config", code], {
    clearEnv: true,
    env: { PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin", ...env },
    timeoutMs: 60_000,
  });
  assert.equal(result.exitCode, 0, result.stderr);
  const line = /sandbox: trace ([\d.]+) ms here/.exec(result.stderr);
  return { ms: line ? Number(line[1]) : NaN, passed: JSON.parse(result.stdout) };
}

Deno.test("a process given another's clock traces on it and passes it on; without it, on its own clock", async () => {
  const origin = performance.timeOrigin + performance.now() - 60_000;
  const given = await child({ SANDBOX_TRACE: "1", SANDBOX_TRACE_ORIGIN: String(origin) });
  assert.ok(given.ms >= 60_000 && given.ms < 120_000, `on the given clock: ${given.ms}`);
  const passed = Number((given.passed as Record<string, string>).SANDBOX_TRACE_ORIGIN);
  assert.ok(Math.abs(passed - origin) < 1, `passes the same clock on: ${passed} vs ${origin}`);

  const own = await child({ SANDBOX_TRACE: "1" });
  assert.ok(own.ms > 0 && own.ms < 60_000, `twin: its own clock: ${own.ms}`);
  const ownOrigin = Number((own.passed as Record<string, string>).SANDBOX_TRACE_ORIGIN);
  assert.ok(ownOrigin > origin, "twin: it passes its own clock on");

  const off = await child({ SANDBOX_TRACE_ORIGIN: String(origin) });
  assert.ok(Number.isNaN(off.ms), "no trace line when tracing is off");
  assert.deepEqual(off.passed, {}, "nothing passed on when tracing is off");
});
