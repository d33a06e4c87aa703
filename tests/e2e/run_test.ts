/**
 * `sandbox run agentic|generate`, `sandbox runs` and `sandbox logs` as a user runs them: the real
 * CLI as a subprocess, a real sandbox container, and the scripted fake LLM on 127.0.0.1 behind the
 * credential proxy (the sandbox reaches the proxy through the relay on its exec stream). Every test
 * has its own profile (removed afterwards) and its own `$XDG_STATE_HOME`, so run logs are isolated.
 */
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";
import { HeldLlm } from "../_held_llm.ts";
import { MESSAGE_KEYS, USAGE_KEYS } from "../_seed_schema.ts";
import assert from "node:assert/strict";
import { readLines } from "../../lib/lines.ts";
import { MESSAGE_TYPES } from "../../lib/run/protocol.ts";
import { run, type RunResult } from "../../lib/process.ts";
import type { RunMeta } from "../../lib/run/run_log.ts";
import { FakeLlm, httpError, text, toolCall, writeThenExecute } from "../_fake_llm.ts";
import {
  assertDocker,
  CLI,
  docker,
  dockerTest,
  explain,
  profileContainers,
  spawnCli,
  tempDir,
} from "../_helpers.ts";

console.error("e2e: sandbox run tests starting");

const KEY_ENV = "SANDBOX_E2E_RUN_KEY";

// deno-lint-ignore no-explicit-any
type Wire = Record<string, any>;

/**
 * One stdout line, checked against the seeds' `AgenticMessage` field by field: every key present
 * (null when absent, never omitted), nothing else, each of the right type.
 */
function assertWireMessage(line: string, where: string): Wire {
  let message: Wire;
  try {
    message = JSON.parse(line);
  } catch (error) {
    assert.fail(`${where}: not JSON (${(error as Error).message}): ${line}`);
  }
  assert.ok(
    typeof message === "object" && message !== null && !Array.isArray(message),
    `${where}: not an object`,
  );
  assert.deepEqual(Object.keys(message).sort(), [...MESSAGE_KEYS].sort(), `${where}: keys`);
  assert.ok(
    (MESSAGE_TYPES as readonly string[]).includes(message.type),
    `${where}: type ${message.type}`,
  );
  for (
    const key of ["content", "tool_name", "tool_output", "tool_call_id", "session_id", "model"]
  ) {
    assert.ok(
      message[key] === null || typeof message[key] === "string",
      `${where}: ${key} is ${JSON.stringify(message[key])}`,
    );
  }
  const input = message.tool_input;
  assert.ok(
    input === null || (typeof input === "object" && !Array.isArray(input)),
    `${where}: tool_input`,
  );
  assert.equal(typeof message.is_error, "boolean", `${where}: is_error`);
  if (message.type !== "usage") {
    assert.equal(message.usage, null, `${where}: usage on a ${message.type} line`);
    return message;
  }
  const usage = message.usage;
  assert.ok(
    typeof usage === "object" && usage !== null && !Array.isArray(usage),
    `${where}: usage line without usage`,
  );
  assert.deepEqual(Object.keys(usage).sort(), [...USAGE_KEYS].sort(), `${where}: usage keys`);
  for (
    const key of [
      "input_tokens",
      "output_tokens",
      "cache_read_tokens",
      "cache_creation_tokens",
      "num_turns",
    ]
  ) {
    assert.ok(
      usage[key] === null || (Number.isInteger(usage[key]) && usage[key] >= 0),
      `${where}: usage.${key} = ${usage[key]}`,
    );
  }
  for (const key of ["cost_usd", "duration_ms"]) {
    assert.ok(
      usage[key] === null || (typeof usage[key] === "number" && usage[key] >= 0),
      `${where}: usage.${key} = ${usage[key]}`,
    );
  }
  assert.ok(usage.model === null || typeof usage.model === "string", `${where}: usage.model`);
  return message;
}

