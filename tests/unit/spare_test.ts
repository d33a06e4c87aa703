/**
 * `attachSpare()` against a scripted provider: the connector's "connected" line is what makes a
 * worker of it (the job goes to it only then), "no worker" (exit 75) is an answer rather than an
 * error, and any other failure of the connector is one. `attachSpareOn()`, the connector run on a
 * waiting wrapper (real Unix sockets for its connections): passed on to the next command once it
 * saw the connector to its end, ended otherwise. The real wrapper under a real run:
 * tests/e2e/warm_run_exec_test.ts.
 */
import assert from "node:assert/strict";
import { attachSpare, attachSpareOn, SANDBOX_ATTACH, SPARE_SOCKET } from "../../lib/sandbox/spare.ts";
import type { WaitingConnections } from "../../lib/sandbox/waiting_exec.ts";
import { connectedWrapper } from "../_waiting_wrapper.ts";
import { readLine } from "../../lib/conn.ts";
import { tempDir } from "../_helpers.ts";
import { SandboxError } from "../../lib/errors.ts";
import { parseJob } from "../../worker/job.ts";
import type { ExecOptions, ExecStream, ExecStreamOutcome, SandboxProvider } from "../../lib/sandbox/provider.ts";

interface Script {
  connects: boolean;
  /** Lines printed once the job arrived. */
  lines: string[];
  exitCode: number;
  /** Never over after its lines (stopped by the agent, say). */
  hangs?: boolean;
}

/** Just enough of a provider: execStream runs the scripted connector, recording its argv and input. */
function connectorProvider(script: Script) {
  const calls: { argv: readonly string[]; input: string[] }[] = [];
  const provider = {
    execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
      const call = { argv, input: [] as string[] };
      calls.push(call);
      let settle!: (outcome: ExecStreamOutcome) => void;
      const outcome = new Promise<ExecStreamOutcome>((resolve) => settle = resolve);
      const reader = (options.stdin as ReadableStream<Uint8Array>).pipeThrough(new TextDecoderStream()).getReader();
      if (script.connects) queueMicrotask(() => options.onStderrLine?.("sandbox-attach: connected"));
      return {
        outcome,
        [Symbol.asyncIterator]: async function* () {
          try {
            if (script.connects) {
              // Like the worker: nothing comes back before the job.
              const { value } = await reader.read();
              call.input.push(value ?? "");
              yield* script.lines;
              if (script.hangs) await new Promise(() => {});
            }
          } finally {
            settle({ exitCode: script.exitCode, durationMs: 1, timedOut: false, oomKilled: false, stderrTail: "" });
          }
        },
      };
    },
  } as unknown as SandboxProvider;
  return { provider, calls };
}

const job = { mode: "agentic" as const, prompt: "hello", env: { SANDBOX_LLM_TOKEN: "tok" }, cwd: "/w" };

Deno.test("attachSpare() returns the waiting worker once the connector reached it, and the job goes to it", async () => {
  const { provider, calls } = connectorProvider({ connects: true, lines: ['{"type":"result"}'], exitCode: 0 });
  const worker = await attachSpare(provider);
  assert.ok(worker, "no worker");
  assert.deepEqual(calls[0].argv, [SANDBOX_ATTACH, SPARE_SOCKET], "the connector, with nothing of the run on its command line");
  assert.equal(calls[0].input.length, 0, "nothing was sent before the job");
  worker.send(job);
  const lines = await Array.fromAsync(worker.stream);
  worker.close();
  assert.deepEqual(lines, ['{"type":"result"}']);
  assert.deepEqual(parseJob(calls[0].input[0].trim()), { ...job, instructions: undefined, model: undefined, maxTurns: undefined, schema: undefined });
  assert.equal((await worker.stream.outcome).exitCode, 0);
});

Deno.test("attachSpare() says there is no spare when the connector found none (exit 75)", async () => {
  const { provider } = connectorProvider({ connects: false, lines: [], exitCode: 75 });
  assert.equal(await attachSpare(provider), undefined);
});

Deno.test("attachSpare() raises when the connector fails otherwise", async () => {
  const { provider } = connectorProvider({ connects: false, lines: [], exitCode: 126 });
  await assert.rejects(attachSpare(provider), (e: SandboxError) => e instanceof SandboxError && e.code === "exec_failed" && /code 126/.test(e.message));
});

