/**
 * `sandbox egress suggest` on a real run: the agent's requests to names off the allowlist are
 * denied by the egress proxy (403; nothing leaves this machine: the names are `.invalid` and the
 * proxy refuses before it resolves), and the suggestion is the smallest allowlist that would have
 * let them through — read from the access log, never applied.
 */
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";

console.error("e2e: egress suggest tests starting");

/** Two plain requests to one name, one CONNECT to another on a port of its own. */
const COMMAND =
  "for p in a b; do curl -s -o /dev/null -w '%{http_code} ' http://denied-one.invalid/$p; done; " +
  "curl -s -o /dev/null -w '%{http_code}' https://denied-two.invalid:8443/; true";

Deno.test({
  name:
    "egress suggest lists the hosts a run was denied, grouped with counts, as an allowlist to review; the profile is unchanged",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([toolCall("execute", { command: COMMAND }), text("done")]);
    await using fixture = await RunFixture.make({
      prefix: "e2e-suggest",
      llmUrl: llm.baseUrl,
      keyEnv: "SANDBOX_E2E_SUGGEST_KEY",
      prompt: "Fetch the pages.\n",
    });
    const configBefore = await Deno.readTextFile(fixture.config);
    const run = await fixture.cli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
    ]);
    assert.equal(run.exitCode, 0, explain(run));
    const runId = /run (\S+) \(/.exec(run.stderr)?.[1];
    assert.ok(runId, run.stderr);
    const output = run.stdout.trim().split("\n").map((l) => JSON.parse(l))
      .find((m) => m.type === "tool_result")?.tool_output ?? "";
    // The twin of the suggestion: the requests were really denied (curl saw the proxy's 403s;
    // a CONNECT refused is curl's 000 with the proxy's 403 in the log).
    assert.match(output, /^403 403 /, output);

    const suggested = await fixture.cli(["egress", "suggest", runId, "--json"]);
    assert.equal(suggested.exitCode, 0, explain(suggested));
    const report = JSON.parse(suggested.stdout);
    assert.deepEqual(report.runs, [runId]);
    const patterns = report.domains.flatMap((
      d: { patterns: { pattern: string; count: number }[] },
    ) => d.patterns.map((p) => [p.pattern, p.count])).sort();
    assert.deepEqual(patterns, [["denied-one.invalid", 2], ["denied-two.invalid:8443", 1]]);
    assert.deepEqual([...report.allow].sort(), ["denied-one.invalid", "denied-two.invalid:8443"]);

    const human = await fixture.cli(["egress", "suggest", runId]);
    assert.equal(human.exitCode, 0, explain(human));
    assert.match(human.stdout, /denied-one\.invalid/);
    assert.match(human.stdout, /allow:/);
    // Never applied: the configuration is as it was.
    assert.equal(await Deno.readTextFile(fixture.config), configBefore);

    const unknown = await fixture.cli(["egress", "suggest", "20200101-000000-000000"]);
    assert.equal(unknown.exitCode, 2, explain(unknown));
    assert.match(unknown.stderr, /^sandbox: .*20200101-000000-000000/m);
  },
});