/** Every stdout line of a run, validated; stdout must be pure NDJSON. */
function parseNdjson(stdout: string, context: string): Wire[] {
  assert.ok(stdout.endsWith("\n"), `stdout does not end with a newline\n${context}`);
  const lines = stdout.slice(0, -1).split("\n");
  return lines.map((line, i) => assertWireMessage(line, `stdout line ${i + 1}\n${context}`));
}

/** The run id from stderr's first line, `sandbox: run <id> (...)`. */
function runIdFrom(stderr: string): string {
  const first = stderr.split("\n")[0];
  const match = first.match(/^sandbox: run (\S+) \(/);
  assert.ok(match, `stderr's first line names no run: ${first}`);
  return match[1];
}

/** The exact event types of the canonical write-then-execute run. */
const CANONICAL_TYPES = /^tool_call,tool_result,tool_call,tool_result,(thinking,)?result,usage$/;

/** A profile, its config, a prompt, an isolated state directory; removed on dispose. */
class RunTestFixture extends RunFixture {
  /** `llmUrl`: the fake's OpenAI-style base URL; `sandboxYaml`: extra YAML under the profile's `sandbox:`. */
  static create(prefix: string, llmUrl: string, sandboxYaml?: string): Promise<RunTestFixture> {
    return RunTestFixture.make({
      prefix,
      llmUrl,
      keyEnv: KEY_ENV,
      sandboxYaml,
      prompt: "Write the file, then run the command.\n",
    });
  }

  /** `sandbox run MODE --prompt-file P --profile X ARGS`. */
  run(mode: "agentic" | "generate", args: string[] = []): Promise<RunResult> {
    return this.cli([
      "run",
      mode,
      "--prompt-file",
      this.promptFile,
      "--profile",
      this.profile,
      "--format",
      "ndjson",
      ...args,
    ]);
  }

  /** The processes of `container`, one command line each (read as root). */
  async processes(container: string): Promise<string[]> {
    return (await docker("exec", "--user", "0", container, "ps", "-eo", "args")).split("\n").slice(
      1,
    );
  }

  /** The containers of this profile that are running now. */
  containers(): Promise<string[]> {
    return profileContainers(this.profile);
  }
}

/** Until `docker container inspect` of `name` fails: a run's container is removed moments after the run. */
async function assertGone(name: string, context: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if ((await run(["docker", "container", "inspect", name])).exitCode !== 0) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.fail(`the run's container ${name} is still there after the run\n${context}`);
}

/**
 * Nothing of the run is left: its container (`container`, with its worker, the agent's commands
 * and the prompt file) is gone, and no other container of the profile runs an agent worker or the
 * agent's command. A pooled container's worker waiting for the next run's job is no
 * leftover: it never met this run.
 */
async function assertNoLeftovers(
  fixture: RunTestFixture,
  container: string,
  context: string,
): Promise<void> {
  await assertGone(container, context);
  for (const other of await fixture.containers()) {
    const processes = await fixture.processes(other);
    assert.ok(processes.length > 0, "ps printed nothing: the check would prove nothing");
    const waiting = processes.filter((p) => /worker\.js serve --await-job/.test(p));
    const left = processes.filter((p) => /worker\.js|sleep 600/.test(p) && !waiting.includes(p));
    assert.deepEqual(left, [], `processes left in ${other}:\n${processes.join("\n")}\n${context}`);
  }
}

/**
 * The CLI started with `Deno.Command` directly, because the test must signal it by pid and
 * `ChildProcess` (lib/process.ts) does not expose one. stdout is read line by line; stderr is
 * collected as it arrives.
 */
class SignalableCli implements AsyncDisposable {
  readonly child: Deno.ChildProcess;
  readonly stdoutLines: string[] = [];
  stderr = "";
  readonly #lines: ReadableStreamDefaultReader<string>;
  readonly #stderrDone: Promise<void>;
  readonly #stderrWaiters: { test: RegExp; resolve: (line: string) => void }[] = [];

  constructor(args: string[], fixture: RunTestFixture) {
    this.child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--quiet", CLI, "--config", fixture.config, ...args],
      env: fixture.env,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#lines = readLines(this.child.stdout).getReader();
    const stderr = this.child.stderr;
    this.#stderrDone = (async () => {
      let partial = "";
      for await (const chunk of stderr.pipeThrough(new TextDecoderStream())) {
        this.stderr += chunk;
        partial += chunk;
        let newline: number;
        while ((newline = partial.indexOf("\n")) !== -1) {
          const line = partial.slice(0, newline);
          partial = partial.slice(newline + 1);
          for (const waiter of this.#stderrWaiters.filter((w) => w.test.test(line))) {
            this.#stderrWaiters.splice(this.#stderrWaiters.indexOf(waiter), 1);
            waiter.resolve(line);
          }
        }
      }
    })();
  }

  /** The next stdout line; fails with stderr if the CLI's stdout ends first. */
  async nextLine(): Promise<string> {
    const { done, value } = await this.#lines.read();
    if (done) {
      await this.#stderrDone;
      assert.fail(
        `the CLI ended its output early\n--- stdout\n${
          this.stdoutLines.join("\n")
        }\n--- stderr\n${this.stderr}`,
      );
    }
    this.stdoutLines.push(value);
    return value;
  }

  /** Read stdout lines until one satisfies `test`. */
  async lineWhere(test: (message: Wire) => boolean): Promise<Wire> {
    while (true) {
      const message = JSON.parse(await this.nextLine());
      if (test(message)) return message;
    }
  }

  /** The first stderr line from now on that matches `test`. */
  stderrLine(test: RegExp): Promise<string> {
    return new Promise((resolve) => this.#stderrWaiters.push({ test, resolve }));
  }

  /** The rest of stdout, then the exit code. */
  async finish(): Promise<number> {
    while (true) {
      const { done, value } = await this.#lines.read();
      if (done) break;
      this.stdoutLines.push(value);
    }
    this.#lines.releaseLock();
    await this.#stderrDone;
    return (await this.child.status).code;
  }

  explain(code?: number): string {
    return `exit ${code}\n--- stdout\n${this.stdoutLines.join("\n")}\n--- stderr\n${this.stderr}`;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      // Passed on to the run's supervisor (a SIGKILL would end only the CLI; the run goes on).
      this.child.kill("SIGTERM");
    } catch {
      // Already exited.
    }
    await this.finish().catch(() => {});
  }
}

