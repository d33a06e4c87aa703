/**
 * `worker serve`: the job (prompt, run variables, options) on the worker's input, never in argv
 * or a file; a pooled worker (`--await-job`) that loads its code and waits, holding no secret, for
 * the socket its host makes (lib/sandbox/pooled_worker.ts, the host's side, is used as the host);
 * and a worker that stops when the host's input ends.
 */
import assert from "node:assert/strict";
import { type AgenticMessage, decodeMessage } from "../../lib/run/protocol.ts";
import { spawn } from "../../lib/process.ts";
import { encodeJob, parseJob, type WorkerJob } from "../../worker/job.ts";
import { frame } from "../../worker/serve.ts";
import { claimPooledWorker, startedWarm } from "../../lib/sandbox/pooled_worker.ts";
import { ROOT, tempDir } from "../_helpers.ts";
import { FAKE_LLM_KEY, FakeLlm, text, toolCall, writeThenExecute } from "../_fake_llm.ts";

const WORKER = `${ROOT}/worker/main.ts`;

/** With only the permissions it needs: no network but the LLM's port (and a pooled one's socket). */
function workerArgv(llmPort: number, ...args: string[]): string[] {
  const dir = args.indexOf("--await-job");
  const socket = dir === -1
    ? ""
    : `,unix:${args[dir + 1]}/job.sock,unix:${args[dir + 1]}/warm.sock`;
  return [
    Deno.execPath(),
    "run",
    "--quiet",
    `--config=${ROOT}/deno.json`,
    "--allow-read",
    "--allow-write",
    "--allow-env",
    "--allow-run",
    "--allow-sys",
    // A pooled worker's warm-up serves itself on a loopback port of its own.
    `--allow-net=127.0.0.1${dir === -1 ? `:${llmPort}` : ""}${socket}`,
    WORKER,
    ...args,
  ];
}

function llmEnv(baseUrl: string): Record<string, string> {
  return {
    SANDBOX_LLM_API: "openai",
    SANDBOX_LLM_BASE_URL: baseUrl,
    SANDBOX_LLM_TOKEN: FAKE_LLM_KEY,
    SANDBOX_LLM_MODEL: "fake-model",
    SANDBOX_LLM_MAX_RETRIES: "0",
  };
}

/** A stdin the test writes to and closes when it chooses (a host keeps it open for the run). */
function hostInput() {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  const stream = new ReadableStream<Uint8Array>({ start: (c) => void (controller = c) });
  return {
    stream,
    send: (text: string) => controller.enqueue(new TextEncoder().encode(text)),
    close: () => {
      try {
        controller.close();
      } catch {
        // Already closed.
      }
    },
  };
}

function decodeAll(stdout: string): AgenticMessage[] {
  return stdout.split("\n").filter(Boolean).map((line, i) => decodeMessage(line, i + 1));
}

Deno.test("parseJob() accepts a job line and refuses every malformed one, saying what is wrong", async (t) => {
  const job: WorkerJob = { mode: "agentic", prompt: "hi", env: { A: "1" }, cwd: "/w", maxTurns: 3 };
  await t.step("a round trip through encodeJob()", () => {
    assert.deepEqual(parseJob(encodeJob(job).trim()), {
      ...job,
      instructions: undefined,
      model: undefined,
      schema: undefined,
    });
  });
  const bad: [string, unknown, RegExp][] = [
    ["not JSON", "{nope", /not JSON/],
    ["an array", [], /not a JSON object/],
    ["an unknown mode", { ...job, mode: "shell" }, /mode is "shell"/],
    ["no prompt", { ...job, prompt: undefined }, /no prompt/],
    [
      "env values that are not strings",
      { ...job, env: { A: 1 } },
      /env is not an object of strings/,
    ],
    ["a cwd that is not a string", { ...job, cwd: ["/"] }, /cwd is not a string/],
    ["maxTurns below one", { ...job, maxTurns: 0 }, /maxTurns is 0/],
    [
      "a schema without its parts",
      { ...job, mode: "generate", schema: { name: "x" } },
      /schema is not/,
    ],
  ];
  for (const [what, value, message] of bad) {
    await t.step(what, () => {
      assert.throws(
        () => parseJob(typeof value === "string" ? value : JSON.stringify(value)),
        (e: Error) => e instanceof TypeError && message.test(e.message),
      );
    });
  }
});

