/**
 * `ContainerDriver` against an in-memory `SandboxProvider`: one test per row of the seeds' error
 * contract, plus the job-delivery rules (the prompt on the worker's input, never argv, env or a
 * file). No Docker, no subprocess: the fake's `execStream` yields scripted lines (counting how many
 * were read) and records what its input received; its `exec`/`writeFile` record every call.
 */
import assert from "node:assert/strict";
import { ContainerDriver, WORKER_COMMAND } from "../../lib/run/container_driver.ts";
import { parseJob, type WorkerJob } from "../../worker/job.ts";
import { registerSecret } from "../../lib/secret_guard.ts";
import { startWorker } from "../../lib/run/worker_process.ts";
import { SandboxError } from "../../lib/errors.ts";
import { type AgenticMessage, encodeMessage } from "../../lib/run/protocol.ts";
import type {
  ExecBytes,
  ExecOptions,
  ExecResult,
  ExecStream,
  ExecStreamOutcome,
  SandboxProvider,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
} from "../../lib/sandbox/provider.ts";
import type { JsonSchema } from "../../worker/json_schema.ts";

/** What one `execStream` call will do. */
interface StreamScript {
  lines: string[];
  /** How the command ended; a rejection stands for a failed `docker exec`. */
  outcome?: Partial<ExecStreamOutcome> | { reject: Error };
  /** Thrown by the iterator after the lines (the exec broke mid-stream). */
  throwAfterLines?: Error;
}

interface ExecCall {
  argv: readonly string[];
  env?: Record<string, string>;
  cwd?: string;
}

interface StreamCall extends ExecCall {
  /** What the command's input received, so far. */
  input: string;
  /** Its input was ended. */
  inputClosed: boolean;
  /** Lines the consumer has pulled from the stream. */
  consumed: number;
  /** The consumer stopped the stream (`return()` reached the producer). */
  stoppedEarly: boolean;
  /** The iterator ran to its end or was stopped. */
  closed: boolean;
}

/** An in-memory `SandboxProvider`: scripted streams, recorded calls. */
class FakeProvider implements SandboxProvider {
  readonly writes: { path: string; data: string; mode?: number }[] = [];
  readonly execs: ExecCall[] = [];
  readonly streams: StreamCall[] = [];
  readonly #scripts: StreamScript[];
  /** Make `writeFile` fail for paths matching this. */
  failWritesTo?: RegExp;
  /** Make `exec` of `rm` fail (cleanup failures must not surface). */
  failRm = false;

  constructor(...scripts: StreamScript[]) {
    this.#scripts = scripts;
  }

  /** Every argv and env value and every file this provider was handed, for leak checks. */
  get everything(): string[] {
    const calls: ExecCall[] = [...this.execs, ...this.streams];
    return [
      ...calls.flatMap((c) => [...c.argv, ...Object.values(c.env ?? {}), c.cwd ?? ""]),
      ...this.writes.flatMap((w) => [w.path, w.data]),
    ];
  }

  ensureRunning(): Promise<SandboxStatus> {
    return this.status();
  }

  execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
    const script = this.#scripts.shift();
    if (!script) throw new Error(`FakeProvider: no scripted stream for ${argv.join(" ")}`);
    const call: StreamCall = {
      argv,
      env: options.env,
      cwd: options.cwd,
      input: "",
      inputClosed: false,
      consumed: 0,
      stoppedEarly: false,
      closed: false,
    };
    this.streams.push(call);
    if (options.stdin instanceof ReadableStream) {
      const decoder = new TextDecoder();
      (async () => {
        for await (const chunk of options.stdin as ReadableStream<Uint8Array>) {
          call.input += decoder.decode(chunk, { stream: true });
        }
        call.inputClosed = true;
      })();
    } else if (options.stdin !== undefined) {
      call.input = typeof options.stdin === "string"
        ? options.stdin
        : new TextDecoder().decode(options.stdin);
      call.inputClosed = true;
    }
    let settle!: (outcome: Promise<ExecStreamOutcome>) => void;
    const outcome = new Promise<ExecStreamOutcome>((resolve) => settle = resolve);
    outcome.catch(() => {});
    const finish = (): Promise<ExecStreamOutcome> => {
      const scripted = script.outcome ?? {};
      if ("reject" in scripted) return Promise.reject(scripted.reject);
      return Promise.resolve({
        exitCode: 0,
        durationMs: 1,
        timedOut: false,
        oomKilled: false,
        stderrTail: "",
        ...scripted,
      });
    };
    let started = false;
    return {
      outcome,
      [Symbol.asyncIterator]: async function* () {
        // Like execStreamOf: one iteration per stream; a second call (e.g. a defensive return()) is empty.
        if (started) return;
        started = true;
        let drained = false;
        try {
          for (const line of script.lines) {
            call.consumed++;
            yield line;
          }
          if (script.throwAfterLines) throw script.throwAfterLines;
          drained = true;
        } finally {
          call.stoppedEarly = !drained && !script.throwAfterLines;
          call.closed = true;
          settle(finish());
        }
        await outcome;
      },
    };
  }

  execBytes(argv: readonly string[]): ExecBytes {
    throw new Error(`FakeProvider: execBytes is not scripted (${argv.join(" ")})`);
  }

  exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    this.execs.push({ argv, env: options.env, cwd: options.cwd });
    if (this.failRm && argv[0] === "rm") {
      return Promise.reject(new SandboxError("exec_failed", "rm failed"));
    }
    return Promise.resolve({
      exitCode: 0,
      stdout: "",
      stderr: "",
      durationMs: 1,
      timedOut: false,
      oomKilled: false,
    });
  }

  readFile(): Promise<Uint8Array> {
    return Promise.reject(new Error("FakeProvider.readFile is not scripted"));
  }

  writeFile(
    path: string,
    data: Uint8Array | string,
    options: { mode?: number } = {},
  ): Promise<void> {
    this.writes.push({
      path,
      data: typeof data === "string" ? data : new TextDecoder().decode(data),
      mode: options.mode,
    });
    if (this.failWritesTo?.test(path)) {
      return Promise.reject(new SandboxError("exec_failed", `Cannot write "${path}"`));
    }
    return Promise.resolve();
  }

  copyIn(): Promise<void> {
    return Promise.resolve();
  }

  copyOut(): Promise<void> {
    return Promise.resolve();
  }

  stats(): Promise<SandboxStats> {
    return Promise.resolve({
      profile: "fake",
      name: "fake",
      memoryBytes: 0,
      memoryLimitBytes: 0,
      cpuPercent: 0,
      pids: 0,
      pidsLimit: 0,
    });
  }

  status(): Promise<SandboxStatus> {
    return Promise.resolve({
      profile: "fake",
      name: "sandbox-fake",
      id: "0",
      image: "fake",
      state: "running",
      health: "healthy",
      createdAt: new Date(0).toISOString(),
      startedAt: new Date(0).toISOString(),
      stoppedAt: null,
      workspacePath: "/workspace",
      current: true,
      kind: "shared",
      repo: null,
    });
  }

  stop(): Promise<SandboxStatus> {
    return this.status();
  }

  start(): Promise<SandboxStatus> {
    return this.status();
  }

  healthCheck(): Promise<boolean> {
    return Promise.resolve(true);
  }

  teardown(): Promise<TeardownReport> {
    return Promise.resolve({ containers: [], networks: [], volumes: [] });
  }
}

const SESSION_ENV = {
  SANDBOX_LLM_BASE_URL: "http://172.30.0.1:4000/proxy/v1",
  SANDBOX_LLM_TOKEN: "sbx_session_token_123",
};

function driverFor(provider: FakeProvider): ContainerDriver {
  return new ContainerDriver({ provider, env: SESSION_ENV, model: "fake-model" });
}

const line = (message: Parameters<typeof encodeMessage>[0]) => encodeMessage(message);
const TOOL_CALL = line({
  type: "tool_call",
  tool_name: "execute",
  tool_input: { command: "ls" },
  tool_call_id: "c1",
});
const TOOL_RESULT = line({
  type: "tool_result",
  tool_name: "execute",
  tool_output: "a\nb",
  tool_call_id: "c1",
});
const RESULT = line({ type: "result", content: "done" });
const USAGE = line({
  type: "usage",
  usage: { input_tokens: 12, output_tokens: 3, num_turns: 2, model: "fake-model" },
});

async function collect(
  driver: ContainerDriver,
  prompt = "do it",
  runId = "run-1",
): Promise<AgenticMessage[]> {
  return await Array.fromAsync(
    driver.executeAgentic(prompt, { cwd: "/workspace/runs/run-1", runId }),
  );
}