Deno.test({
  name:
    "run agentic: the agent writes a file and runs a command inside the sandbox, and stdout is the run as NDJSON",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm(
      writeThenExecute("hello.txt", "hi\n", "cat hello.txt; id -un; hostname; pwd"),
    );
    await using fixture = await RunTestFixture.create("e2e-run", llm.baseUrl);
    const result = await fixture.run("agentic");
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const id = runIdFrom(result.stderr);
    const messages = parseNdjson(result.stdout, context);
    const types = messages.map((m) => m.type);

    await t.step("the events come in order, with exactly one result and usage last", () => {
      assert.match(types.join(","), CANONICAL_TYPES, context);
      assert.equal(types.filter((x) => x === "result").length, 1);
      assert.equal(types.at(-1), "usage");
      const result = messages.find((m) => m.type === "result")!;
      assert.equal(result.is_error, false);
      assert.equal(result.content, "Done: wrote the file and ran the command");
    });

    await t.step("the tool calls are the fake's, each answered by its result", () => {
      const calls = messages.filter((m) => m.type === "tool_call");
      assert.deepEqual(calls.map((c) => c.tool_name), ["write_file", "execute"]);
      assert.deepEqual(calls[0].tool_input, { file_path: "hello.txt", content: "hi\n" });
      assert.deepEqual(calls[1].tool_input, { command: "cat hello.txt; id -un; hostname; pwd" });
      const results = messages.filter((m) => m.type === "tool_result");
      assert.deepEqual(results.map((r) => r.tool_call_id), calls.map((c) => c.tool_call_id));
      assert.ok(calls.every((c) => typeof c.tool_call_id === "string" && c.tool_call_id));
    });

    const meta = await fixture.meta(id);
    const container = meta.extra?.container;

    await t.step(
      "the command ran inside the run's own sandbox, as its unprivileged user, where the file was written",
      () => {
        assert.ok(
          typeof container === "string" && container.startsWith(`sandbox-${fixture.profile}-`),
          JSON.stringify(meta),
        );
        assert.notEqual(container, fixture.container, "the run used the development sandbox");
        assert.equal(meta.extra?.workdir, `/workspace/runs/${id}`, JSON.stringify(meta));
        const output: string = messages.filter((m) => m.type === "tool_result")[1].tool_output;
        const lines = output.split("\n");
        assert.deepEqual(
          lines.slice(0, 4),
          ["hi", "sandbox", container, `/workspace/runs/${id}`],
          output,
        );
      },
    );

    await t.step("usage totals what the LLM reported", () => {
      const usage = messages.at(-1)!.usage;
      assert.equal(usage.input_tokens, llm.usage.promptTokens);
      assert.equal(usage.output_tokens, llm.usage.completionTokens);
      assert.equal(usage.num_turns, llm.completions);
      assert.equal(llm.completions, 3);
    });

    await t.step(
      "the run's sandbox is gone after it, with the file and the prompt file",
      async () => {
        await assertGone(container as string, context);
      },
    );

    await t.step(
      "the run is recorded: runs --json, meta.json and logs agree with stdout",
      async () => {
        const runs = await fixture.cli(["runs", "--json"]);
        assert.equal(runs.exitCode, 0, explain(runs));
        const listed: RunMeta[] = JSON.parse(runs.stdout);
        assert.deepEqual(listed.map((r) => [r.id, r.status, r.exitCode]), [[id, "succeeded", 0]]);
        assert.deepEqual(listed[0], await fixture.meta(id));
        const logs = await fixture.cli(["logs", id, "--format", "ndjson"]);
        assert.equal(logs.exitCode, 0, explain(logs));
        assert.equal(logs.stdout, result.stdout);
      },
    );
  },
});

