import assert from "node:assert/strict";
import { ResponseMeter, RunBudget } from "../../lib/proxy/budget.ts";
import { spentOn, startRunSpending } from "../../lib/run/period_budget.ts";
import type { SandboxError } from "../../lib/errors.ts";
import { profileFrom, tempDir } from "../_helpers.ts";
import { budgetFromFlags } from "../../cli/budget_flags.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const sse = (data: unknown) => encoder.encode(`data: ${JSON.stringify(data)}\n\n`);
const json = (value: unknown) => encoder.encode(JSON.stringify(value));

/** A meter of one response, with `push`ed chunks' passed bytes joined. */
function metered(budget: RunBudget, chunks: Uint8Array[], contentType = "text/event-stream") {
  const meter = new ResponseMeter(budget, { model: "gpt-4.1-mini", bodyBytes: 400 }, {
    status: 200,
    contentType,
  });
  let passed = "";
  let cut = false;
  for (const chunk of chunks) {
    const out = meter.push(chunk);
    passed += decoder.decode(out.pass);
    cut ||= out.cut;
  }
  passed += decoder.decode(meter.end());
  return { passed, cut, meter };
}

Deno.test("RunBudget", async (t) => {
  await t.step("admits requests up to the limit and refuses the next, naming it", () => {
    const errors: SandboxError[] = [];
    const budget = new RunBudget({ requests: 2 }, { onExceeded: (e) => errors.push(e) });
    assert.equal(budget.admitLlm(), undefined);
    assert.equal(budget.admitLlm(), undefined);
    assert.match(budget.admitLlm() ?? "", /requests limit 2, used 2/);
    assert.equal(errors.length, 1);
    assert.equal(errors[0].code, "budget_exceeded");
    assert.match(
      errors[0].message,
      /^Budget exceeded: requests limit 2, used 2 \(the run's budget\)$/,
    );
  });

  await t.step("a charge past the token limit reports the overrun once", () => {
    const errors: SandboxError[] = [];
    const budget = new RunBudget({ tokens: 100 }, { onExceeded: (e) => errors.push(e) });
    assert.equal(budget.chargeLlm("gpt-4.1-mini", { input: 60, output: 40 }), true);
    assert.equal(budget.chargeLlm("gpt-4.1-mini", { input: 1, output: 0 }), false);
    assert.equal(budget.chargeLlm("gpt-4.1-mini", { input: 1, output: 0 }), false);
    assert.equal(errors.length, 1);
    assert.match(errors[0].message, /tokens limit 100, used 101/);
    assert.deepEqual(budget.driverUsage(), {
      input_tokens: 62,
      output_tokens: 40,
      cost_usd: budget.used.cost_usd,
    });
  });

  await t.step(
    "under a cost budget, a model with no price passes it: its cost could not be held",
    () => {
      const budget = new RunBudget({ cost_usd: 1 });
      assert.equal(budget.chargeLlm("made-up-model", { input: 1, output: 1 }), false);
      assert.match(budget.admitLlm() ?? "", /price of model "made-up-model" is unknown/);
      const priced = new RunBudget({ cost_usd: 1 });
      assert.equal(priced.chargeLlm("gpt-4.1-mini", { input: 1, output: 1 }), true);
      assert.equal(priced.admitLlm(), undefined);
    },
  );

  await t.step("egress bytes past the limit are refused further requests", () => {
    const budget = new RunBudget({ egress_bytes: 10, egress_requests: 5 });
    assert.equal(budget.admitEgress(), undefined);
    assert.equal(budget.chargeEgress(10), true);
    assert.match(budget.admitEgress() ?? "", /egress_bytes limit 10 bytes, used 10 bytes/);
  });
});

Deno.test("ResponseMeter", async (t) => {
  await t.step("charges a JSON body's usage at its end (OpenAI and Anthropic shapes)", () => {
    const budget = new RunBudget({});
    metered(budget, [
      json({ model: "gpt-4.1-mini", usage: { prompt_tokens: 100, completion_tokens: 20 } }),
    ], "application/json");
    metered(budget, [json({
      type: "message",
      model: "claude-haiku-4-5",
      usage: { input_tokens: 5, cache_read_input_tokens: 10, output_tokens: 3 },
    })], "application/json");
    assert.equal(budget.used.tokens, 138);
  });

  await t.step(
    "cuts a stream before the event that passes the budget, and keeps what came before",
    () => {
      const budget = new RunBudget({ tokens: 50 });
      const start = {
        type: "message_start",
        message: { model: "claude-haiku-4-5", usage: { input_tokens: 30, output_tokens: 1 } },
      };
      const delta = { type: "message_delta", usage: { output_tokens: 40 } };
      const { passed, cut, meter } = metered(budget, [
        sse(start),
        sse({ type: "content_block_delta" }),
        sse(delta),
        sse({ type: "message_stop" }),
      ]);
      assert.equal(cut, true);
      assert.match(passed, /message_start/);
      assert.match(passed, /content_block_delta/);
      assert.doesNotMatch(passed, /message_delta|message_stop/);
      assert.equal(budget.used.tokens, 70);
      assert.match(
        decoder.decode(meter.cutEvent()),
        /^event: error\ndata: .*tokens limit 50, used 70/,
      );
    },
  );

  await t.step("the same stream under a larger budget passes whole, charged once per call", () => {
    const budget = new RunBudget({ tokens: 100 });
    const start = {
      type: "message_start",
      message: { model: "claude-haiku-4-5", usage: { input_tokens: 30, output_tokens: 1 } },
    };
    const delta = { type: "message_delta", usage: { output_tokens: 40 } };
    const events = [sse(start), sse(delta), sse({ type: "message_stop" })];
    const { passed, cut } = metered(budget, events);
    assert.equal(cut, false);
    assert.equal(passed, events.map((e) => decoder.decode(e)).join(""));
    assert.equal(budget.used.tokens, 70);
  });

  await t.step("an event split across chunks is held until its end, then passed", () => {
    const budget = new RunBudget({ tokens: 1000 });
    const whole = decoder.decode(sse({ usage: { prompt_tokens: 7, completion_tokens: 2 } }));
    const meter = new ResponseMeter(budget, { model: "gpt-4.1-mini", bodyBytes: 0 }, {
      status: 200,
      contentType: "text/event-stream",
    });
    assert.equal(meter.push(encoder.encode(whole.slice(0, 10))).pass.length, 0);
    assert.equal(decoder.decode(meter.push(encoder.encode(whole.slice(10))).pass), whole);
    assert.equal(budget.used.tokens, 9);
  });

  await t.step(
    "a successful response that reports no usage is charged an estimate, not zero",
    () => {
      const budget = new RunBudget({});
      metered(budget, [sse({ choices: [{ delta: { content: "x".repeat(400) } }] })]);
      // 400 request bytes / 4, plus the response's bytes / 4.
      assert.ok(budget.used.tokens >= 100 + 100, String(budget.used.tokens));
    },
  );
});

Deno.test("startRunSpending", async (t) => {
  await using state = await tempDir("sandbox-budget-store-");
  const storePath = `${state.path}/store.db`;
  const profile = profileFrom(
    `profiles:\n  work:\n    budget: {tokens: 500, requests: 9, per_day: {tokens: 1000}}\n`,
    "work",
  );
  const now = new Date("2026-11-27T10:00:00Z");

  await t.step("flags replace the profile's per-run limits", () => {
    const { budget } = startRunSpending(profile, { flags: { requests: 3 }, storePath, now });
    assert.deepEqual(budget.limits, { tokens: 500, requests: 3 });
  });

  await t.step(
    "a run's spending counts against the day, and caps the next run to what is left",
    async () => {
      const first = startRunSpending(profile, { storePath, now });
      first.budget.chargeLlm("gpt-4.1-mini", { input: 700, output: 0 });
      await first.record("run-1");
      assert.equal(spentOn(storePath, "work", "2026-11-27").tokens, 700);
      const second = startRunSpending(profile, { storePath, now });
      assert.equal(second.budget.limits.tokens, 300);
      second.budget.chargeLlm("gpt-4.1-mini", { input: 301, output: 0 });
      assert.equal(second.budget.overrun?.budget, "tokens");
      await second.record("run-2");
    },
  );

  await t.step(
    "a run over the day's budget is refused before it starts, saying when it resets",
    () => {
      assert.throws(
        () => startRunSpending(profile, { storePath, now }),
        (error: SandboxError) => {
          assert.equal(error.code, "budget_exceeded");
          assert.equal(
            error.message,
            `Budget exceeded: tokens limit 1000, used 1001 (profile "work"'s budget per day); resets at 2026-11-28T00:00:00.000Z`,
          );
          return true;
        },
      );
    },
  );

  await t.step("the next day starts afresh", () => {
    const next = startRunSpending(profile, { storePath, now: new Date("2026-11-28T00:00:01Z") });
    assert.equal(next.budget.limits.tokens, 500);
  });

  await t.step(
    "an egress budget with network mode full is a usage error (no proxy to hold it)",
    () => {
      const full = profileFrom(
        `profiles:\n  open:\n    sandbox: {network: {mode: full}}\n    budget: {egress_bytes: 1m}\n`,
        "open",
      );
      assert.throws(
        () => startRunSpending(full, { storePath, now }),
        /network mode "full" has no egress proxy/,
      );
    },
  );
});

Deno.test("budget settings and flags are checked at the boundary", async (t) => {
  await t.step("a budget that is not a positive number is a configuration issue naming it", () => {
    assert.throws(
      () => profileFrom(`profiles:\n  work:\n    budget: {tokens: -1}\n`, "work"),
      /budget.*tokens.*whole number above 0/,
    );
    assert.throws(
      () =>
        profileFrom(`profiles:\n  work:\n    budget: {per_day: {egress_bytes: lots}}\n`, "work"),
      /per_day.*egress_bytes.*size like/,
    );
  });

  await t.step("--max-* flags give limits; a bad one is a usage error naming the flag", () => {
    assert.deepEqual(
      budgetFromFlags({ maxTokens: "1000", maxCost: "0.5", maxRequests: "3", maxEgress: "1k" }),
      { tokens: 1000, cost_usd: 0.5, requests: 3, egress_bytes: 1024 },
    );
    assert.equal(budgetFromFlags({}), undefined);
    for (
      const [flags, message] of [
        [{ maxTokens: "1e3" }, /^Invalid --max-tokens "1e3": expected a whole number above 0/],
        [{ maxCost: "-1" }, /^Invalid --max-cost "-1"/],
        [{ maxRequests: "0" }, /^Invalid --max-requests "0"/],
        [{ maxEgress: "much" }, /^Invalid --max-egress "much"/],
      ] as const
    ) {
      assert.throws(() => budgetFromFlags(flags), (error: SandboxError) => {
        assert.equal(error.code, "usage");
        assert.match(error.message, message);
        return true;
      });
    }
  });
});