/** Awaits `promise`, asserting it rejects with a `SandboxError` of `code`; returns the error. */
async function rejectsWith(promise: Promise<unknown>, code: string): Promise<SandboxError> {
  const error = await promise.then(
    () => assert.fail(`expected a SandboxError "${code}", but the call succeeded`),
    (error: unknown) => error,
  );
  assert.ok(error instanceof SandboxError, `expected a SandboxError, got ${error}`);
  assert.equal(error.code, code, `expected code "${code}", got "${error.code}": ${error.message}`);
  return error;
}

/** Let the input readers of the fake catch up (they read asynchronously). */
const settled = () => new Promise((resolve) => setTimeout(resolve, 0));

/**
 * Each call started `worker serve` with no variables and no file: its one job came on its input,
 * which was ended when the call did. Returns the jobs.
 */
async function assertJobsOnInput(provider: FakeProvider): Promise<WorkerJob[]> {
  await settled();
  assert.deepEqual(provider.writes, [], "no file was written");
  assert.deepEqual(provider.execs, [], "no other command ran");
  return provider.streams.map((call) => {
    assert.deepEqual(call.argv, [...WORKER_COMMAND, "serve"]);
    assert.equal(call.env, undefined, "the exec carries no variables: they are in the job");
    assert.ok(call.inputClosed, "the worker's input was not ended");
    const lines = call.input.split("\n");
    assert.equal(lines.pop(), "", "the job is one line");
    assert.equal(lines.length, 1, "exactly one job");
    return parseJob(lines[0]);
  });
}

Deno.test("an empty prompt is a usage error and nothing is started", async (t) => {
  for (const prompt of ["", "  \n\t "]) {
    await t.step(`executeAgentic(${JSON.stringify(prompt)})`, async () => {
      const provider = new FakeProvider();
      await rejectsWith(collect(driverFor(provider), prompt), "usage");
      assert.deepEqual(provider.writes, []);
      assert.deepEqual(provider.execs, []);
      assert.deepEqual(provider.streams, []);
    });
    await t.step(`generate(${JSON.stringify(prompt)})`, async () => {
      const provider = new FakeProvider();
      await rejectsWith(driverFor(provider).generate(prompt), "usage");
      assert.deepEqual(provider.writes, []);
      assert.deepEqual(provider.execs, []);
      assert.deepEqual(provider.streams, []);
    });
  }
});

Deno.test("a malformed JSON line raises worker_failed at once, reads nothing after it and stops the worker", async () => {
  const provider = new FakeProvider({
    lines: [TOOL_CALL, "{not json", TOOL_RESULT, RESULT, USAGE],
  });
  const driver = driverFor(provider);
  const seen: AgenticMessage[] = [];
  const error = await rejectsWith(
    (async () => {
      for await (const message of driver.executeAgentic("do it", { cwd: "/w", runId: "run-1" })) {
        seen.push(message);
      }
    })(),
    "worker_failed",
  );
  assert.deepEqual(
    seen.map((m) => m.type),
    ["tool_call"],
    "the good line before the bad one is delivered",
  );
  assert.match(error.message, /line 2/);
  assert.equal(provider.streams[0].consumed, 2, "lines after the malformed one were read");
  assert.ok(provider.streams[0].closed, "the worker stream was not stopped");
  assert.equal(driver.getUsage(), null);
  await assertJobsOnInput(provider);
});

Deno.test("valid JSON that is not an AgenticMessage raises worker_failed", async (t) => {
  const cases: Record<string, string> = {
    "an unknown type": `{"type":"banana","content":"x"}`,
    "no type": `{"content":"x"}`,
    "an array": `[1,2,3]`,
    "a string": `"result"`,
    "null": `null`,
    "a wrongly typed field": `{"type":"result","content":"x","is_error":"yes"}`,
    "tool_input that is not an object": `{"type":"tool_call","tool_input":[1]}`,
    "negative token counts": `{"type":"usage","usage":{"input_tokens":-1}}`,
  };
  for (const [what, bad] of Object.entries(cases)) {
    await t.step(what, async () => {
      const provider = new FakeProvider({ lines: [bad, RESULT, USAGE] });
      await rejectsWith(collect(driverFor(provider)), "worker_failed");
      assert.equal(provider.streams[0].consumed, 1, "lines after the invalid one were read");
      await assertJobsOnInput(provider);
    });
  }
});