Deno.test({
  name: "run agentic: every stdout line has exactly the AgenticMessage fields, absent ones as null",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: "echo one" }),
      {
        kind: "tool_calls",
        calls: [{ name: "ls", args: { path: "." } }],
        text: "Let me look around",
      },
      text("All done"),
    ]);
    await using fixture = await RunTestFixture.create("e2e-wire", llm.baseUrl);
    const result = await fixture.run("agentic");
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const messages = parseNdjson(result.stdout, context); // field by field
    assert.ok(messages.length >= 6, context);
    for (const message of messages) {
      // Raw text: null fields are serialised, not left out.
      const missing = MESSAGE_KEYS.filter((key) => !(key in message));
      assert.deepEqual(missing, [], context);
    }
    const usage = messages.at(-1)!;
    assert.equal(usage.type, "usage");
    assert.ok(
      typeof usage.usage.model === "string" && usage.usage.model.length > 0,
      "usage line names no model",
    );
    assert.equal(usage.usage.input_tokens, llm.usage.promptTokens);
    for (const message of messages.filter((m) => m.type === "tool_call")) {
      assert.equal(message.tool_output, null);
      assert.ok(message.tool_input !== null);
    }
    for (const message of messages.filter((m) => m.type === "tool_result")) {
      assert.equal(message.tool_input, null);
      assert.equal(typeof message.tool_output, "string");
    }
  },
});

const SCHEMA = {
  title: "Answer",
  type: "object",
  required: ["name", "count"],
  properties: { name: { type: "string" }, count: { type: "integer" } },
  additionalProperties: false,
};

