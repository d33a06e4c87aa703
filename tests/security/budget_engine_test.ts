/**
 * In a real container, the agent's own download through the egress proxy (curl, not the LLM)
 * is held to the run's egress budget: the run ends with exit 4 and an `is_error` result naming
 * `egress_bytes`; the same run under a larger budget completes.
 */
import assert from "node:assert/strict";
import { EXIT } from "../../lib/errors.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import {
  assertDocker,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
} from "../_helpers.ts";

/** A replay: one `execute` of `command`, then a text answer. */
function recording(command: string) {
  const usage = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
  const completion = (message: Record<string, unknown>, finish: string) => ({
    status: 200,
    body: {
      id: "chatcmpl-budget",
      object: "chat.completion",
      created: 0,
      model: "gpt-4.1-mini",
      choices: [{ index: 0, message: { role: "assistant", ...message }, finish_reason: finish }],
      usage,
    },
  });
  return {
    version: 1,
    kind: "openai",
    responses: [
      completion({
        content: null,
        tool_calls: [{
          id: "call_fetch",
          type: "function",
          function: { name: "execute", arguments: JSON.stringify({ command }) },
        }],
      }, "tool_calls"),
      completion({ content: "downloaded" }, "stop"),
    ],
  };
}

Deno.test({
  name: "a container's download through the egress proxy is held to the run's egress budget",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    console.log("budget engine test: started");
    await using dir = await tempDir("sandbox-budget-engine-");
    const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () => {
      return new Response(new Uint8Array(1_000_000).fill(0x61));
    });
    const profile = uniqueProfile("sec-budget");
    try {
      const port = server.addr.port;
      const config = `${dir.path}/sandbox.yaml`;
      await Deno.writeTextFile(
        config,
        `profiles:\n  ${profile}:\n    sandbox:\n      network:\n` +
          `        allow: ["budget.test:${port}"]\n        hosts: {budget.test: 127.0.0.1}\n`,
      );
      await Deno.writeTextFile(`${dir.path}/prompt.txt`, "Download the file.\n");
      const command =
        `curl -sS -o /dev/null -w 'got %{size_download}\\n' http://budget.test:${port}/big`;
      await Deno.writeTextFile(`${dir.path}/recording.json`, JSON.stringify(recording(command)));
      const run = (maxEgress: string) =>
        runCli([
          "run",
          "agentic",
          "-p",
          profile,
          "--prompt-file",
          `${dir.path}/prompt.txt`,
          "--model",
          `replay:${dir.path}/recording.json`,
          "--format",
          "ndjson",
          "--max-egress",
          maxEgress,
        ], { config, env: { XDG_STATE_HOME: `${dir.path}/state` } });

      await t.step("under --max-egress 100k the run ends at the budget, exit 4", async () => {
        const result = await run("100k");
        const context = explain(result);
        assert.equal(result.exitCode, EXIT.budget, context);
        const messages = result.stdout.trim().split("\n").map((l, i) => decodeMessage(l, i + 1));
        const [closing, usage] = messages.slice(-2);
        assert.equal(closing.type, "result", context);
        assert.equal(closing.is_error, true, context);
        assert.match(closing.content ?? "", /egress_bytes limit 102400 bytes, used \d+ bytes/);
        assert.equal(usage.type, "usage", context);
        assert.doesNotMatch(result.stdout, /got 1000000/, context);
      });

      await t.step(
        "the twin under --max-egress 10m completes with the whole download",
        async () => {
          const result = await run("10m");
          assert.equal(result.exitCode, 0, explain(result));
          assert.match(result.stdout, /got 1000000/, explain(result));
        },
      );
    } finally {
      await server.shutdown();
      await removeProfile(profile);
    }
  },
});
