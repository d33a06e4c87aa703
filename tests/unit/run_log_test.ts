/**
 * Durable run records: `RunLog` writing `meta.json` and `events.ndjson` under a temporary
 * `$XDG_STATE_HOME`, and the readers (`readRun`, `listRuns`, `readEvents`) that `sandbox runs` and
 * `sandbox logs [--follow]` use. No Docker.
 */
import assert from "node:assert/strict";
import { type AgenticMessage, agenticMessage } from "../../lib/run/protocol.ts";
import { REDACTED, Redactor } from "../../lib/redact.ts";
import {
  listRuns,
  newRunId,
  readEvents,
  readRun,
  RunLog,
  type RunMeta,
  runsDir,
} from "../../lib/run/run_log.ts";
import { tempDir } from "../_helpers.ts";
import { fillDisk, mountTmpfs } from "../_tmpfs.ts";
import { lastSeq } from "../../lib/session/event_store.ts";
import { openIndex } from "../../lib/run/run_index.ts";
import { EXIT, SandboxError } from "../../lib/errors.ts";

/** `XDG_STATE_HOME` pointed at a fresh temporary directory until disposed. */
async function stateHome(): Promise<AsyncDisposable & { path: string }> {
  const dir = await tempDir("sandbox-runlog-");
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", dir.path);
  return {
    path: dir.path,
    async [Symbol.asyncDispose]() {
      if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
      else Deno.env.set("XDG_STATE_HOME", previous);
      await dir[Symbol.asyncDispose]();
    },
  };
}

function init(id = newRunId()) {
  return {
    id,
    mode: "agentic" as const,
    profile: "unit",
    model: "fake-model",
    sandbox: "container",
  };
}

async function readMetaFile(id: string): Promise<RunMeta> {
  return JSON.parse(await Deno.readTextFile(`${runsDir()}/${id}/meta.json`));
}

async function eventLines(id: string): Promise<string[]> {
  const text = await Deno.readTextFile(`${runsDir()}/${id}/events.ndjson`);
  assert.ok(text === "" || text.endsWith("\n"), "events.ndjson does not end with a newline");
  return text.split("\n").filter((l) => l !== "");
}

/** The pid of a process that has exited. */
async function deadPid(): Promise<number> {
  const child = new Deno.Command("true", { stdin: "null", stdout: "null", stderr: "null" }).spawn();
  await child.status;
  return child.pid;
}

const toolCall = agenticMessage({
  type: "tool_call",
  tool_name: "execute",
  tool_input: { command: "ls" },
  tool_call_id: "c1",
});
const toolResult = agenticMessage({
  type: "tool_result",
  tool_name: "execute",
  tool_output: "a\nb",
  tool_call_id: "c1",
});
const result = agenticMessage({ type: "result", content: "done" });

Deno.test("RunLog.create() records a running run under $XDG_STATE_HOME/sandbox/runs/<id>", async () => {
  await using home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  assert.equal(log.dir, `${home.path}/sandbox/runs/${id}`);
  const meta = await readMetaFile(id);
  assert.equal(meta.id, id);
  assert.equal(meta.status, "running");
  assert.equal(meta.pid, Deno.pid);
  assert.equal(meta.endedAt, null);
  assert.equal(meta.exitCode, null);
  assert.ok(!Number.isNaN(Date.parse(meta.startedAt)));
  assert.deepEqual(await eventLines(id), []);
  assert.equal((await Deno.stat(log.dir)).mode! & 0o777, 0o700);
  assert.equal((await Deno.stat(`${log.dir}/meta.json`)).mode! & 0o777, 0o600);
  assert.equal((await Deno.stat(`${log.dir}/events.ndjson`)).mode! & 0o777, 0o600);
  assert.equal((await readRun(id))?.status, "running", "a run whose CLI is alive reads as running");
});

Deno.test("RunLog.append() writes one JSON line per event, in order, readable at once", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  await log.append(toolCall);
  assert.deepEqual(
    (await eventLines(id)).map((l) => JSON.parse(l)),
    [toolCall],
    "an event is not on disk before finish()",
  );
  await log.append(toolResult);
  await log.append(result);
  const events: AgenticMessage[] = (await eventLines(id)).map((l) => JSON.parse(l));
  assert.deepEqual(events, [toolCall, toolResult, result]);
});