Deno.test({
  name: "run generate --schema: a valid answer exits 0 with JSON that satisfies the schema",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([text(`{"name":"widget","count":3}`)]);
    await using fixture = await RunTestFixture.create("e2e-gen", llm.baseUrl);
    const schemaFile = `${fixture.dir.path}/answer.schema.json`;
    await Deno.writeTextFile(schemaFile, JSON.stringify(SCHEMA));
    const result = await fixture.run("generate", ["--schema", schemaFile]);
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const messages = parseNdjson(result.stdout, context);
    assert.deepEqual(messages.map((m) => m.type), ["result", "usage"], context);
    assert.equal(messages[0].is_error, false);
    const value = JSON.parse(messages[0].content);
    assert.deepEqual(value, { name: "widget", count: 3 });
    // The request asked for structured output with this schema.
    assert.deepEqual(llm.requests[0].body.response_format?.json_schema?.schema, SCHEMA);
    assert.equal(messages[1].usage.input_tokens, llm.usage.promptTokens);
    assert.equal((await fixture.meta(runIdFrom(result.stderr))).status, "succeeded");
  },
});

Deno.test({
  name:
    "run generate --schema: an answer violating the schema is an error result (exit 1) explained on stderr",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([text(`{"name":"widget"}`)]);
    await using fixture = await RunTestFixture.create("e2e-genbad", llm.baseUrl);
    const schemaFile = `${fixture.dir.path}/answer.schema.json`;
    await Deno.writeTextFile(schemaFile, JSON.stringify(SCHEMA));
    const result = await fixture.run("generate", ["--schema", schemaFile]);
    const context = explain(result);
    // The model's failure, not the sandbox's: an is_error result and exit 1, as for an agent.
    assert.equal(result.exitCode, 1, context);
    assert.match(result.stderr, /^sandbox: error: .*does not match the schema.*count/m, context);
    // The protocol holds: one result (an error one) naming the user's schema file, then usage last.
    const lines = result.stdout.trim().split("\n").map((line) => JSON.parse(line));
    assert.deepEqual(lines.map((m) => m.type), ["result", "usage"], context);
    assert.equal(lines[0].is_error, true);
    assert.ok(
      lines[0].content.includes(schemaFile),
      `the result does not name the user's schema file\n${context}`,
    );
    assert.ok(
      !lines[0].content.includes("sandbox-prompts"),
      `the result names the internal copy\n${context}`,
    );
    const meta = await fixture.meta(runIdFrom(result.stderr));
    assert.equal(meta.status, "failed");
    assert.equal(meta.exitCode, 1);
  },
});

/**
 * The closing record of a run that was cut short: stdout still ends with one `is_error` result
 * saying what happened, then the usage so far, as the protocol promises.
 */
function assertClosingRecord(lines: string[], says: RegExp, context: string): void {
  const messages = lines.map((line, i) =>
    assertWireMessage(line, `stdout line ${i + 1}\n${context}`)
  );
  assert.equal(
    messages.filter((m) => m.type === "result").length,
    1,
    `exactly one result\n${context}`,
  );
  const [result, usage] = messages.slice(-2);
  assert.equal(result.type, "result", context);
  assert.equal(result.is_error, true, context);
  assert.match(result.content, says, context);
  assert.doesNotMatch(result.content, /Command/, context);
  assert.equal(usage.type, "usage", context);
  assert.ok(
    usage.usage.duration_ms > 0,
    `usage.duration_ms ${usage.usage.duration_ms}\n${context}`,
  );
  // The one LLM call that asked for the command had completed: the usage so far counts it.
  assert.equal(usage.usage.num_turns, 1, context);
  assert.ok(typeof usage.usage.model === "string" && usage.usage.model, context);
}

