/**
 * The worker as a real subprocess (from source, and as the one-file bundle run from an empty
 * directory) against the scripted fake LLM on loopback, in a temporary working directory.
 */
import { MESSAGE_KEYS, USAGE_KEYS } from "../_seed_schema.ts";
import assert from "node:assert/strict";
import { ChatOpenAI } from "@langchain/openai";
import type { AIMessageChunk } from "@langchain/core/messages";
import { type AgenticMessage, decodeMessage } from "../../lib/run/protocol.ts";
import { run, type RunResult, spawn } from "../../lib/process.ts";
import { explain, ROOT, tempDir } from "../_helpers.ts";
import { workerBundlePath } from "../../lib/sandbox/worker_bundle.ts";
import {
  FAKE_LLM_KEY,
  FakeLlm,
  type FakeStep,
  httpError,
  text,
  toolCall,
  writeThenExecute,
} from "../_fake_llm.ts";

const WORKER = `${ROOT}/worker/main.ts`;
/** The fake LLM stands in for the credential proxy: the token the worker sends is what it accepts. */
const TOKEN = FAKE_LLM_KEY;

/** How to start the worker: argv before the mode, and extra environment. */
interface WorkerEntry {
  argv: string[];
  cwd?: string;
  env?: Record<string, string>;
}

interface WorkerRun {
  result: RunResult;
  messages: AgenticMessage[];
}

/** From source, with only the permissions it needs: no network but the LLM's port. */
function sourceEntry(llmPort: number): WorkerEntry {
  return {
    argv: [
      Deno.execPath(),
      "run",
      "--quiet",
      `--config=${ROOT}/deno.json`,
      "--allow-read",
      "--allow-write",
      "--allow-env",
      "--allow-run",
      "--allow-sys",
      `--allow-net=127.0.0.1:${llmPort}`,
      WORKER,
    ],
  };
}

function llmEnv(baseUrl: string, api: "openai" | "anthropic" = "openai"): Record<string, string> {
  return {
    SANDBOX_LLM_API: api,
    SANDBOX_LLM_BASE_URL: baseUrl,
    SANDBOX_LLM_TOKEN: TOKEN,
    SANDBOX_LLM_MODEL: "fake-model",
    SANDBOX_LLM_MAX_RETRIES: "0",
  };
}

/**
 * Run the worker to completion and parse stdout strictly: every line must decode and carry every
 * field (absent ones as null).
 */
async function runWorker(
  entry: WorkerEntry,
  args: string[],
  env: Record<string, string>,
): Promise<WorkerRun> {
  const result = await run([...entry.argv, ...args], {
    cwd: entry.cwd,
    clearEnv: true,
    env: { HOME: Deno.env.get("HOME") ?? "/tmp", ...entry.env, ...env },
    timeoutMs: 120_000,
  });
  const lines = result.stdout.split("\n");
  assert.equal(lines.pop(), "", `stdout ends with a newline\n${explain(result)}`);
  const messages = lines.map((line, i) => {
    const raw = JSON.parse(line);
    assert.deepEqual(Object.keys(raw), MESSAGE_KEYS, `line ${i + 1} has every field\n${line}`);
    if (raw.usage !== null) assert.deepEqual(Object.keys(raw.usage), USAGE_KEYS);
    return decodeMessage(line, i + 1);
  });
  return { result, messages };
}

/** Exactly one result, followed by the usage line, last; tool results answer earlier calls. */
function assertRunShape(run: WorkerRun): { result: AgenticMessage; usage: AgenticMessage } {
  const { messages } = run;
  const context = explain(run.result);
  assert.equal(run.result.exitCode, 0, context);
  assert.equal(messages.filter((m) => m.type === "result").length, 1, context);
  assert.equal(messages.filter((m) => m.type === "usage").length, 1, context);
  assert.equal(messages.at(-1)?.type, "usage", context);
  assert.equal(messages.at(-2)?.type, "result", context);
  const called = new Set<string>();
  for (const message of messages) {
    if (message.type === "tool_call") called.add(message.tool_call_id ?? "");
    if (message.type === "tool_result") {
      assert.ok(
        called.has(message.tool_call_id ?? ""),
        `tool_result answers an earlier call\n${context}`,
      );
    }
  }
  assert.ok(!/^\s+at /m.test(run.result.stdout), `no stack trace on stdout\n${context}`);
  return { result: messages.at(-2)!, usage: messages.at(-1)! };
}