Deno.test("a run's events reach the store in batches, all of them by its end; one appended after the log is closed is dropped quietly", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  const log = await RunLog.create(init(id));
  for (let i = 0; i < 300; i++) await log.append(toolCall);
  await log.finish({ status: "succeeded", exitCode: 0, usage: null, error: null });
  const db = openIndex();
  try {
    assert.equal(lastSeq(db, id), 300);
  } finally {
    db.close();
  }
  await log[Symbol.asyncDispose]();
  // An MCP environment's late event: before, its commit ran on a closed database in a timer.
  await log.append(result);
  await new Promise((resolve) => setTimeout(resolve, 50));
});

Deno.test("RunLog.finish() records the outcome in meta.json", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  const usage = {
    input_tokens: 10,
    output_tokens: 2,
    cache_read_tokens: null,
    cache_creation_tokens: null,
    cost_usd: null,
    duration_ms: 5,
    num_turns: 1,
    model: "fake-model",
  };
  await log.finish({
    status: "succeeded",
    exitCode: 0,
    usage,
    error: null,
    extra: { branch: "main" },
  });
  const meta = await readMetaFile(id);
  assert.deepEqual(meta, log.meta);
  assert.equal(meta.status, "succeeded");
  assert.equal(meta.exitCode, 0);
  assert.deepEqual(meta.usage, usage);
  assert.deepEqual(meta.extra, { branch: "main" });
  assert.ok(meta.endedAt !== null && Date.parse(meta.endedAt) >= Date.parse(meta.startedAt));
  assert.equal(typeof meta.durationMs, "number");
  assert.ok(meta.durationMs! >= 0);
});

Deno.test("meta.json is replaced atomically: a concurrent reader always sees a whole document, and no temporary file is left", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  const big = "x".repeat(256 * 1024);
  let writing = true;
  const writer = (async () => {
    try {
      for (let i = 0; i < 40; i++) {
        await log.finish({
          status: i % 2 ? "failed" : "succeeded",
          exitCode: i,
          usage: null,
          error: `${i} ${big}`,
        });
      }
    } finally {
      writing = false;
    }
  })();
  let reads = 0;
  while (writing) {
    const text = await Deno.readTextFile(`${runsDir()}/${id}/meta.json`);
    const meta = JSON.parse(text) as RunMeta; // throws on a torn document
    assert.equal(meta.id, id);
    reads++;
  }
  await writer;
  assert.ok(reads > 0);
  assert.equal((await readMetaFile(id)).exitCode, 39);
  const leftovers = [];
  for await (const entry of Deno.readDir(log.dir)) {
    if (entry.name !== "meta.json" && entry.name !== "events.ndjson") leftovers.push(entry.name);
  }
  assert.deepEqual(leftovers, []);
});

Deno.test("a running run whose CLI process is gone reads as crashed; a finished one keeps its status", async () => {
  await using _home = await stateHome();
  const gone = await deadPid();
  const running = newRunId();
  const finished = newRunId();
  const live = newRunId();
  await using a = await RunLog.create(init(running));
  await using b = await RunLog.create(init(finished));
  await using _c = await RunLog.create(init(live));
  await b.finish({ status: "succeeded", exitCode: 0, usage: null, error: null });
  for (const log of [a, b]) {
    const path = `${log.dir}/meta.json`;
    await Deno.writeTextFile(
      path,
      JSON.stringify({ ...JSON.parse(await Deno.readTextFile(path)), pid: gone }),
    );
  }
  assert.equal((await readRun(running))?.status, "crashed");
  assert.equal((await readRun(finished))?.status, "succeeded");
  assert.equal((await readRun(live))?.status, "running");
  const listed = Object.fromEntries((await listRuns()).map((r) => [r.id, r.status]));
  assert.deepEqual(listed, { [running]: "crashed", [finished]: "succeeded", [live]: "running" });
  assert.equal(
    (await readMetaFile(running)).status,
    "running",
    "reading must not rewrite the record",
  );
});

