/**
 * Each budget stops a replayed run (examples/hello: three calls of 118 tokens each) at the right
 * point, with an `is_error` result naming it, then `usage`, and exit 4; the same run under a
 * larger budget completes. The budget per day refuses a run before it starts. Mode none: the
 * budget is held by the host's proxies, as in a container (tests/security/budget_attack_test.ts).
 */
import assert from "node:assert/strict";
import { EXIT } from "../../lib/errors.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { dockerTest, explain, ROOT, runCli, tempDir, uniqueProfile } from "../_helpers.ts";

Deno.test({
  name: "budgets stop a replayed run at the limit; the twin under a larger one completes",
  ...dockerTest(),
  async fn(t) {
    await using dir = await tempDir("sandbox-e2e-budget-");
    const profile = uniqueProfile("e2e-budget");
    const config = `${dir.path}/sandbox.yaml`;
    await Deno.writeTextFile(
      config,
      `profiles:\n  ${profile}:\n    sandbox: {mode: none}\n` +
        `  ${profile}-req:\n    sandbox: {mode: none}\n    budget: {requests: 2}\n` +
        `  ${profile}-day:\n    sandbox: {mode: none}\n    budget: {per_day: {tokens: 400}}\n`,
    );
    await Deno.copyFile(`${ROOT}/examples/hello/prompt.txt`, `${dir.path}/prompt.txt`);
    await Deno.copyFile(`${ROOT}/examples/hello/recording.json`, `${dir.path}/recording.json`);
    await Deno.mkdir(`${dir.path}/work`);
    const env = { XDG_STATE_HOME: `${dir.path}/state` };
    const run = (name: string, ...flags: string[]) =>
      runCli([
        "run",
        "agentic",
        "-p",
        name,
        "--prompt-file",
        `${dir.path}/prompt.txt`,
        "--model",
        `replay:${dir.path}/recording.json`,
        "--format",
        "ndjson",
        "--cwd",
        `${dir.path}/work`,
        ...flags,
      ], { config, env });
    const closing = (stdout: string) => {
      const messages = stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
      assert.equal(messages.filter((m) => m.type === "result").length, 1);
      return { result: messages.at(-2)!, usage: messages.at(-1)! };
    };

    const cases: [string, string, string[], string[], RegExp][] = [
      [
        "tokens",
        profile,
        ["--max-tokens", "200"],
        ["--max-tokens", "400"],
        /tokens limit 200, used 236/,
      ],
      [
        "cost",
        profile,
        ["--max-cost", "0.0001"],
        ["--max-cost", "0.001"],
        /cost_usd limit \$0.0001, used/,
      ],
      [
        "requests (profile; the flag replaces it)",
        `${profile}-req`,
        [],
        ["--max-requests", "3"],
        /requests limit 2, used 2/,
      ],
    ];
    for (const [what, name, small, large, named] of cases) {
      await t.step(
        `${what}: stopped at the limit with exit 4, and the twin completes`,
        async () => {
          const stopped = await run(name, ...small);
          const context = explain(stopped);
          assert.equal(stopped.exitCode, EXIT.budget, context);
          const { result, usage } = closing(stopped.stdout);
          assert.equal(result.type, "result", context);
          assert.equal(result.is_error, true, context);
          assert.match(result.content ?? "", named, context);
          assert.equal(usage.type, "usage", context);
          assert.ok((usage.usage?.input_tokens ?? 0) >= 101, context);
          assert.match(stopped.stderr, /sandbox: error: Budget exceeded/, context);

          const completed = await run(name, ...large);
          assert.equal(completed.exitCode, 0, explain(completed));
          assert.equal(closing(completed.stdout).result.is_error, false, explain(completed));
        },
      );
    }

    await t.step("sandbox runs --json shows what each run used against which limits", async () => {
      const listed = await runCli(["runs", "--json", "-p", `${profile}-req`, "-n", "1"], {
        config,
        env,
      });
      assert.equal(listed.exitCode, 0, explain(listed));
      const [last] = JSON.parse(listed.stdout);
      assert.deepEqual(last.extra.budget.limits, { requests: 3 });
      assert.equal(last.extra.budget.used.requests, 3);
      assert.equal(last.extra.budget.used.tokens, 354);
      assert.equal(last.extra.budget.exceeded, null);
    });

    await t.step(
      "the budget per day: a run within it, one cut at what is left, then refusal",
      async () => {
        const first = await run(`${profile}-day`);
        assert.equal(first.exitCode, 0, explain(first));
        const second = await run(`${profile}-day`);
        assert.equal(second.exitCode, EXIT.budget, explain(second));
        assert.match(
          closing(second.stdout).result.content ?? "",
          /tokens limit 46, used 118 \(what was left of profile "[^"]+"'s budget per day\)/,
        );
        const refused = await run(`${profile}-day`);
        const context = explain(refused);
        assert.equal(refused.exitCode, EXIT.budget, context);
        assert.equal(refused.stdout, "", context);
        assert.match(
          refused.stderr,
          /^sandbox: error: Budget exceeded: tokens limit 400, used 472 \(profile "[^"]+"'s budget per day\); resets at \d{4}-\d\d-\d\dT00:00:00.000Z$/m,
          context,
        );
      },
    );
  },
});