/** A working directory and a prompt file for one run. */
async function workspace(prompt: string) {
  const dir = await tempDir("sandbox-worker-");
  const work = `${dir.path}/work`;
  await Deno.mkdir(work);
  const promptFile = `${dir.path}/prompt.txt`;
  await Deno.writeTextFile(promptFile, prompt);
  return { dir, work, promptFile };
}

/** The canonical agent run and everything it must prove, for a given way of starting the worker. */
async function checkAgenticRun(
  entryFor: (fake: FakeLlm) => WorkerEntry | Promise<WorkerEntry>,
  api: "openai" | "anthropic" = "openai",
) {
  const marker = `PROMPT-MARKER-${crypto.randomUUID()}`;
  const { dir, work, promptFile } = await workspace(`Create hello.txt. ${marker}`);
  await using _dir = dir;
  await using fake = new FakeLlm(
    writeThenExecute(
      "hello.txt",
      "hi from the agent\n",
      'cat hello.txt; echo "ran:$((6*7))"; echo "env=[$PROJECT_VAR/$OPENAI_API_KEY]"',
    ),
  );
  const entry = await entryFor(fake);
  const outcome = await runWorker(
    entry,
    ["agentic", "--prompt-file", promptFile, "--cwd", work],
    // The worker scrubs OPENAI_* from its own environment, not from its commands'.
    { ...llmEnv(fake.proxyBaseUrl, api), PROJECT_VAR: "42", OPENAI_API_KEY: TOKEN },
  );
  const { result, usage } = assertRunShape(outcome);
  const context = explain(outcome.result);

  assert.equal(await Deno.readTextFile(`${work}/hello.txt`), "hi from the agent\n", context);
  assert.deepEqual(
    outcome.messages.map((m) => m.type),
    ["tool_call", "tool_result", "tool_call", "tool_result", "thinking", "result", "usage"],
    context,
  );
  const [write, written, execute, executed] = outcome.messages;
  assert.equal(write.tool_name, "write_file");
  assert.deepEqual(write.tool_input, { file_path: "hello.txt", content: "hi from the agent\n" });
  assert.equal(written.tool_call_id, write.tool_call_id);
  assert.equal(execute.tool_name, "execute");
  assert.equal(executed.tool_name, "execute");
  assert.equal(executed.is_error, false);
  assert.match(executed.tool_output ?? "", /hi from the agent\nran:42\n/, "the command really ran");
  assert.ok(
    executed.tool_output?.includes(`env=[42/${TOKEN}]`),
    "commands get the environment the host gave the worker",
  );

  assert.equal(result.is_error, false);
  assert.equal(result.content, "Done: wrote the file and ran the command");
  assert.equal(usage.usage?.input_tokens, fake.usage.promptTokens, context);
  assert.equal(usage.usage?.output_tokens, fake.usage.completionTokens, context);
  assert.equal(usage.usage?.num_turns, 3);
  assert.equal(usage.usage?.model, "fake-model");
  assert.ok((usage.usage?.duration_ms ?? -1) >= 0);

  assert.equal(fake.requests.length, 3);
  for (const request of fake.requests) {
    if (api === "openai") {
      assert.equal(request.path, "/proxy/v1/chat/completions");
      assert.equal(request.headers.get("authorization"), `Bearer ${TOKEN}`);
    } else {
      assert.equal(request.path, "/proxy/v1/messages");
      assert.equal(request.headers.get("x-api-key"), TOKEN);
    }
  }
  assert.ok(
    JSON.stringify(fake.requests[0].body.messages).includes(marker),
    "the prompt reached the LLM",
  );
  assert.ok(!outcome.result.stdout.includes(marker), "the prompt is not echoed on stdout");
  assert.ok(!outcome.result.stderr.includes(marker), "the prompt is not echoed on stderr");
  assert.ok(await Deno.stat(promptFile), "the worker leaves the prompt file to its owner");
  assert.ok(
    !/tiktoken|Failed to calculate/i.test(outcome.result.stderr),
    `no tokenizer download\n${context}`,
  );
}