Deno.test({
  name:
    "run agentic --timeout: a run past its deadline ends stdout with an is_error result and the usage so far, exits 124, is recorded as timed_out, and leaves nothing running",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: "sleep 600" }),
      text("never reached"),
    ]);
    await using fixture = await RunTestFixture.create("e2e-timeout", llm.baseUrl);
    const started = performance.now();
    // Long enough for the worker to start and ask for the command on a busy machine; the command
    // itself sleeps far longer.
    const result = await fixture.run("agentic", ["--timeout", "8s"]);
    const elapsed = performance.now() - started;
    const context = explain(result);
    assert.equal(result.exitCode, 124, context);
    assert.ok(elapsed < 60_000, `the timeout took ${Math.round(elapsed)} ms to act\n${context}`);
    const id = runIdFrom(result.stderr);
    assert.match(result.stdout, /"tool_name":"execute"/, `the command never started\n${context}`);
    assertClosingRecord(
      result.stdout.trimEnd().split("\n"),
      /^The run timed out after 8s$/,
      context,
    );
    assert.match(result.stderr, /^sandbox: error: The run timed out after 8s$/m, context);
    const meta = await fixture.meta(id);
    assert.equal(meta.status, "timed_out");
    assert.equal(meta.exitCode, 124);
    assert.equal(meta.usage?.num_turns, 1, context);
    await assertNoLeftovers(fixture, meta.extra?.container as string, context);
  },
});

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  Deno.test({
    name:
      `run agentic on ${signal}: the run stops, ends stdout with an is_error result and the usage so far, exits 130, is recorded as interrupted, and leaves nothing running`,
    ...dockerTest(),
    async fn() {
      assertDocker();
      await using llm = new FakeLlm([
        toolCall("execute", { command: "sleep 600" }),
        text("never reached"),
      ]);
      await using fixture = await RunTestFixture.create(`e2e-${signal.toLowerCase()}`, llm.baseUrl);
      await using cli = new SignalableCli(
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
        fixture,
      );
      await cli.lineWhere((m) => m.type === "tool_call" && m.tool_name === "execute");
      const id = runIdFrom(cli.stderr);
      const container = await fixture.liveContainer();
      // The command really is running in the run's sandbox before the signal.
      assert.ok(
        (await fixture.processes(container)).some((p) => p.includes("sleep 600")),
        "sleep 600 is not running",
      );
      Deno.kill(cli.child.pid, signal);
      const code = await cli.finish();
      assert.equal(code, 130, cli.explain(code));
      const meta = await fixture.meta(id);
      assert.equal(meta.status, "interrupted");
      assert.equal(meta.exitCode, 130);
      assertClosingRecord(cli.stdoutLines, /^The run was interrupted$/, cli.explain(code));
      assert.equal(meta.extra?.container, container, JSON.stringify(meta));
      await assertNoLeftovers(fixture, container, cli.explain(code));
    },
  });
}

Deno.test({
  name:
    "logs --follow in a second process prints a live run's events as they happen and exits when the run ends",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new HeldLlm(writeThenExecute("held.txt", "held\n", "cat held.txt"));
    // The agent's second LLM call (after the file is written) waits until the test releases it.
    const held = llm.hold(2);
    await using fixture = await RunTestFixture.create("e2e-follow", llm.baseUrl);
    await using runner = new SignalableCli(
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
      fixture,
    );
    await runner.lineWhere((m) => m.type === "tool_result" && m.tool_name === "write_file");
    await held;
    const id = runIdFrom(runner.stderr);

    // The run is live and blocked: a second process follows its log.
    const follower = spawnCli(["logs", id, "--follow", "--format", "ndjson"], {
      config: fixture.config,
      env: fixture.env,
      timeoutMs: CLI_TIMEOUT_MS,
    });
    try {
      const followed = follower.lines();
      const first = await followed.next();
      // (Not in an assert message: a template literal there would await the follower's end at once.)
      if (first.done) {
        assert.fail(`logs --follow printed nothing: ${(await follower.finished).stderrTail}`);
      }
      assert.equal(JSON.parse(first.value).type, "tool_call");
      assert.equal(JSON.parse(first.value).tool_name, "write_file");
      const second = await followed.next();
      assert.equal(JSON.parse(second.value as string).type, "tool_result");
      assert.equal(
        (await fixture.meta(id)).status,
        "running",
        "the run ended before the follower saw it live",
      );

      // Let the run finish; the follower must end by itself with every event.
      llm.release();
      const code = await runner.finish();
      assert.equal(code, 0, runner.explain(code));
      const rest: string[] = [];
      for await (const line of { [Symbol.asyncIterator]: () => followed }) rest.push(line);
      const outcome = await follower.finished;
      assert.equal(outcome.exitCode, 0, outcome.stderrTail);
      assert.ok(!outcome.timedOut, "logs --follow did not exit by itself");
      assert.deepEqual([first.value, second.value, ...rest], runner.stdoutLines);
      assert.match(runner.stdoutLines.map((l) => JSON.parse(l).type).join(","), CANONICAL_TYPES);
    } finally {
      follower.kill();
      await follower.finished;
    }
  },
});

