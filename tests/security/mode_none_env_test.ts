/**
 * Sandbox mode none runs the worker on the host with no isolation, but still without the key: a
 * scripted agent prints its command's environment and the worker process's own
 * (`/proc/<worker>/environ`), and the key — set in the environment of the `sandbox` process that
 * starts the run, and in use by it (the fake LLM answers only to the exact key) — is in neither,
 * while the session token is (the positive control: the dump is real and complete). The dumps travel
 * base64-encoded so that no redaction on the way could hide a leak.
 */
import assert from "node:assert/strict";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { FAKE_LLM_KEY, FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { RunFixture } from "../_run_fixture.ts";
import { explain, tempDir } from "../_helpers.ts";

console.error("security: mode none environment tests starting");

const KEY_ENV = "SANDBOX_SEC_NONE_KEY";

/** The tool's environment, the worker's (its parent's) environment and command line, each base64. */
const DUMP = [
  `printf 'tool=%s\\n' "$(env | base64 -w0)"`,
  `printf 'worker=%s\\n' "$(base64 -w0 < /proc/$PPID/environ)"`,
  `printf 'worker-cmd=%s\\n' "$(tr '\\0' ' ' < /proc/$PPID/cmdline | base64 -w0)"`,
].join("; ");

function decoded(output: string, name: string, context: string): string {
  const match = new RegExp(`^${name}=(\\S+)$`, "m").exec(output);
  assert.ok(match, `the agent printed no ${name} dump\n${context}`);
  return new TextDecoder().decode(Uint8Array.from(atob(match[1]), (c) => c.charCodeAt(0)));
}

Deno.test("mode none: the key is in neither the worker's environment nor its commands', the session token is", async () => {
  await using llm = new FakeLlm([toolCall("execute", { command: DUMP }), text("dumped")]);
  await using fixture = await RunFixture.make({
    prefix: "sec-none-env",
    llmUrl: llm.baseUrl,
    keyEnv: KEY_ENV,
    prompt: "Show me your environment",
    sandboxYaml: "{mode: none}",
  });
  await using work = await tempDir("sandbox-sec-none-cwd-");
  // The key also under the name a stock SDK would read, in the process that starts the run.
  const result = await fixture.cli(
    [
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "ndjson",
      "--cwd",
      work.path,
    ],
    { OPENAI_API_KEY: FAKE_LLM_KEY },
  );
  const messages = result.stdout.trim().split("\n").filter(Boolean).map((line, i) =>
    decodeMessage(line, i + 1)
  );
  const output =
    messages.find((m) => m.type === "tool_result" && m.tool_name === "execute")?.tool_output ?? "";
  const context = `${explain(result)}\n--- agent output\n${output}`;
  assert.equal(result.exitCode, 0, context);
  assert.match(result.stderr, /UNSAFE/, context);
  // The run used the key: the fake LLM answers only to it, and it answered both turns.
  assert.equal(llm.completions, 2, context);
  assert.ok(
    llm.requests.every((r) => r.headers.get("authorization") === `Bearer ${FAKE_LLM_KEY}`),
    context,
  );

  const toolEnv = decoded(output, "tool", context);
  const workerEnv = decoded(output, "worker", context).replaceAll("\0", "\n");
  const workerCommand = decoded(output, "worker-cmd", context);
  // The dumped parent is the worker itself, running on this host (`worker serve`: its job, the
  // session variables included, arrives on its stdin, so its own environment is the host's minimum).
  assert.match(
    workerCommand,
    /\bdeno run\b.*\bworker[^ ]*\.js (serve|agentic)\b/,
    `not the worker: ${workerCommand}\n${context}`,
  );
  assert.ok(
    !workerCommand.includes(FAKE_LLM_KEY),
    `the worker's command line holds the key\n${workerCommand}`,
  );
  // Positive control: the agent's commands get the session token, in place of the key.
  assert.match(
    toolEnv,
    /^SANDBOX_LLM_TOKEN=sbx_[A-Za-z0-9_-]{20,}$/m,
    `the command's environment lacks the session token\n${toolEnv}`,
  );
  assert.match(
    toolEnv,
    /^OPENAI_API_KEY=sbx_/m,
    `the command's environment: OPENAI_API_KEY is not the token\n${toolEnv}`,
  );
  for (
    const [what, env] of [["the command's environment", toolEnv], [
      "the worker's environment",
      workerEnv,
    ]]
  ) {
    assert.ok(!env.includes(FAKE_LLM_KEY), `${what} holds the key\n${env}`);
    assert.doesNotMatch(
      env,
      new RegExp(`^${KEY_ENV}=`, "m"),
      `${what} has the key's variable\n${env}`,
    );
  }
});