Deno.test("worker agentic (source) really writes the file and runs the command, streaming valid NDJSON", async () => {
  await checkAgenticRun((fake) => sourceEntry(fake.port));
});

Deno.test("worker agentic (source) speaks the Anthropic Messages API when SANDBOX_LLM_API=anthropic", async () => {
  await checkAgenticRun((fake) => sourceEntry(fake.port), "anthropic");
});

Deno.test("worker agentic (bundle) runs from an empty directory with no npm cache and no config", async () => {
  // The bundle as the image gets it: minified, its require made lazy (lib/sandbox/bundle_text.ts).
  const bundled = await workerBundlePath();
  assert.ok(
    !(await Deno.readTextFile(bundled)).includes("Dynamic require of"),
    "the minified require shim was left in",
  );
  await using empty = await tempDir("sandbox-worker-empty-");
  await Deno.copyFile(bundled, `${empty.path}/worker.js`);
  await checkAgenticRun(() => ({
    argv: [Deno.execPath(), "run", "--allow-all", "--no-config", "--quiet", "worker.js"],
    cwd: empty.path,
    env: { DENO_DIR: `${empty.path}/.deno` },
  }));
});

Deno.test("worker agentic marks a failed command's tool_result as an error, not the run", async () => {
  const { dir, work, promptFile } = await workspace("Run it");
  await using _dir = dir;
  await using fake = new FakeLlm([
    toolCall("execute", { command: "echo oops >&2; exit 3" }),
    text("It failed"),
  ]);
  const outcome = await runWorker(sourceEntry(fake.port), [
    "agentic",
    "--prompt-file",
    promptFile,
    "--cwd",
    work,
  ], llmEnv(fake.proxyBaseUrl));
  const { result } = assertRunShape(outcome);
  const executed = outcome.messages.find((m) => m.type === "tool_result");
  assert.equal(executed?.is_error, true, explain(outcome.result));
  assert.match(executed?.tool_output ?? "", /\[stderr\] oops/);
  assert.equal(result.is_error, false);
  assert.equal(result.content, "It failed");
});

Deno.test("worker agentic passes --instructions-file into the system prompt and --model to the LLM", async () => {
  const { dir, work, promptFile } = await workspace("Hi");
  await using _dir = dir;
  const instructions = `${dir.path}/instructions.md`;
  await Deno.writeTextFile(instructions, "Always answer in French.");
  await using fake = new FakeLlm([text("Bonjour")]);
  const outcome = await runWorker(
    sourceEntry(fake.port),
    [
      "agentic",
      "--prompt-file",
      promptFile,
      "--instructions-file",
      instructions,
      "--model",
      "other-model",
      "--cwd",
      work,
    ],
    llmEnv(fake.proxyBaseUrl),
  );
  const { result, usage } = assertRunShape(outcome);
  assert.equal(result.content, "Bonjour");
  assert.equal(usage.usage?.model, "other-model");
  const body = fake.requests[0].body;
  assert.equal(body.model, "other-model");
  const system = JSON.stringify(body.messages[0]);
  assert.ok(system.includes("Always answer in French."), system);
  assert.ok(system.includes(work), "the system prompt names the working directory");
});

