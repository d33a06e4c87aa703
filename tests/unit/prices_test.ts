import assert from "node:assert/strict";
import { costOf, priceOf, PRICES, roundUsd } from "../../lib/run/prices.ts";
import { normalizeToolName } from "../../lib/run/tool_names.ts";
import { formatDuration, parseDuration } from "../../lib/units.ts";

Deno.test("priceOf() finds a model under the names APIs report, and nothing for a merely similar name", () => {
  assert.equal(priceOf("gpt-4.1-mini"), PRICES["gpt-4.1-mini"]);
  assert.equal(priceOf("gpt-4.1-mini-2025-04-14"), PRICES["gpt-4.1-mini"]);
  assert.equal(priceOf("openai/gpt-4.1-mini"), PRICES["gpt-4.1-mini"]);
  assert.equal(priceOf("GPT-4o"), PRICES["gpt-4o"]);
  assert.equal(priceOf("claude-sonnet-4-5-20250929"), PRICES["claude-sonnet-4-5"]);
  assert.equal(priceOf("anthropic/claude-haiku-4-5"), PRICES["claude-haiku-4-5"]);
  assert.equal(priceOf("claude-3-5-haiku-latest"), PRICES["claude-3-5-haiku"]);
  assert.equal(priceOf("claude-opus-4-0"), PRICES["claude-opus-4"]);
  // Never a neighbour's price: a mini is not its big sibling, and unknown names have none.
  assert.notEqual(priceOf("gpt-4.1-mini"), PRICES["gpt-4.1"]);
  for (const unknown of ["gpt-4.1-mega", "replay", "default", "fake-model", "", null, undefined]) {
    assert.equal(priceOf(unknown), undefined, String(unknown));
  }
});

Deno.test("costOf() prices fresh, cached and cache-written input and output at their own rates", () => {
  // 1M fresh input + 1M output of gpt-4.1-mini: $0.40 + $1.60.
  assert.equal(costOf("gpt-4.1-mini", { input: 1_000_000, output: 1_000_000 }), 2);
  // Input counts the cached tokens too: 1M input of which 600k cached.
  assert.equal(
    roundUsd(costOf("gpt-4.1-mini", { input: 1_000_000, output: 0, cacheRead: 600_000 })!),
    roundUsd(0.4 * 0.4 + 0.1 * 0.6),
  );
  // Anthropic: 5-minute cache writes at 1.25x, hits at 0.1x.
  const sonnet = costOf("claude-sonnet-4-5", {
    input: 3_000_000,
    output: 1_000_000,
    cacheRead: 1_000_000,
    cacheWrite: 1_000_000,
  });
  assert.equal(roundUsd(sonnet!), roundUsd(3 + 0.3 + 3.75 + 15));
  assert.equal(costOf("mystery-model", { input: 10, output: 10 }), null);
});

Deno.test("every price in the table is a positive number, cache reads cheaper than fresh input", () => {
  for (const [model, price] of Object.entries(PRICES)) {
    for (const value of Object.values(price)) assert.ok(Number.isFinite(value) && value > 0, model);
    assert.ok(price.cacheRead < price.input, model);
    assert.ok(price.output >= price.input, model);
  }
});

Deno.test("normalizeToolName() maps Claude Code's tool names to the standard ones and passes others through", () => {
  assert.equal(normalizeToolName("Bash"), "run_shell_command");
  assert.equal(normalizeToolName("Read"), "read_file");
  assert.equal(normalizeToolName("Write"), "write_file");
  assert.equal(normalizeToolName("Edit"), "edit_file");
  assert.equal(normalizeToolName("WebFetch"), "web_fetch");
  for (
    const own of [
      "read_file",
      "write_file",
      "execute",
      "ls",
      "task",
      "unknown",
      "constructor",
      "toString",
    ]
  ) {
    assert.equal(normalizeToolName(own), own);
  }
});

Deno.test("formatDuration() writes a duration as a user would, the inverse of parseDuration()", () => {
  for (
    const [ms, text] of [[5_000, "5s"], [90_000, "1m30s"], [1_800_000, "30m"], [3_600_000, "1h"], [
      5_430_000,
      "1h30m30s",
    ], [500, "500ms"]] as const
  ) {
    assert.equal(formatDuration(ms), text);
    assert.equal(parseDuration(text), ms);
  }
});