Deno.test({
  name: "runs --json lists every run, newest first, with its status and exit code",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      text("first answer"),
      httpError(400, "the fake refuses this request"),
    ]);
    await using fixture = await RunTestFixture.create("e2e-runs", llm.baseUrl);
    const empty = await fixture.cli(["runs", "--json"]);
    assert.equal(empty.exitCode, 0, explain(empty));
    assert.deepEqual(JSON.parse(empty.stdout), []);

    const ok = await fixture.run("agentic");
    assert.equal(ok.exitCode, 0, explain(ok));
    const failed = await fixture.run("agentic");
    assert.equal(failed.exitCode, 1, explain(failed));
    const failedResult = parseNdjson(failed.stdout, explain(failed)).find((m) =>
      m.type === "result"
    );
    assert.equal(failedResult?.is_error, true, explain(failed));

    const runs = await fixture.cli(["runs", "--json"]);
    assert.equal(runs.exitCode, 0, explain(runs));
    const listed: RunMeta[] = JSON.parse(runs.stdout);
    assert.deepEqual(
      listed.map((r) => [r.id, r.status, r.exitCode, r.profile, r.mode]),
      [
        [runIdFrom(failed.stderr), "failed", 1, fixture.profile, "agentic"],
        [runIdFrom(ok.stderr), "succeeded", 0, fixture.profile, "agentic"],
      ],
    );
    for (const meta of listed) {
      assert.ok(meta.endedAt !== null && meta.durationMs !== null, `run ${meta.id} has no end`);
      assert.equal(meta.sandbox, "container");
    }
    assert.equal(listed[1].usage?.input_tokens, 101);
  },
});

Deno.test({
  name:
    "mode none: the same NDJSON, the file lands in the host directory given by --cwd, and stderr says UNSAFE",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm(writeThenExecute("hello.txt", "hi\n", "cat hello.txt; pwd"));
    await using fixture = await RunTestFixture.create("e2e-none", llm.baseUrl, "{mode: none}");
    await using work = await tempDir("sandbox-e2e-none-cwd-");
    const result = await fixture.run("agentic", ["--cwd", work.path]);
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const id = runIdFrom(result.stderr);
    assert.match(result.stderr, /UNSAFE/, context);
    const messages = parseNdjson(result.stdout, context);
    assert.match(messages.map((m) => m.type).join(","), CANONICAL_TYPES, context);
    assert.equal(await Deno.readTextFile(`${work.path}/hello.txt`), "hi\n");
    const output: string = messages.filter((m) => m.type === "tool_result")[1].tool_output;
    assert.deepEqual(
      output.split("\n").slice(0, 2),
      ["hi", await Deno.realPath(work.path)],
      output,
    );
    assert.equal(messages.at(-1)!.usage.input_tokens, llm.usage.promptTokens);
    const meta = await fixture.meta(id);
    assert.equal(meta.sandbox, "none");
    assert.equal(meta.status, "succeeded");
    // Nothing was started in Docker for this profile.
    assert.equal(
      await docker("ps", "-aq", "--filter", `label=dev.sandbox.profile=${fixture.profile}`),
      "",
    );
  },
});