Deno.test("worker agentic stops at --max-turns with an is_error result", async () => {
  const { dir, work, promptFile } = await workspace("Loop");
  await using _dir = dir;
  await using fake = new FakeLlm([
    toolCall("execute", { command: "echo 1" }),
    toolCall("execute", { command: "echo 2" }),
    toolCall("execute", { command: "echo 3" }),
    text("never reached"),
  ]);
  const outcome = await runWorker(
    sourceEntry(fake.port),
    ["agentic", "--prompt-file", promptFile, "--cwd", work, "--max-turns", "2"],
    llmEnv(fake.proxyBaseUrl),
  );
  const { result, usage } = assertRunShape(outcome);
  assert.equal(result.is_error, true, explain(outcome.result));
  assert.match(result.content ?? "", /limit of 2 turns/);
  assert.equal(fake.completions, 2);
  assert.equal(usage.usage?.num_turns, 2);
});

Deno.test("worker agentic stops working when its stdout is closed", async () => {
  const { dir, work, promptFile } = await workspace("Count");
  await using _dir = dir;
  await using fake = new FakeLlm([
    toolCall("execute", { command: "echo one >> log.txt" }),
    toolCall("execute", { command: "echo two >> log.txt" }),
    toolCall("execute", { command: "echo three >> log.txt" }),
    text("done"),
  ]);
  const child = spawn([...sourceEntry(fake.port).argv, "agentic", "--prompt-file", promptFile], {
    cwd: work,
    clearEnv: true,
    env: { HOME: Deno.env.get("HOME") ?? "/tmp", ...llmEnv(fake.proxyBaseUrl) },
    timeoutMs: 60_000,
  });
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const first = await reader.read();
  assert.match(first.value ?? "", /"type":"tool_call"/);
  await reader.cancel();
  const outcome = await child.finished;
  assert.equal(outcome.timedOut, false);
  const log = await Deno.readTextFile(`${work}/log.txt`).catch(() => "");
  assert.ok(
    !log.includes("three"),
    `the agent went on after stdout closed: ${JSON.stringify(log)}`,
  );
  assert.ok(fake.completions < 4);
});

Deno.test("worker agentic turns an LLM error into an is_error result", async () => {
  const { dir, work, promptFile } = await workspace("Hi");
  await using _dir = dir;
  await using fake = new FakeLlm([httpError(400, "model not allowed here")]);
  const outcome = await runWorker(sourceEntry(fake.port), [
    "agentic",
    "--prompt-file",
    promptFile,
    "--cwd",
    work,
  ], llmEnv(fake.proxyBaseUrl));
  const { result, usage } = assertRunShape(outcome);
  assert.equal(result.is_error, true);
  assert.match(result.content ?? "", /^Agent failed: .*model not allowed here/);
  assert.equal(usage.usage?.input_tokens, null, "no response reported usage");
});

Deno.test("worker turns an unreachable LLM into an is_error result, not a crash", async (t) => {
  // A port that was just free: nothing listens there.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const { dir, work, promptFile } = await workspace("Hi");
  await using _dir = dir;
  const env = llmEnv(`http://127.0.0.1:${port}/proxy/v1`);
  const argsFor = {
    agentic: ["agentic", "--prompt-file", promptFile, "--cwd", work],
    generate: ["generate", "--prompt-file", promptFile],
  };
  for (const [mode, args] of Object.entries(argsFor)) {
    await t.step(mode, async () => {
      const outcome = await runWorker(sourceEntry(port), args, env);
      const { result } = assertRunShape(outcome);
      assert.equal(result.is_error, true);
      assert.match(result.content ?? "", /Connection error/i, explain(outcome.result));
    });
  }
});

