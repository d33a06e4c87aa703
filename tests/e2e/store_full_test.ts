/**
 * A run whose state directory's disk fills while it runs, as a user meets it: the real CLI, a real
 * sandbox, the fake LLM held between two turns while the test fills a small tmpfs mounted as the
 * state directory. The run must still close stdout as the protocol promises, exit 74 with one
 * line saying so, and leave a record that says what happened (never `running`, never a torn line
 * passed off as the end); `runs` and `logs` must say it is incomplete.
 */
import assert from "node:assert/strict";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";
import { HeldLlm } from "../_held_llm.ts";
import { writeThenExecute } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain, runCli, spawnCli, tempDir } from "../_helpers.ts";
import { fillDisk, mountTmpfs } from "../_tmpfs.ts";
import { EXIT } from "../../lib/errors.ts";
import type { RunMeta } from "../../lib/run/run_log.ts";

console.error("e2e: full state disk tests starting");

const KEY_ENV = "SANDBOX_E2E_STORE_KEY";
/** Room for what a run keeps in a fresh state directory (the worker bundle's cache, mostly). */
const STATE_DISK_BYTES = 96 * 1024 * 1024;

/** stderr's lines that report an error, and any line of a stack trace. */
function errorLines(stderr: string): { errors: string[]; stack: string[] } {
  const lines = stderr.split("\n");
  return {
    errors: lines.filter((l) => /error/i.test(l)),
    stack: lines.filter((l) => /^\s+at /.test(l) || /internal error/.test(l)),
  };
}

Deno.test({
  name:
    "a state disk that fills during a run: stdout still ends with result and usage (saying the record is incomplete), exit 74 with one line, and runs and logs say so",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    // The command's output (cut to 10,000 characters on the wire) is more than the page of the log's
    // file that a full tmpfs still has room in: its event cannot be written.
    await using llm = new HeldLlm(writeThenExecute("a.txt", "a\n", "cat a.txt; seq 1 3000"));
    // The agent's second LLM call (after the file is written) waits while the disk fills.
    const held = llm.hold(2);
    await using fixture = await RunFixture.make({
      prefix: "e2e-full",
      llmUrl: llm.baseUrl,
      keyEnv: KEY_ENV,
      prompt: "Write the file, then run the command.\n",
    });
    await using disk = await mountTmpfs(fixture.stateDir, STATE_DISK_BYTES);
    let stderr = "";
    const cli = spawnCli(
      [
        "run",
        "agentic",
        "--prompt-file",
        fixture.promptFile,
        "--profile",
        fixture.profile,
        "--format",
        "ndjson",
      ],
      {
        config: fixture.config,
        env: fixture.env,
        timeoutMs: CLI_TIMEOUT_MS,
        onStderrChunk: (text) => void (stderr += text),
      },
    );
    const stdout: string[] = [];
    const lines = cli.lines();
    const explainRun = (code?: number) =>
      `exit ${code}\n--- stdout\n${stdout.join("\n")}\n--- stderr\n${stderr}`;
    let read = false;
    try {
      // Printed, so appended: the write_file tool_result is the last event the store holds.
      while (true) {
        const next = await lines.next();
        if (next.done) assert.fail(`the run ended early\n${explainRun()}`);
        stdout.push(next.value);
        const message = JSON.parse(next.value);
        if (message.type === "tool_result" && message.tool_name === "write_file") break;
      }
      await held;
      await fillDisk(disk.path);
      llm.release();
      for await (const line of { [Symbol.asyncIterator]: () => lines }) stdout.push(line);
      read = true;
    } finally {
      if (!read) cli.kill(); // a failed test does not leave the CLI behind
    }
    const outcome = await cli.finished;
    const context = explainRun(outcome.exitCode);
    const id = stderr.match(/^sandbox: run (\S+) \(/)?.[1];
    assert.ok(id, `stderr names no run\n${context}`);
    const runDir = `${fixture.stateDir}/sandbox/runs/${id}`;

    await t.step("exit 74, one line saying the record is incomplete, no stack trace", () => {
      assert.equal(outcome.exitCode, EXIT.storeFailed, context);
      const { errors, stack } = errorLines(stderr);
      assert.deepEqual(stack, [], context);
      assert.equal(errors.length, 1, context);
      assert.match(
        errors[0],
        /^sandbox: error: The run's record is incomplete: cannot write \S+\/events\.ndjson: No space left on device/,
      );
    });

    await t.step(
      "stdout is the whole run, closed by the agent's result and a usage line that says the record is incomplete",
      () => {
        const messages = stdout.map((l) => JSON.parse(l));
        assert.match(
          messages.map((m) => m.type).join(","),
          /^tool_call,tool_result,tool_call,tool_result,(thinking,)?result,usage$/,
          context,
        );
        const result = messages.at(-2);
        assert.equal(result.is_error, false, context);
        assert.equal(result.content, "Done: wrote the file and ran the command");
        const usage = messages.at(-1);
        assert.match(
          usage.content,
          /^The run's record is incomplete: cannot write \S+\/events\.ndjson: No space left on device/,
        );
        assert.equal(usage.usage.input_tokens, llm.fake.usage.promptTokens, context);
        assert.deepEqual(
          messages.filter((m) => m.type === "tool_result")[1].tool_output.split("\n").slice(0, 3),
          ["a", "1", "2"],
        );
      },
    );

    /** The lines the log holds: the events up to the first that could not be written. */
    let stored: string[] = [];
    await t.step(
      "the log ends with the last event written before the disk filled, a whole line",
      async () => {
        const text = await Deno.readTextFile(`${runDir}/events.ndjson`);
        assert.ok(text.endsWith("\n"), `a torn last line: ${text.slice(-200)}`);
        stored = text.slice(0, -1).split("\n");
        // The write_file call and result; the execute call too if it fit.
        assert.ok(stored.length === 2 || stored.length === 3, text);
        assert.deepEqual(stored, stdout.slice(0, stored.length));
      },
    );

    await t.step(
      "meta.json says how the run ended and that its record is incomplete; no temporary file is left",
      async () => {
        const meta: RunMeta = JSON.parse(await Deno.readTextFile(`${runDir}/meta.json`));
        assert.equal(meta.status, "succeeded");
        assert.equal(meta.exitCode, EXIT.storeFailed);
        assert.match(meta.storeError ?? "", /events\.ndjson: No space left on device/);
        assert.ok(meta.endedAt !== null);
        const names = [];
        for await (const entry of Deno.readDir(runDir)) names.push(entry.name);
        assert.deepEqual(names.sort(), ["events.ndjson", "meta.json"]);
      },
    );

    await t.step("with the disk still full, runs says the log is incomplete", async () => {
      const json = await fixture.cli(["runs", "--json"]);
      assert.equal(json.exitCode, 0, explain(json));
      const listed: RunMeta[] = JSON.parse(json.stdout);
      assert.deepEqual(listed.map((r) => [r.id, r.status, r.exitCode]), [[
        id,
        "succeeded",
        EXIT.storeFailed,
      ]]);
      assert.match(listed[0].storeError ?? "", /No space left on device/);
      const table = await fixture.cli(["runs"]);
      assert.equal(table.exitCode, 0, explain(table));
      assert.match(table.stdout, new RegExp(`${id} .* succeeded \\(log incomplete\\) `));
    });

    await t.step(
      "logs prints what was stored, then exits 74 saying the log is incomplete",
      async () => {
        const logs = await fixture.cli(["logs", id, "--format", "ndjson"]);
        assert.equal(logs.exitCode, EXIT.storeFailed, explain(logs));
        assert.deepEqual(logs.stdout.slice(0, -1).split("\n"), stored);
        assert.deepEqual(errorLines(logs.stderr).stack, [], explain(logs));
        assert.match(
          logs.stderr,
          new RegExp(
            `^sandbox: error: The log of run "${id}" is incomplete: cannot write \\S+/events\\.ndjson: No space left on device.*\\n$`,
          ),
        );
      },
    );
  },
});