/** A provider whose execStreamOn runs the scripted connector, and marks the wrapper as a real one would. */
function onWrapperProvider(script: Script, stopped = false) {
  const { provider, calls } = connectorProvider(script);
  return {
    calls,
    provider: {
      execStreamOn(wrapper: WaitingConnections, argv: readonly string[], options: ExecOptions = {}): ExecStream {
        const stream = provider.execStream(argv, options);
        // The wrapper says the exit code unless the command was stopped (lib/sandbox/waiting_exec.ts).
        stream.outcome.then(() => wrapper.reported = !stopped);
        return stream;
      },
    },
  };
}

Deno.test("attachSpareOn() runs the connector on the wrapper, then passes the wrapper on: recorded again, and told `again`", async () => {
  await using dir = await tempDir();
  using wrapper = await connectedWrapper(dir.path);
  const { conns, wrapperControl } = wrapper;
  const { provider, calls } = onWrapperProvider({ connects: true, lines: ['{"type":"result"}'], exitCode: 0 });
  const { worker, passedOn } = await attachSpareOn(provider, conns);
  assert.ok(worker, "no worker");
  assert.deepEqual(calls[0].argv, [SANDBOX_ATTACH, SPARE_SOCKET]);
  worker.send(job);
  assert.deepEqual(await Array.fromAsync(worker.stream), ['{"type":"result"}']);
  await passedOn();
  assert.deepEqual(JSON.parse(await Deno.readTextFile(`${conns.mountSource}.waiting-exec.json`)), conns.record);
  assert.equal(new TextDecoder().decode((await readLine(wrapperControl, 64, 1_000))!), "again\n");
});

Deno.test("attachSpareOn() with no spare (exit 75) passes the wrapper on all the same", async () => {
  await using dir = await tempDir();
  using wrapper = await connectedWrapper(dir.path);
  const { conns, wrapperControl } = wrapper;
  const { provider } = onWrapperProvider({ connects: false, lines: [], exitCode: 75 });
  const { worker, passedOn } = await attachSpareOn(provider, conns);
  assert.equal(worker, undefined);
  await passedOn();
  assert.equal(new TextDecoder().decode((await readLine(wrapperControl, 64, 1_000))!), "again\n");
});

Deno.test("attachSpareOn() ends a wrapper whose connector was stopped, or failed: never recorded, its directory removed, no `again`", async () => {
  const cases: [Script, boolean][] = [
    [{ connects: true, lines: [], exitCode: 137 }, true],
    [{ connects: false, lines: [], exitCode: 126 }, false],
  ];
  for (const [script, stopped] of cases) {
    await using dir = await tempDir();
    using wrapper = await connectedWrapper(dir.path);
    const { conns, wrapperControl } = wrapper;
    const { provider } = onWrapperProvider(script, stopped);
    const attaching = attachSpareOn(provider, conns);
    if (script.exitCode === 126) {
      await assert.rejects(attaching, (e: SandboxError) => e instanceof SandboxError && e.code === "exec_failed");
    } else {
      const { worker, passedOn } = await attaching;
      worker!.send(job);
      await Array.fromAsync(worker!.stream);
      await passedOn();
    }
    await assert.rejects(Deno.stat(`${conns.mountSource}.waiting-exec.json`), Deno.errors.NotFound);
    await assert.rejects(Deno.stat(conns.hostDir), Deno.errors.NotFound);
    assert.equal(await readLine(wrapperControl, 64, 1_000), null, "the wrapper was told to go on");
  }
});

Deno.test("attachSpareOn() lets a connector that is never over go within its bound: the wrapper ended, not passed on", async () => {
  await using dir = await tempDir();
  using wrapper = await connectedWrapper(dir.path);
  const { conns, wrapperControl } = wrapper;
  const { provider } = onWrapperProvider({ connects: true, lines: [], exitCode: 0, hangs: true });
  const { worker, passedOn } = await attachSpareOn(provider, conns, { handBackWithinMs: 50 });
  assert.ok(worker, "no worker");
  worker.send(job);
  const started = performance.now();
  await passedOn();
  assert.ok(performance.now() - started < 2_000, "the run's end waited for the connector");
  await assert.rejects(Deno.stat(`${conns.mountSource}.waiting-exec.json`), Deno.errors.NotFound);
  assert.equal(await readLine(wrapperControl, 64, 1_000), null, "the wrapper was told to go on");
});