Deno.test("worker generate without a schema returns the model's text", async () => {
  const { dir, promptFile } = await workspace("Say hi");
  await using _dir = dir;
  await using fake = new FakeLlm([text("hi there", { promptTokens: 12, completionTokens: 3 })]);
  const outcome = await runWorker(
    sourceEntry(fake.port),
    ["generate", "--prompt-file", promptFile],
    llmEnv(fake.proxyBaseUrl),
  );
  const { result, usage } = assertRunShape(outcome);
  assert.deepEqual(outcome.messages.map((m) => m.type), ["result", "usage"]);
  assert.equal(result.content, "hi there");
  assert.equal(result.is_error, false);
  assert.equal(usage.usage?.input_tokens, 12);
  assert.equal(usage.usage?.output_tokens, 3);
  assert.equal(usage.usage?.num_turns, 1);
  assert.equal(fake.requests[0].body.tools, undefined, "generate offers no tools");
});

const VERDICT_SCHEMA = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  title: "Verdict",
  type: "object",
  properties: {
    approved: { type: "boolean" },
    score: { type: "integer", minimum: 0, maximum: 10 },
    notes: { type: "array", items: { type: "string" } },
  },
  required: ["approved", "score"],
  additionalProperties: false,
};

async function generateWithSchema(answer: FakeStep) {
  const { dir, promptFile } = await workspace("Review this");
  const schemaFile = `${dir.path}/verdict.json`;
  await Deno.writeTextFile(schemaFile, JSON.stringify(VERDICT_SCHEMA));
  const fake = new FakeLlm([answer]);
  const outcome = await runWorker(
    sourceEntry(fake.port),
    ["generate", "--prompt-file", promptFile, "--schema", schemaFile],
    llmEnv(fake.proxyBaseUrl),
  );
  await fake[Symbol.asyncDispose]();
  await dir[Symbol.asyncDispose]();
  return { outcome, fake, ...assertRunShape(outcome) };
}

Deno.test("worker generate with a schema returns JSON valid against it, asking for structured output", async () => {
  const { result, fake } = await generateWithSchema(
    text('```json\n{"approved": true, "score": 8, "notes": ["ok"]}\n```'),
  );
  assert.equal(result.is_error, false, result.content ?? "");
  assert.deepEqual(JSON.parse(result.content ?? ""), { approved: true, score: 8, notes: ["ok"] });
  const format = fake.requests[0].body.response_format;
  assert.equal(format?.type, "json_schema");
  assert.equal(format?.json_schema?.name, "Verdict");
  assert.deepEqual(format?.json_schema?.schema, VERDICT_SCHEMA);
});

Deno.test("worker generate with the Anthropic API forces a tool call whose input is the answer", async () => {
  const { dir, promptFile } = await workspace("Review this");
  await using _dir = dir;
  const schemaFile = `${dir.path}/verdict.json`;
  await Deno.writeTextFile(schemaFile, JSON.stringify(VERDICT_SCHEMA));
  await using fake = new FakeLlm([toolCall("Verdict", { approved: false, score: 3 })]);
  const outcome = await runWorker(
    sourceEntry(fake.port),
    ["generate", "--prompt-file", promptFile, "--schema", schemaFile],
    llmEnv(fake.proxyBaseUrl, "anthropic"),
  );
  const { result, usage } = assertRunShape(outcome);
  assert.equal(result.is_error, false, result.content ?? "");
  assert.deepEqual(JSON.parse(result.content ?? ""), { approved: false, score: 3 });
  assert.equal(usage.usage?.input_tokens, fake.usage.promptTokens);
  const body = fake.requests[0].body;
  assert.equal(fake.requests[0].path, "/proxy/v1/messages");
  assert.equal(body.tools?.[0]?.name, "Verdict");
  assert.deepEqual(body.tools?.[0]?.input_schema, VERDICT_SCHEMA);
  assert.deepEqual(body.tool_choice, { type: "tool", name: "Verdict" });
});