Deno.test("worker serve runs the job it reads from stdin: the prompt reaches the LLM without touching argv or a file", async () => {
  await using dir = await tempDir("sandbox-serve-");
  const work = `${dir.path}/work`;
  const marker = `PROMPT-MARKER-${crypto.randomUUID()}`;
  await using fake = new FakeLlm(
    writeThenExecute("hello.txt", "hi\n", 'cat hello.txt; echo "env=[$PROJECT_VAR]"'),
  );
  const input = hostInput();
  // The run's variables come in the job; the process environment has none of them.
  const argv = workerArgv(fake.port, "serve");
  const child = spawn(argv, {
    cwd: dir.path,
    clearEnv: true,
    env: { HOME: Deno.env.get("HOME") ?? "/tmp" },
    stdin: input.stream,
    timeoutMs: 120_000,
  });
  input.send(encodeJob({
    mode: "agentic",
    prompt: `Create hello.txt. ${marker}`,
    env: { ...llmEnv(fake.proxyBaseUrl), PROJECT_VAR: "42" },
    cwd: work,
  }));
  const stdout = new Response(child.stdout).text();
  const outcome = await child.finished;
  input.close();
  const messages = decodeAll(await stdout);
  assert.equal(outcome.exitCode, 0, outcome.stderrTail);
  assert.deepEqual(messages.map((m) => m.type), [
    "tool_call",
    "tool_result",
    "tool_call",
    "tool_result",
    "thinking",
    "result",
    "usage",
  ]);
  assert.equal(await Deno.readTextFile(`${work}/hello.txt`), "hi\n");
  assert.match(messages[3].tool_output ?? "", /env=\[42\]/, "commands get the job's variables");
  assert.ok(
    JSON.stringify(fake.requests[0].body.messages).includes(marker),
    "the prompt reached the LLM",
  );
  assert.equal(
    fake.requests[0].headers.get("authorization"),
    `Bearer ${FAKE_LLM_KEY}`,
    "the job's token is the key",
  );
  assert.ok(!argv.join(" ").includes(marker), "the prompt is not in argv");
  for await (const entry of Deno.readDir(dir.path)) {
    if (entry.isFile) {
      assert.ok(
        !(await Deno.readTextFile(`${dir.path}/${entry.name}`)).includes(marker),
        `no file holds the prompt: ${entry.name}`,
      );
    }
  }
});

Deno.test("worker serve stops at once when the host's input ends before the run does", async () => {
  await using dir = await tempDir("sandbox-serve-");
  const work = `${dir.path}/work`;
  await using fake = new FakeLlm([
    toolCall("execute", { command: "echo one >> log.txt; sleep 0.3" }),
    toolCall("execute", { command: "echo two >> log.txt; sleep 0.3" }),
    toolCall("execute", { command: "echo three >> log.txt; sleep 0.3" }),
    toolCall("execute", { command: "echo four >> log.txt" }),
    text("done"),
  ]);
  const input = hostInput();
  const child = spawn(workerArgv(fake.port, "serve"), {
    clearEnv: true,
    env: { HOME: Deno.env.get("HOME") ?? "/tmp" },
    stdin: input.stream,
    timeoutMs: 60_000,
  });
  input.send(
    encodeJob({ mode: "agentic", prompt: "Count", env: llmEnv(fake.proxyBaseUrl), cwd: work }),
  );
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const first = await reader.read();
  assert.match(first.value ?? "", /"type":"tool_call"/);
  input.close();
  const outcome = await child.finished;
  await reader.cancel().catch(() => {});
  assert.equal(outcome.exitCode, 130, outcome.stderrTail);
  const log = await Deno.readTextFile(`${work}/log.txt`).catch(() => "");
  assert.ok(!log.includes("four"), `the agent went on after the host left: ${JSON.stringify(log)}`);
});

Deno.test("worker serve turns a job it cannot read into an is_error result", async (t) => {
  for (
    const [what, line, message] of [
      ["not JSON", "{nope\n", /Cannot read the job: The job is not JSON/],
      [
        "an empty prompt",
        encodeJob({ mode: "generate", prompt: "  ", env: {} }),
        /prompt is empty/,
      ],
      ["input that ends without a line", "", /ended before a whole job line/],
    ] as const
  ) {
    await t.step(what, async () => {
      const input = hostInput();
      const child = spawn(workerArgv(1, "serve"), {
        clearEnv: true,
        env: { HOME: Deno.env.get("HOME") ?? "/tmp" },
        stdin: input.stream,
        timeoutMs: 60_000,
      });
      if (line) input.send(line);
      else input.close();
      const stdout = new Response(child.stdout).text();
      const outcome = await child.finished;
      input.close();
      const messages = decodeAll(await stdout);
      assert.equal(outcome.exitCode, 0, outcome.stderrTail);
      assert.deepEqual(messages.map((m) => m.type), ["result", "usage"]);
      assert.equal(messages[0].is_error, true);
      assert.match(messages[0].content ?? "", message);
    });
  }
});

