/**
 * `deno task bench` loads every `bench/*_bench.ts` before it runs any: one module that does not
 * export a benchmark stops them all. Each must export one, with a unique name.
 */
import assert from "node:assert/strict";
import { loadBenchmarks } from "../../bench/main.ts";

Deno.test("every bench module exports a benchmark with a unique name", async () => {
  const benchmarks = await loadBenchmarks();
  assert.ok(benchmarks.length >= 5, `only ${benchmarks.length} benchmarks found`);
  const names = benchmarks.map((b) => b.name);
  assert.equal(new Set(names).size, names.length, `duplicate names: ${names.join(", ")}`);
  for (const benchmark of benchmarks) {
    assert.equal(typeof benchmark.run, "function", benchmark.name);
    assert.ok(benchmark.title.length > 0, benchmark.name);
  }
});
