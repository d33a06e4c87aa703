/**
 * A tool result too large for the conversation, as a user's agent meets one: the real CLI, a real
 * sandbox (its filesystem root read-only), the built-in worker, and the scripted fake LLM behind
 * the credential proxy, which sees every request the agent makes. A command prints ~300 KB: the
 * agent must get deepagents' notice (the result saved to a file, its head and tail shown) and be
 * able to read that file, not an EROFS error.
 */
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";

console.error("e2e: large tool output tests starting");

const KEY_ENV = "SANDBOX_E2E_LARGE_KEY";
const LINES = 16_000;
/** ~304 KB: `test 000001 passed` … then a summary line and a failure, as a failing test run ends. */
const COMMAND =
  `seq -f 'test %06g passed' 1 ${LINES}; echo 'SUMMARY: ${LINES} passed, 1 failed'; exit 1`;

Deno.test({
  name:
    "a command printing 300 KB reaches the agent as deepagents' evicted-result notice with head and tail, and the saved file reads back",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: COMMAND }, "call_big"),
      toolCall("read_file", {
        file_path: "/large_tool_results/call_big.txt",
        offset: LINES - 2,
        limit: 3,
      }, "call_read"),
      text("read the log"),
    ]);
    await using fixture = await RunFixture.make({
      prefix: "e2e-large",
      llmUrl: llm.baseUrl,
      keyEnv: KEY_ENV,
      prompt: "Run the tests and read the end of their log.\n",
    });
    const result = await fixture.cli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "ndjson",
    ]);
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const messages = result.stdout.trim().split("\n").map((l) => JSON.parse(l));
    const results = messages.filter((m) => m.type === "tool_result");
    assert.deepEqual(results.map((m) => m.tool_call_id), ["call_big", "call_read"], context);

    /** What the agent saw of tool call `id`: the tool message of the next request to the LLM. */
    const seen = (request: number, id: string): string => {
      const message = llm.requests[request].body.messages.find((
        m: { role: string; tool_call_id?: string },
      ) => m.role === "tool" && m.tool_call_id === id);
      assert.ok(message, `request ${request} carries no result of ${id}`);
      return typeof message.content === "string"
        ? message.content
        : JSON.stringify(message.content);
    };

    await t.step(
      "the agent gets the notice: saved to /large_tool_results, head and tail shown, no EROFS",
      () => {
        const notice = seen(1, "call_big");
        assert.doesNotMatch(notice, /EROFS|read-only|could not be saved/i, notice);
        assert.match(
          notice,
          /^Tool result too large, the result of this tool call call_big was saved in the filesystem at this path: \/large_tool_results\/call_big\.txt/,
        );
        assert.match(notice, /test 000001 passed/, "the head is not shown");
        assert.match(notice, /lines truncated\] \.\.\./);
        assert.match(notice, /SUMMARY: 16000 passed, 1 failed/, "the tail is not shown");
        assert.match(
          notice,
          /\[Command failed with exit code 1\]$/,
          "the command's failure is not shown",
        );
        assert.ok(notice.length < 10_000, `the notice is ${notice.length} characters`);
        // The event stream carries the same, whole (it is under the wire's cut).
        assert.equal(results[0].tool_output, notice);
        assert.equal(
          results[0].is_error,
          true,
          "a failed command whose result was evicted is an error result",
        );
      },
    );

    await t.step(
      "the saved result is the command's whole output: its last lines read back through read_file",
      () => {
        const read = seen(2, "call_read");
        assert.doesNotMatch(read, /error|not found/i, read);
        assert.match(read, /test 015999 passed/, read);
        assert.match(read, /test 016000 passed/, read);
        assert.match(read, /SUMMARY: 16000 passed, 1 failed/, read);
      },
    );
  },
});
