/**
 * `attachSpare()` against a scripted provider: the connector's "connected" line is what makes a
 * worker of it (the job goes to it only then), "no worker" (exit 75) is an answer rather than an
 * error, and any other failure of the connector is one.
 */
import assert from "node:assert/strict";
import { attachSpare, SANDBOX_ATTACH, SPARE_SOCKET } from "../../lib/sandbox/spare.ts";
import { SandboxError } from "../../lib/errors.ts";
import { parseJob } from "../../worker/job.ts";
import type { ExecOptions, ExecStream, ExecStreamOutcome, SandboxProvider } from "../../lib/sandbox/provider.ts";

interface Script {
  connects: boolean;
  /** Lines printed once the job arrived. */
  lines: string[];
  exitCode: number;
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
