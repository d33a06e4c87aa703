/**
 * The codes of the error catalogue (docs/errors.md) that callers branch on: an engine's typed
 * failure becomes the code naming it, a missing file is `file_not_found` (a user's mistake, exit 2),
 * and a passed resource limit carries its limit and the use that passed it.
 */
import assert from "node:assert/strict";
import {
  EXIT,
  exitCodeFor,
  fileNotFound,
  ResourceLimitError,
  SandboxError,
} from "../../lib/errors.ts";
import { EngineError, sandboxErrorOf } from "../../lib/sandbox/engine.ts";
import { NO_SUCH_FILE_EXIT, readFileArgv } from "../../lib/sandbox/provider.ts";
import { run } from "../../lib/process.ts";

Deno.test("an exec in a stopped container is invalid_state; in a missing one container_not_found; a conflict keeps the caller's code", () => {
  const as = (kind: "not-running" | "not-found" | "conflict") =>
    sandboxErrorOf(
      new EngineError(kind, "exec", "Container abc is not running"),
      "exec_failed",
      "x",
    );
  const stopped = as("not-running");
  assert.ok(stopped instanceof SandboxError);
  assert.equal(stopped.code, "invalid_state");
  assert.match(stopped.message, /x: Container abc is not running/);
  assert.equal((as("not-found") as SandboxError).code, "container_not_found");
  assert.equal((as("conflict") as SandboxError).code, "exec_failed");
});

Deno.test("file_not_found names the path and exits 2, as a user's mistake does; invalid_state exits 125", () => {
  const missing = fileNotFound("/workspace/absent.txt", 'sandbox "s"');
  assert.equal(missing.code, "file_not_found");
  assert.equal(missing.message, 'No file "/workspace/absent.txt" in sandbox "s"');
  assert.equal(exitCodeFor(missing), EXIT.usage);
  assert.equal(exitCodeFor(new SandboxError("invalid_state", "x")), EXIT.infrastructure);
});

Deno.test("a passed resource limit carries the limit and the actual use in bytes, under its own code", () => {
  const disk = new ResourceLimitError({ resource: "disk", limit: 1024, actual: 2048 }, "disk");
  assert.equal(disk.code, "disk_limit");
  assert.deepEqual([disk.limit, disk.actual], [1024, 2048]);
  const memory = new ResourceLimitError({ resource: "memory", limit: 10, actual: 11 }, "memory");
  assert.equal(memory.code, "out_of_memory");
  assert.equal(exitCodeFor(memory), 137);
});

Deno.test("the providers' read command exits NO_SUCH_FILE_EXIT for a missing path and prints an existing file's bytes", async () => {
  const dir = await Deno.makeTempDir({ prefix: "sandbox-unit-read-" });
  try {
    const missing = await run(readFileArgv(`${dir}/absent`));
    assert.equal(missing.exitCode, NO_SUCH_FILE_EXIT);
    await Deno.writeTextFile(`${dir}/present`, "bytes\n");
    const present = await run(readFileArgv(`${dir}/present`));
    assert.equal(present.exitCode, 0);
    assert.equal(present.stdout, "bytes\n");
    // A file that exists but cannot be read is not a missing one.
    await Deno.chmod(`${dir}/present`, 0o000);
    if (Deno.uid() !== 0) {
      assert.notEqual((await run(readFileArgv(`${dir}/present`))).exitCode, NO_SUCH_FILE_EXIT);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