/** Connect to a spare's socket: send the job, read the framed lines back until it closes. */
/** A pooled worker (`serve --await-job DIR`) as a child of this test, with no secret given. */
function pooledWorker(llmPort: number, dir: string) {
  const [program, ...args] = workerArgv(llmPort, "serve", "--await-job", dir);
  const child = new Deno.Command(program, {
    args,
    clearEnv: true,
    env: { HOME: Deno.env.get("HOME") ?? "/tmp", SANDBOX_LLM_MODEL: "fake-model" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  return { pid: child.pid, finished: child.output() };
}

/** Until process `pid` watches a directory (inotify): a pooled worker waiting for its job. */
async function untilWatching(pid: number): Promise<void> {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline;) {
    for (const entry of Deno.readDirSync(`/proc/${pid}/fd`)) {
      const target = await Deno.readLink(`/proc/${pid}/fd/${entry.name}`).catch(() => "");
      if (target === "anon_inode:inotify") return;
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error(`worker ${pid} never began to wait`);
}

/** The host's side of a claim, as lib/sandbox/pool.ts makes it, with the kills it would do noted. */
function claim(dir: string, stops: string[], connectWaitMs?: number) {
  return claimPooledWorker(dir, {
    sandboxName: "unit",
    stop: () => Promise.resolve(void stops.push("stopped")),
    oomKilled: () => Promise.resolve(false),
    connectWaitMs,
  });
}

Deno.test("a pooled worker waits holding no secret, takes its job from the socket the host makes, and exits", async () => {
  await using dir = await tempDir("sandbox-pooled-");
  await using fake = new FakeLlm([text("hello from the pool")]);
  const worker = pooledWorker(fake.port, dir.path);
  // Claimed once it waits (its watch open), as a pooled container's is: the socket's name wakes it.
  await untilWatching(worker.pid);
  const stops: string[] = [];
  const claimed = await claim(dir.path, stops);
  assert.ok(claimed, "the worker connected to the host's socket");
  const environ = await Deno.readTextFile(`/proc/${worker.pid}/environ`);
  const cmdline = await Deno.readTextFile(`/proc/${worker.pid}/cmdline`);
  assert.ok(environ.includes("SANDBOX_LLM_MODEL=fake-model"), "environ read (positive control)");
  for (const secret of [FAKE_LLM_KEY, "SANDBOX_LLM_TOKEN", "OPENAI_API_KEY"]) {
    assert.ok(
      !environ.includes(secret) && !cmdline.includes(secret),
      `the waiting worker holds no ${secret}`,
    );
  }
  await assert.rejects(
    Deno.lstat(`${dir.path}/job.sock`),
    Deno.errors.NotFound,
    "the socket is gone once the worker connected: one job per worker",
  );
  const marker = `PROMPT-${crypto.randomUUID()}`;
  claimed.send({ mode: "generate", prompt: marker, env: llmEnv(fake.proxyBaseUrl) });
  const events = (await Array.fromAsync(claimed.stream)).map((line, i) =>
    decodeMessage(line, i + 1)
  );
  claimed.close();
  assert.deepEqual(events.map((m) => m.type), ["result", "usage"]);
  assert.equal(events[0].content, "hello from the pool");
  assert.equal((await claimed.stream.outcome).exitCode, 0);
  assert.deepEqual(stops, [], "a worker that ended by itself is not killed");
  const outcome = await worker.finished;
  assert.equal(outcome.code, 0, new TextDecoder().decode(outcome.stderr));
  assert.equal(outcome.stdout.byteLength, 0, "its output went to the connection, not its stdout");
  assert.ok(JSON.stringify(fake.requests[0].body.messages).includes(marker));
});

Deno.test("a pooled worker's warm-up reaches only its own loopback server: the LLM it is given sees the job's request and nothing else, even claimed mid-warm-up", async () => {
  await using dir = await tempDir("sandbox-pooled-");
  await using fake = new FakeLlm([text("agent done")]);
  const worker = pooledWorker(fake.port, dir.path);
  // Claimed as soon as it waits: its warm-up rounds are under way then.
  await untilWatching(worker.pid);
  const claimed = await claim(dir.path, []);
  assert.ok(claimed, "the worker connected to the host's socket");
  const marker = `PROMPT-${crypto.randomUUID()}`;
  const cwd = await Deno.makeTempDir({ dir: dir.path });
  claimed.send({ mode: "agentic", prompt: marker, cwd, env: llmEnv(fake.proxyBaseUrl) });
  const events = (await Array.fromAsync(claimed.stream)).map((line, i) =>
    decodeMessage(line, i + 1)
  );
  claimed.close();
  const result = events.find((m) => m.type === "result");
  assert.equal(result?.content, "agent done", JSON.stringify(events));
  assert.equal((await worker.finished).code, 0);
  assert.equal(fake.requests.length, 1, "one request: the job's");
  assert.ok(JSON.stringify(fake.requests[0].body.messages).includes(marker));
});

Deno.test("a pooled worker the host leaves stops; at its deadline its tree is stopped; one that never comes is none", async (t) => {
  await t.step(
    "the host leaves before the job: the worker exits, having called nothing",
    async () => {
      await using dir = await tempDir("sandbox-pooled-");
      await using fake = new FakeLlm([text("never sent")]);
      const worker = pooledWorker(fake.port, dir.path);
      const claimed = await claim(dir.path, []);
      assert.ok(claimed);
      claimed.close();
      assert.notEqual((await worker.finished).code, 0);
      assert.equal(fake.requests.length, 0);
    },
  );
  await t.step(
    "the deadline passes mid-job: a timeout error, the tree stopped, the worker gone",
    async () => {
      await using dir = await tempDir("sandbox-pooled-");
      // An LLM that takes the request and never answers.
      const silent = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      const held: Deno.Conn[] = [];
      const accepting = (async () => {
        for await (const conn of silent) held.push(conn);
      })();
      const worker = pooledWorker(silent.addr.port, dir.path);
      const stops: string[] = [];
      const claimed = await claimPooledWorker(dir.path, {
        sandboxName: "unit",
        timeoutMs: 1_000,
        stop: () => Promise.resolve(void stops.push("stopped")),
        oomKilled: () => Promise.resolve(false),
      });
      assert.ok(claimed);
      claimed.send({
        mode: "generate",
        prompt: "hello",
        env: llmEnv(`http://127.0.0.1:${silent.addr.port}/v1`),
      });
      await assert.rejects(
        Array.fromAsync(claimed.stream),
        /timed out after 1000 ms in sandbox "unit"/,
      );
      await assert.rejects(claimed.stream.outcome, /timed out/);
      assert.deepEqual(stops, ["stopped"]);
      assert.equal((await worker.finished).code, 130, "the host's leaving ended the worker");
      silent.close();
      await accepting;
      for (const conn of held) conn.close();
    },
  );
  await t.step(
    "nothing connects in time: none, and whatever might still come is stopped",
    async () => {
      await using dir = await tempDir("sandbox-pooled-");
      const stops: string[] = [];
      assert.equal(await claim(dir.path, stops, 50), undefined);
      assert.deepEqual(stops, ["stopped"]);
      await assert.rejects(Deno.lstat(`${dir.path}/job.sock`), Deno.errors.NotFound);
    },
  );
});

Deno.test("a pool's filler hears when its worker is warm; a worker that never says so is reported", async () => {
  await using dir = await tempDir("sandbox-pooled-");
  await using fake = new FakeLlm([text("unused")]);
  let worker: ReturnType<typeof pooledWorker> | undefined;
  const warm = await startedWarm(dir.path, () => {
    worker = pooledWorker(fake.port, dir.path);
    return Promise.resolve();
  });
  assert.equal(warm, true);
  // Still waiting for its job after saying so: the claim reaches it, and its end is the host's.
  const claimed = await claim(dir.path, []);
  assert.ok(claimed, "the warm worker took the claim");
  claimed.close();
  await worker!.finished;
  assert.equal(await startedWarm(dir.path, () => Promise.resolve(), 50), false);
});

Deno.test("frame() tags every line of a multi-line diagnostic", () => {
  assert.equal(frame("e", "one\ntwo"), "eone\netwo\n");
  assert.equal(frame("o", '{"type":"result"}'), 'o{"type":"result"}\n');
});