Deno.test("a worker that exits without a result raises worker_failed naming its exit code", async (t) => {
  await t.step("agentic", async () => {
    const provider = new FakeProvider({
      lines: [TOOL_CALL, TOOL_RESULT],
      outcome: { exitCode: 3, stderrTail: "worker: boom" },
    });
    const error = await rejectsWith(collect(driverFor(provider)), "worker_failed");
    assert.match(error.message, /exited with code 3\b/);
    assert.equal(error.detail, "worker: boom", "the worker's stderr tail is the error's detail");
    await assertJobsOnInput(provider);
  });
  await t.step("generate", async () => {
    const provider = new FakeProvider({ lines: [USAGE], outcome: { exitCode: 1 } });
    const error = await rejectsWith(
      driverFor(provider).generate("answer", { runId: "run-1" }),
      "worker_failed",
    );
    assert.match(error.message, /code 1\b|result/);
    await assertJobsOnInput(provider);
  });
  await t.step("killed by the memory limit", async () => {
    const provider = new FakeProvider({
      lines: [TOOL_CALL],
      outcome: { exitCode: 137, oomKilled: true },
    });
    const error = await rejectsWith(collect(driverFor(provider)), "worker_failed");
    assert.match(error.message, /memory/);
    await assertJobsOnInput(provider);
  });
});

Deno.test("a worker that emits two results raises worker_failed", async () => {
  const provider = new FakeProvider({ lines: [RESULT, RESULT, USAGE] });
  await rejectsWith(collect(driverFor(provider)), "worker_failed");
  await assertJobsOnInput(provider);
});

const SCHEMA: JsonSchema = {
  file: "answer.json",
  name: "answer",
  schema: {
    type: "object",
    required: ["name", "count"],
    properties: { name: { type: "string" }, count: { type: "integer" } },
  },
};

Deno.test("generate() with a schema returns the parsed value when the result satisfies it", async () => {
  const provider = new FakeProvider({
    lines: [line({ type: "result", content: `{"name":"x","count":3}` }), USAGE],
  });
  const driver = driverFor(provider);
  const { value, sessionId } = await driver.generate("answer", { schema: SCHEMA, runId: "run-1" });
  assert.deepEqual(value, { name: "x", count: 3 });
  assert.equal(sessionId, null);
  assert.equal(driver.getUsage()?.input_tokens, 12);
  await assertJobsOnInput(provider);
});

Deno.test("generate() hands the worker the JSON Schema in its job, named by the caller's file", async () => {
  const provider = new FakeProvider({
    lines: [line({ type: "result", content: `{"name":"x","count":3}` }), USAGE],
  });
  await driverFor(provider).generate("answer", { schema: SCHEMA, runId: "run-1" });
  const [job] = await assertJobsOnInput(provider);
  assert.equal(job.mode, "generate");
  assert.deepEqual(job.schema, SCHEMA, "the job's schema is not the one the caller gave");
});

Deno.test("generate() raises worker_failed when the result does not match the schema", async (t) => {
  const cases: Record<string, string> = {
    "a missing required field": `{"name":"x"}`,
    "a wrong type": `{"name":"x","count":"three"}`,
    "not JSON at all": "I think the answer is 3",
  };
  for (const [what, content] of Object.entries(cases)) {
    await t.step(what, async () => {
      const provider = new FakeProvider({ lines: [line({ type: "result", content }), USAGE] });
      const error = await rejectsWith(
        driverFor(provider).generate("answer", { schema: SCHEMA, runId: "run-1" }),
        "worker_failed",
      );
      assert.ok(
        error.detail?.includes(content.slice(0, 20)),
        "the offending output is not in the error's detail",
      );
      await assertJobsOnInput(provider);
    });
  }
  await t.step("the worker itself reports the mismatch as an is_error result", async () => {
    const provider = new FakeProvider({
      lines: [
        line({ type: "result", content: "Model output does not match the schema", is_error: true }),
        USAGE,
      ],
    });
    await rejectsWith(
      driverFor(provider).generate("answer", { schema: SCHEMA, runId: "run-1" }),
      "worker_failed",
    );
    await assertJobsOnInput(provider);
  });
});