Deno.test("readRun() and listRuns() know nothing of runs that do not exist", async () => {
  await using _home = await stateHome();
  assert.equal(await readRun("no-such-run"), undefined);
  assert.deepEqual(await listRuns(), []);
});

Deno.test("listRuns() lists every run, newest first", async () => {
  await using _home = await stateHome();
  const older = newRunId(new Date("2030-01-01T00:00:00Z"));
  const newer = newRunId(new Date("2030-01-02T00:00:00Z"));
  await using _a = await RunLog.create(init(older));
  await using _b = await RunLog.create(init(newer));
  assert.deepEqual((await listRuns()).map((r) => r.id), [newer, older]);
});

Deno.test("readEvents() without follow returns every line written so far and ends", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  for (const message of [toolCall, toolResult, result]) await log.append(message);
  // Still running: without follow the reader does not wait for more.
  const lines = await Array.fromAsync(readEvents(id));
  assert.deepEqual(lines.map((l) => JSON.parse(l)), [toolCall, toolResult, result]);
});

Deno.test("readEvents() returns a long event whole, across read buffers", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  const long = agenticMessage({ type: "tool_result", tool_output: "é".repeat(100_000) });
  await log.append(toolCall);
  await log.append(long);
  await log.append(result);
  const lines = await Array.fromAsync(readEvents(id));
  assert.deepEqual(lines.map((l) => JSON.parse(l)), [toolCall, long, result]);
});

Deno.test("readEvents() with follow yields lines appended later and stops once the run has ended", async (t) => {
  await using _home = await stateHome();

  await t.step("written by the RunLog", async () => {
    const id = newRunId();
    await using log = await RunLog.create(init(id));
    await log.append(toolCall);
    const events = readEvents(id, { follow: true, pollMs: 10 });
    assert.deepEqual(JSON.parse((await events.next()).value as string), toolCall);
    const pending = events.next(); // waits: nothing new yet and the run is live
    await log.append(toolResult);
    assert.deepEqual(JSON.parse((await pending).value as string), toolResult);
    // The last event and the final status land together: the event must not be lost.
    await log.append(result);
    await log.finish({ status: "succeeded", exitCode: 0, usage: null, error: null });
    const rest = [];
    for await (const line of { [Symbol.asyncIterator]: () => events }) rest.push(JSON.parse(line));
    assert.deepEqual(rest, [result]);
  });

  await t.step("written by another writer through its own file handle", async () => {
    const id = newRunId();
    await using log = await RunLog.create(init(id));
    const events = readEvents(id, { follow: true, pollMs: 10 });
    const first = events.next();
    {
      using other = await Deno.open(`${log.dir}/events.ndjson`, { append: true });
      // Half a line first: the reader must not yield it until the rest arrives.
      const text = JSON.stringify(toolCall) + "\n";
      await other.write(new TextEncoder().encode(text.slice(0, 20)));
      await other.write(new TextEncoder().encode(text.slice(20)));
    }
    assert.deepEqual(JSON.parse((await first).value as string), toolCall);
    await log.finish({ status: "failed", exitCode: 1, usage: null, error: "x" });
    assert.equal((await events.next()).done, true);
  });
});

Deno.test("readEvents() with follow stops at the end of a crashed run's events", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  await log.append(toolCall);
  const path = `${log.dir}/meta.json`;
  await Deno.writeTextFile(
    path,
    JSON.stringify({ ...JSON.parse(await Deno.readTextFile(path)), pid: await deadPid() }),
  );
  const lines = await Array.fromAsync(readEvents(id, { follow: true, pollMs: 10 }));
  assert.deepEqual(lines.map((l) => JSON.parse(l)), [toolCall]);
});

Deno.test("readEvents() with follow stops when its signal aborts", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  await log.append(toolCall);
  const controller = new AbortController();
  const events = readEvents(id, { follow: true, signal: controller.signal, pollMs: 10 });
  assert.equal((await events.next()).done, false);
  const pending = events.next();
  controller.abort();
  assert.equal((await pending).done, true);
});

