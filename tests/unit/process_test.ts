import assert from "node:assert/strict";
import { ProgramNotFoundError, run, spawn } from "../../lib/process.ts";

Deno.test("run() collects stdout and stderr read concurrently, even when both are large", async () => {
  // 1 MiB on each stream: a reader that drained one before the other would deadlock on the pipe.
  const result = await run([
    "sh",
    "-c",
    "head -c 1048576 /dev/zero | tr '\\0' o; head -c 1048576 /dev/zero | tr '\\0' e >&2; exit 3",
  ]);
  assert.equal(result.exitCode, 3);
  assert.equal(result.stdout.length, 1_048_576);
  assert.equal(result.stderr.length, 1_048_576);
  assert.ok(result.stderrTail.length <= 8_192);
});

Deno.test("run() passes argv through without a shell", async () => {
  const result = await run(["printf", "%s|", "a b", "$HOME", "; rm -rf /", "'q'"]);
  assert.equal(result.stdout, "a b|$HOME|; rm -rf /|'q'|");
});

Deno.test("run() feeds stdin from a string and from a stream", async () => {
  assert.equal((await run(["cat"], { stdin: "hello" })).stdout, "hello");
  const stream = ReadableStream.from([
    new TextEncoder().encode("a"),
    new TextEncoder().encode("b"),
  ]);
  assert.equal((await run(["cat"], { stdin: stream })).stdout, "ab");
});

Deno.test("run() with clearEnv leaks no host variable into the child", async () => {
  Deno.env.set("SANDBOX_TEST_LEAK", "leaked");
  try {
    const result = await run(["env"], { clearEnv: true, env: { ONLY: "this" } });
    assert.doesNotMatch(result.stdout, /SANDBOX_TEST_LEAK/);
    assert.match(result.stdout, /ONLY=this/);
  } finally {
    Deno.env.delete("SANDBOX_TEST_LEAK");
  }
});

Deno.test("a timeout sends SIGTERM, then SIGKILL to a child that ignores it", async () => {
  const child = spawn(["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"], {
    timeoutMs: 300,
  });
  const lines = child.lines();
  assert.equal((await lines.next()).value, "ready");
  child.kill(200);
  const outcome = await child.finished;
  await lines.return(undefined);
  assert.equal(outcome.signal, "SIGKILL");
  assert.equal(outcome.exitCode, 137);
});

Deno.test("timeoutMs ends a long command and marks it timed out", async () => {
  const result = await run(["sleep", "30"], { timeoutMs: 100 });
  assert.equal(result.timedOut, true);
  assert.equal(result.aborted, false);
  assert.ok(result.durationMs < 5_000);
});

Deno.test("an AbortSignal ends the child and marks it aborted, also when already aborted", async () => {
  const controller = new AbortController();
  const child = spawn(["sh", "-c", "echo started; sleep 30"], { signal: controller.signal });
  const lines = child.lines();
  assert.equal((await lines.next()).value, "started");
  controller.abort();
  const outcome = await child.finished;
  await lines.return(undefined);
  assert.equal(outcome.aborted, true);
  assert.equal(outcome.signal, "SIGTERM");

  const already = await run(["sleep", "30"], { signal: AbortSignal.abort() });
  assert.equal(already.aborted, true);
});

Deno.test("lines() yields each line as soon as it is written", async () => {
  // The child waits for our reply on stdin before printing the second line: the first line must
  // arrive while the child is still running.
  const reply = new TransformStream<Uint8Array, Uint8Array>();
  const child = spawn(["sh", "-c", 'echo one; read answer; echo "two $answer"'], {
    stdin: reply.readable,
  });
  const lines = child.lines();
  assert.equal((await lines.next()).value, "one");
  const writer = reply.writable.getWriter();
  await writer.write(new TextEncoder().encode("yes\n"));
  await writer.close();
  assert.equal((await lines.next()).value, "two yes");
  assert.equal((await lines.next()).done, true);
  assert.equal((await child.finished).exitCode, 0);
});

Deno.test("stderr lines reach the callback and the tail is kept for errors", async () => {
  const seen: string[] = [];
  const result = await run(["sh", "-c", "for i in 1 2 3; do echo err$i >&2; done; exit 1"], {
    onStderrLine: (line) => seen.push(line),
  });
  assert.deepEqual(seen, ["err1", "err2", "err3"]);
  assert.equal(result.stderrTail, "err1\nerr2\nerr3");
});

Deno.test("a missing program raises ProgramNotFoundError naming it", () => {
  assert.throws(() => spawn(["definitely-not-a-program-xyz"]), (error: unknown) => {
    assert.ok(error instanceof ProgramNotFoundError);
    assert.match(error.message, /"definitely-not-a-program-xyz"/);
    return true;
  });
});