Deno.test("a failed docker exec propagates with the provider's own code and the worker's input is ended", async (t) => {
  const cases: [string, StreamScript, string][] = [
    ["the container is gone", {
      lines: [],
      outcome: { reject: new SandboxError("container_not_found", "No such container") },
    }, "container_not_found"],
    ["docker exec failed after some output", {
      lines: [TOOL_CALL],
      outcome: { reject: new SandboxError("exec_failed", "exec failed") },
    }, "exec_failed"],
    ["the worker timed out after its result", {
      lines: [TOOL_CALL, RESULT],
      outcome: { reject: new SandboxError("timeout", "timed out") },
    }, "timeout"],
    ["the run was interrupted", {
      lines: [TOOL_CALL],
      outcome: { reject: new SandboxError("interrupted", "Interrupted") },
    }, "interrupted"],
    ["the stream broke mid-way", {
      lines: [TOOL_CALL],
      throwAfterLines: new SandboxError("exec_failed", "stream broke"),
    }, "exec_failed"],
  ];
  for (const [what, script, code] of cases) {
    await t.step(`executeAgentic: ${what}`, async () => {
      const provider = new FakeProvider(script);
      await rejectsWith(collect(driverFor(provider)), code);
      await assertJobsOnInput(provider);
    });
    await t.step(`generate: ${what}`, async () => {
      const provider = new FakeProvider({
        ...script,
        lines: script.lines.filter((l) => l !== TOOL_CALL),
      });
      await rejectsWith(driverFor(provider).generate("answer", { runId: "run-1" }), code);
      await assertJobsOnInput(provider);
    });
  }
});

Deno.test("a consumer that stops early stops the worker and ends its input", async () => {
  const provider = new FakeProvider({ lines: [TOOL_CALL, TOOL_RESULT, RESULT, USAGE] });
  for await (
    const message of driverFor(provider).executeAgentic("do it", { cwd: "/w", runId: "run-1" })
  ) {
    assert.equal(message.type, "tool_call");
    break;
  }
  assert.equal(provider.streams[0].consumed, 1);
  assert.ok(provider.streams[0].stoppedEarly, "the worker stream was not told to stop");
  await assertJobsOnInput(provider);
});

Deno.test("usage is not yielded but is available from getUsage()", async () => {
  const provider = new FakeProvider({ lines: [TOOL_CALL, TOOL_RESULT, RESULT, USAGE] });
  const driver = driverFor(provider);
  assert.equal(driver.getUsage(), null);
  const messages = await collect(driver);
  assert.deepEqual(messages.map((m) => m.type), ["tool_call", "tool_result", "result"]);
  assert.deepEqual(driver.getUsage(), {
    input_tokens: 12,
    output_tokens: 3,
    cache_read_tokens: null,
    cache_creation_tokens: null,
    cost_usd: null,
    duration_ms: null,
    num_turns: 2,
    model: "fake-model",
  });
  await assertJobsOnInput(provider);
});

Deno.test("getUsage() is reset by the next call", async () => {
  const provider = new FakeProvider({ lines: [RESULT, USAGE] }, { lines: [RESULT] });
  const driver = driverFor(provider);
  await collect(driver, "one", "run-a");
  assert.equal(driver.getUsage()?.input_tokens, 12);
  await collect(driver, "two", "run-b");
  assert.equal(driver.getUsage(), null);
});

Deno.test("cleanupSession() returns false: the driver keeps no session state", () => {
  const driver = driverFor(new FakeProvider());
  assert.equal(driver.cleanupSession("any-session"), false);
  assert.equal(driver.cleanupSession(""), false);
});

Deno.test("the prompt, instructions and session variables go in the job on the worker's input, never into argv, env or a file", async (t) => {
  const prompt = `secret-prompt-${crypto.randomUUID()}`;
  const instructions = `secret-instructions-${crypto.randomUUID()}`;
  await t.step("executeAgentic", async () => {
    const provider = new FakeProvider({ lines: [RESULT, USAGE] });
    await Array.fromAsync(
      driverFor(provider).executeAgentic(prompt, {
        cwd: "/w",
        runId: "run-1",
        instructions,
        maxTurns: 4,
      }),
    );
    const [job] = await assertJobsOnInput(provider);
    assert.deepEqual(job, {
      mode: "agentic",
      prompt,
      env: SESSION_ENV,
      cwd: "/w",
      instructions,
      model: "fake-model",
      maxTurns: 4,
      schema: undefined,
    });
    for (const value of provider.everything) {
      assert.ok(!value.includes(prompt), `the prompt appears in argv/env/a file: ${value}`);
      assert.ok(
        !value.includes(instructions),
        `the instructions appear in argv/env/a file: ${value}`,
      );
      assert.ok(
        !value.includes(SESSION_ENV.SANDBOX_LLM_TOKEN),
        `the session token appears in argv/env/a file: ${value}`,
      );
    }
  });
  await t.step("generate", async () => {
    const provider = new FakeProvider({ lines: [RESULT, USAGE] });
    assert.deepEqual(await driverFor(provider).generate(prompt, { runId: "run-1" }), {
      value: "done",
      sessionId: null,
    });
    const [job] = await assertJobsOnInput(provider);
    assert.equal(job.prompt, prompt);
    for (const value of provider.everything) {
      assert.ok(!value.includes(prompt), `the prompt appears in argv/env/a file: ${value}`);
    }
  });
});