Deno.test("worker generate reports output that violates the schema as an is_error result", async (t) => {
  await t.step("wrong types and a missing property", async () => {
    const { result } = await generateWithSchema(text('{"approved": "yes", "notes": [1]}'));
    assert.equal(result.is_error, true);
    assert.match(
      result.content ?? "",
      /^Model output does not match the schema ".*verdict\.json": /,
    );
    assert.match(result.content ?? "", /required property "score"/);
    assert.match(result.content ?? "", /#\/approved: Instance type "string" is invalid/);
    assert.match(result.content ?? "", /#\/notes\/0: /);
  });
  await t.step("not JSON at all", async () => {
    const { result } = await generateWithSchema(text("Sure! The verdict is: approved."));
    assert.equal(result.is_error, true);
    assert.match(result.content ?? "", /^Model output is not valid JSON: /);
  });
});

Deno.test("worker reports unusable inputs as an is_error result, and bad usage with exit code 2", async (t) => {
  await using fake = new FakeLlm();
  const { dir, promptFile } = await workspace("x");
  await using _dir = dir;
  await t.step("a missing prompt file", async () => {
    const outcome = await runWorker(sourceEntry(fake.port), [
      "generate",
      "--prompt-file",
      `${dir.path}/nope.txt`,
    ], llmEnv(fake.proxyBaseUrl));
    const { result } = assertRunShape(outcome);
    assert.equal(result.is_error, true);
    assert.match(result.content ?? "", /Cannot read prompt file ".*nope\.txt"/);
  });
  await t.step("an empty prompt file or a working directory that cannot be made", async () => {
    const empty = `${dir.path}/empty.txt`;
    await Deno.writeTextFile(empty, " \n");
    const first = await runWorker(sourceEntry(fake.port), [
      "agentic",
      "--prompt-file",
      empty,
    ], llmEnv(fake.proxyBaseUrl));
    assert.match(assertRunShape(first).result.content ?? "", /prompt file ".*empty\.txt" is empty/);
    const second = await runWorker(sourceEntry(fake.port), [
      "agentic",
      "--prompt-file",
      promptFile,
      "--cwd",
      // A missing directory is created; one under a regular file cannot be.
      `${empty}/missing`,
    ], llmEnv(fake.proxyBaseUrl));
    const { result } = assertRunShape(second);
    assert.equal(result.is_error, true);
    assert.match(result.content ?? "", /Cannot use working directory ".*missing"/);
  });
  await t.step("a schema file that is not JSON", async () => {
    const schema = `${dir.path}/bad.json`;
    await Deno.writeTextFile(schema, "{nope");
    const outcome = await runWorker(sourceEntry(fake.port), [
      "generate",
      "--prompt-file",
      promptFile,
      "--schema",
      schema,
    ], llmEnv(fake.proxyBaseUrl));
    const { result } = assertRunShape(outcome);
    assert.match(result.content ?? "", /Schema ".*bad\.json" is not valid JSON/);
  });
  await t.step("no LLM endpoint configured", async () => {
    const outcome = await runWorker(
      sourceEntry(fake.port),
      ["generate", "--prompt-file", promptFile],
      {},
    );
    const { result } = assertRunShape(outcome);
    assert.match(result.content ?? "", /SANDBOX_LLM_BASE_URL is not set/);
  });
  await t.step("an unknown mode or flag", async () => {
    for (
      const args of [["bogus"], ["agentic", "--prompt-file", promptFile, "--nope"], ["agentic"]]
    ) {
      const result = await run([...sourceEntry(fake.port).argv, ...args], { timeoutMs: 60_000 });
      assert.equal(result.exitCode, 2, explain(result));
      assert.equal(result.stdout, "");
      assert.match(result.stderr, /Usage:/);
    }
  });
  assert.equal(fake.requests.length, 0);
});

Deno.test("the fake LLM streams tool calls, text and usage over SSE that a real client parses", async () => {
  await using fake = new FakeLlm([
    toolCall("write_file", { file_path: "a.txt", content: "x" }),
    text("all done", { promptTokens: 5, completionTokens: 2 }),
  ]);
  const model = new ChatOpenAI({
    model: "fake-model",
    apiKey: fake.key,
    configuration: { baseURL: fake.baseUrl },
    streaming: true,
    streamUsage: true,
    maxRetries: 0,
  });
  const collect = async () => {
    let whole: AIMessageChunk | undefined;
    for await (const chunk of await model.stream("hi")) whole = whole ? whole.concat(chunk) : chunk;
    return whole!;
  };
  const first = await collect();
  assert.equal(first.tool_calls?.[0]?.name, "write_file");
  assert.deepEqual(first.tool_calls?.[0]?.args, { file_path: "a.txt", content: "x" });
  const second = await collect();
  assert.equal(second.content, "all done");
  assert.equal(second.usage_metadata?.input_tokens, 5);
  assert.equal(second.usage_metadata?.output_tokens, 2);
  assert.equal(fake.requests.length, 2);
  assert.equal(fake.requests[0].path, "/v1/chat/completions");
  assert.equal(fake.requests[0].body.stream, true);
});

Deno.test("worker usage prices the calls of a known model, for OpenAI and Anthropic alike, and leaves an unknown model's cost null", async (t) => {
  const cases: {
    api: "openai" | "anthropic";
    model: string;
    price: { input: number; output: number } | null;
  }[] = [
    { api: "openai", model: "gpt-4.1-mini", price: { input: 0.4, output: 1.6 } },
    { api: "anthropic", model: "claude-haiku-4-5", price: { input: 1, output: 5 } },
    { api: "openai", model: "fake-model", price: null },
  ];
  for (const { api, model, price } of cases) {
    await t.step(`${api} ${model}`, async () => {
      const { dir, work, promptFile } = await workspace("Write it");
      await using _dir = dir;
      await using fake = new FakeLlm([
        toolCall("write_file", { file_path: "a.txt", content: "a\n" }, undefined),
        text("Done", { promptTokens: 2000, completionTokens: 300 }),
      ]);
      const outcome = await runWorker(sourceEntry(fake.port), [
        "agentic",
        "--prompt-file",
        promptFile,
        "--cwd",
        work,
      ], {
        ...llmEnv(fake.proxyBaseUrl, api),
        SANDBOX_LLM_MODEL: model,
      });
      const { usage } = assertRunShape(outcome);
      const context = explain(outcome.result);
      assert.equal(usage.usage?.input_tokens, fake.usage.promptTokens, context);
      if (price === null) {
        assert.equal(usage.usage?.cost_usd, null, context);
        return;
      }
      // The fake reports no cached tokens: every input token at the input price.
      const expected =
        (fake.usage.promptTokens * price.input + fake.usage.completionTokens * price.output) / 1e6;
      assert.ok(
        Math.abs((usage.usage?.cost_usd ?? -1) - expected) < 1e-9,
        `cost ${usage.usage?.cost_usd}, expected ${expected}\n${context}`,
      );
    });
  }
});

Deno.test("worker names a Claude Code style tool by its standard name, as the seeds' worker does", async () => {
  const { dir, work, promptFile } = await workspace("Run it");
  await using _dir = dir;
  // deepagents has no "Bash" tool: the call is still reported, under the standard name, and so
  // is deepagents' answer that the tool does not exist.
  await using fake = new FakeLlm([toolCall("Bash", { command: "true" }), text("Gave up")]);
  const outcome = await runWorker(sourceEntry(fake.port), [
    "agentic",
    "--prompt-file",
    promptFile,
    "--cwd",
    work,
  ], llmEnv(fake.proxyBaseUrl));
  assertRunShape(outcome);
  const call = outcome.messages.find((m) => m.type === "tool_call");
  assert.equal(call?.tool_name, "run_shell_command", explain(outcome.result));
  const answer = outcome.messages.find((m) => m.type === "tool_result");
  assert.equal(answer?.tool_name, "run_shell_command", explain(outcome.result));
});