Deno.test("secrets registered in the Redactor never reach events.ndjson or meta.json", async () => {
  await using _home = await stateHome();
  const key = `sk-test-${crypto.randomUUID()}`;
  const token = `sbx_"quoted\\${crypto.randomUUID()}`; // needs JSON escaping
  const redactor = new Redactor();
  redactor.add(key);
  redactor.add(token);
  const id = newRunId();
  await using log = await RunLog.create(init(id), redactor);
  await log.append(
    agenticMessage({
      type: "tool_call",
      tool_name: "execute",
      tool_input: { command: `curl -H "x-api-key: ${key}"`, token },
    }),
  );
  await log.append(
    agenticMessage({ type: "tool_result", tool_output: `env: KEY=${key} TOKEN=${token}` }),
  );
  await log.append(
    agenticMessage({ type: "result", content: `the key is ${key}`, is_error: true }),
  );
  await log.finish({
    status: "failed",
    exitCode: 1,
    usage: null,
    error: `upstream rejected ${key} and ${token}`,
  });
  const dir = log.dir;
  for (const file of ["events.ndjson", "meta.json"]) {
    const text = await Deno.readTextFile(`${dir}/${file}`);
    assert.ok(!text.includes(key), `the key is in ${file}`);
    assert.ok(
      !text.includes(JSON.stringify(token).slice(1, -1)) && !text.includes(token),
      `the token is in ${file}`,
    );
    assert.ok(text.includes(REDACTED), `${file} shows no redaction marker`);
  }
  const events = (await eventLines(id)).map((l) => JSON.parse(l) as AgenticMessage);
  assert.equal(events.length, 3, "redaction broke the JSON lines");
  assert.equal(events[1].tool_output, `env: KEY=${REDACTED} TOKEN=${REDACTED}`);
  assert.equal((await readMetaFile(id)).error, `upstream rejected ${REDACTED} and ${REDACTED}`);
});

/** The files of a run's directory, by name. */
async function filesOf(dir: string): Promise<string[]> {
  const names = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names.sort();
}

/** A store error from `readEvents`, after every line it yields. */
async function readUntilError(id: string): Promise<{ lines: string[]; error: unknown }> {
  const lines: string[] = [];
  try {
    for await (const line of readEvents(id)) lines.push(line);
  } catch (error) {
    return { lines, error };
  }
  return { lines, error: undefined };
}

Deno.test("a full disk: appends keep whole lines and stop, meta.json still records the outcome, and readers say the record is incomplete", async () => {
  await using home = await stateHome();
  await using disk = await mountTmpfs(`${home.path}/sandbox`, 256 * 1024);
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  await log.append(toolCall);
  // 16 KiB left: the next line, bigger, is written in part before the disk is full.
  await Deno.truncate(`${disk.path}/filler`, await fillDisk(disk.path) - 16 * 1024);
  const long = agenticMessage({ type: "tool_result", tool_output: "x".repeat(100_000) });
  await log.append(long); // does not raise
  assert.match(log.storeError ?? "", /cannot write .*events\.ndjson: No space left on device/);
  await Deno.remove(`${disk.path}/filler`);
  await log.append(result); // space again, but nothing after a gap
  await fillDisk(disk.path);
  await log.finish({
    status: "succeeded",
    exitCode: 0,
    usage: null,
    error: null,
    extra: { branch: "b", big: "y".repeat(50_000) },
  });

  const text = await Deno.readTextFile(`${log.dir}/events.ndjson`);
  assert.equal(
    text,
    JSON.stringify(toolCall) + "\n",
    "the log is not cut back to its last whole line",
  );
  const meta = await readMetaFile(id);
  assert.equal(meta.status, "succeeded");
  assert.equal(meta.exitCode, EXIT.storeFailed);
  assert.match(meta.storeError ?? "", /events\.ndjson: No space left on device/);
  assert.equal(meta.extra?.branch, "b");
  assert.equal(meta.extra?.big, undefined, "a long extra value does not fit the reserve");
  assert.deepEqual(
    await filesOf(log.dir),
    ["events.ndjson", "meta.json"],
    "no temporary file is left",
  );
  assert.equal(log.storeFailure()?.code, "store_failed");

  const read = await readUntilError(id);
  assert.deepEqual(read.lines.map((l) => JSON.parse(l)), [toolCall]);
  assert.ok(
    read.error instanceof SandboxError && read.error.code === "store_failed",
    String(read.error),
  );
  assert.match(read.error.message, /is incomplete: cannot write .*events\.ndjson/);
});