Deno.test("two concurrent executeAgentic() calls each start their own worker with their own job", async () => {
  const provider = new FakeProvider({ lines: [TOOL_CALL, RESULT, USAGE] }, {
    lines: [TOOL_CALL, RESULT, USAGE],
  });
  const driver = driverFor(provider);
  const [a, b] = await Promise.all([
    Array.fromAsync(driver.executeAgentic("first", { cwd: "/w/a" })),
    Array.fromAsync(driver.executeAgentic("second", { cwd: "/w/b" })),
  ]);
  assert.equal(a.length, 2);
  assert.equal(b.length, 2);
  const jobs = await assertJobsOnInput(provider);
  assert.deepEqual(
    new Set(jobs.map((j) => `${j.prompt} ${j.cwd}`)),
    new Set(["first /w/a", "second /w/b"]),
  );
});

Deno.test("a worker started ahead of the call gets the job, and no other worker is started", async () => {
  const provider = new FakeProvider({ lines: [RESULT, USAGE] });
  // As a run does: the worker starts while the session opens; the job comes once the call does.
  const early = startWorker(provider, [...WORKER_COMMAND, "serve"]);
  let asked = 0;
  const driver = new ContainerDriver({
    provider,
    env: SESSION_ENV,
    worker: () => (asked++, early),
  });
  assert.equal(provider.streams.length, 1);
  const messages = await collect(driver, "from the start");
  assert.deepEqual(messages.map((m) => m.type), ["result"]);
  assert.equal(asked, 1);
  const [job] = await assertJobsOnInput(provider);
  assert.equal(job.prompt, "from the start");
});

Deno.test("a job that carries a known secret is refused before any worker starts", async (t) => {
  const secret = `sk-known-${crypto.randomUUID()}`;
  registerSecret(secret, "the test's key");
  const cases: [string, (provider: FakeProvider) => Promise<unknown>][] = [
    ["in the prompt", (provider) => collect(driverFor(provider), `use ${secret}`)],
    [
      "in the instructions",
      (provider) =>
        Array.fromAsync(
          driverFor(provider).executeAgentic("hi", { cwd: "/w", instructions: secret }),
        ),
    ],
    [
      "in a session variable",
      (provider) => collect(new ContainerDriver({ provider, env: { NOTES: secret } })),
    ],
    ["in generate()'s prompt", (provider) => driverFor(provider).generate(`use ${secret}`)],
  ];
  for (const [what, call] of cases) {
    await t.step(what, async () => {
      const provider = new FakeProvider({ lines: [RESULT, USAGE] });
      const error = await rejectsWith(call(provider), "config_invalid");
      assert.ok(!error.message.includes(secret), "the message names the secret's value");
      assert.match(error.message, /the test's key/);
      assert.deepEqual(provider.streams, [], "a worker was started");
    });
  }
  await t.step("the same job without the secret runs (positive twin)", async () => {
    const provider = new FakeProvider({ lines: [RESULT, USAGE] });
    assert.deepEqual(
      (await collect(driverFor(provider), "use nothing secret")).map((m) => m.type),
      ["result"],
    );
  });
});

Deno.test("a worker cut short by its deadline or an interrupt is reported as the run's fate, not a command's", async (t) => {
  await t.step("timeout", async () => {
    const provider = new FakeProvider({
      lines: [TOOL_CALL],
      outcome: {
        reject: new SandboxError(
          "timeout",
          'Command timed out after 5000 ms in sandbox "sandbox-x"',
        ),
      },
    });
    const run = Array.fromAsync(
      driverFor(provider).executeAgentic("do it", { cwd: "/w", runId: "run-1", timeoutMs: 5_000 }),
    );
    const error = await rejectsWith(run, "timeout");
    assert.equal(error.message, "The run timed out after 5s");
    await assertJobsOnInput(provider);
  });
  await t.step("interrupt", async () => {
    const provider = new FakeProvider({
      lines: [TOOL_CALL],
      outcome: { reject: new SandboxError("interrupted", "Command interrupted") },
    });
    const error = await rejectsWith(collect(driverFor(provider)), "interrupted");
    assert.equal(error.message, "The run was interrupted");
  });
});