Deno.test("logs reports a run whose log ends in a torn line (exit 74, one line), after printing its whole lines", async () => {
  await using dir = await tempDir("sandbox-e2e-torn-");
  const id = "20300101-000000-abcdef";
  const runDir = `${dir.path}/sandbox/runs/${id}`;
  await Deno.mkdir(runDir, { recursive: true });
  const whole = JSON.stringify({
    type: "thinking",
    content: "first",
    tool_name: null,
    tool_input: null,
    tool_output: null,
    tool_call_id: null,
    session_id: null,
    is_error: false,
    model: "m",
    usage: null,
  });
  await Deno.writeTextFile(`${runDir}/events.ndjson`, `${whole}\n{"type":"result","cont`);
  const meta = {
    id,
    mode: "agentic",
    profile: "p",
    model: "m",
    sandbox: "container",
    status: "crashed",
    startedAt: "2030-01-01T00:00:00.000Z",
    endedAt: null,
    durationMs: null,
    exitCode: null,
    usage: null,
    error: null,
    pid: 0,
    storeError: null,
  };
  await Deno.writeTextFile(`${runDir}/meta.json`, JSON.stringify(meta));
  for (const follow of [[], ["--follow"]]) {
    const logs = await runCli(["logs", id, "--format", "ndjson", ...follow], {
      env: { XDG_STATE_HOME: dir.path },
    });
    assert.equal(logs.exitCode, EXIT.storeFailed, explain(logs));
    assert.equal(logs.stdout, `${whole}\n`, explain(logs));
    assert.equal(
      logs.stderr,
      `sandbox: error: The log of run "${id}" ends in a torn line (22 characters without their newline): its record is incomplete\n`,
    );
  }
});