Deno.test("a disk that fills at the end: the meta.json write fails, the reserve takes it, and the run no longer reads as running", async () => {
  await using home = await stateHome();
  await using disk = await mountTmpfs(`${home.path}/sandbox`, 256 * 1024);
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  for (const message of [toolCall, toolResult, result]) await log.append(message);
  await fillDisk(disk.path);
  await log.finish({ status: "failed", exitCode: 1, usage: null, error: "the agent failed" });
  const meta = await readMetaFile(id);
  assert.deepEqual(
    [meta.status, meta.exitCode, meta.error],
    ["failed", EXIT.storeFailed, "the agent failed"],
  );
  assert.match(meta.storeError ?? "", /cannot write .*meta\.json: No space left on device/);
  assert.deepEqual(await filesOf(log.dir), ["events.ndjson", "meta.json"]);
  const read = await readUntilError(id);
  assert.equal(read.lines.length, 3);
  assert.ok(read.error instanceof SandboxError && read.error.code === "store_failed");
});

Deno.test("with room to spare, finish() leaves no reserve and readers raise nothing", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  await log.append(result);
  await log.finish({ status: "succeeded", exitCode: 0, usage: null, error: null });
  assert.equal(log.storeError, undefined);
  assert.equal((await readMetaFile(id)).storeError, null);
  assert.deepEqual(await filesOf(log.dir), ["events.ndjson", "meta.json"]);
  assert.deepEqual(await readUntilError(id), { lines: [JSON.stringify(result)], error: undefined });
});

Deno.test("RunLog.create() on a full disk raises store_failed and leaves nothing of the run", async () => {
  await using home = await stateHome();
  await using disk = await mountTmpfs(`${home.path}/sandbox`, 256 * 1024);
  await Deno.mkdir(`${disk.path}/runs`);
  await fillDisk(disk.path);
  const id = newRunId();
  const error = await RunLog.create(init(id)).then(() => undefined, (e) => e);
  assert.ok(error instanceof SandboxError && error.code === "store_failed", String(error));
  assert.match(error.message, /^Cannot record the run in .*: No space left on device/);
  assert.deepEqual(await filesOf(`${disk.path}/runs`), []);
});

Deno.test("readEvents() reports an ended run's torn last line instead of dropping it; a live run's is just not read yet", async () => {
  await using _home = await stateHome();
  const id = newRunId();
  await using log = await RunLog.create(init(id));
  await log.append(toolCall);
  const torn = JSON.stringify(result).slice(0, 25);
  {
    using file = await Deno.open(`${log.dir}/events.ndjson`, { append: true });
    await file.write(new TextEncoder().encode(torn));
  }
  assert.deepEqual(await readUntilError(id), {
    lines: [JSON.stringify(toolCall)],
    error: undefined,
  });
  await log.finish({ status: "succeeded", exitCode: 0, usage: null, error: null });
  for (const follow of [false, true]) {
    const lines: string[] = [];
    let error: unknown;
    try {
      for await (const line of readEvents(id, { follow, pollMs: 10 })) lines.push(line);
    } catch (e) {
      error = e;
    }
    assert.deepEqual(lines, [JSON.stringify(toolCall)]);
    assert.ok(
      error instanceof SandboxError && error.code === "store_failed",
      `follow ${follow}: ${error}`,
    );
    assert.match(
      error.message,
      new RegExp(
        `^The log of run "${id}" ends in a torn line \\(25 characters without their newline\\)`,
      ),
    );
  }
});
