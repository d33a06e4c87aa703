/**
 * The kernel's Landlock ABI (lib/sandbox/local/landlock.ts `landlockAbi`) is asked in-process
 * through libc; a process without FFI permission (a library user's `deno run`) asks Perl instead.
 * Both must give the same answer.
 */
import assert from "node:assert/strict";
import { landlockAbi } from "../../lib/sandbox/local/landlock.ts";
import { run } from "../../lib/process.ts";
import { explain, ROOT } from "../_helpers.ts";

Deno.test("the Landlock ABI asked through libc is the one Perl is told, where FFI is not allowed", async () => {
  const inProcess = await landlockAbi();
  const script = await Deno.makeTempFile({ suffix: ".ts" });
  try {
    await Deno.writeTextFile(
      script,
      `import { landlockAbi } from ${JSON.stringify(`${ROOT}/lib/sandbox/local/landlock.ts`)};\n` +
        "console.log(JSON.stringify(await landlockAbi()));\n",
    );
    const withoutFfi = await run([
      Deno.execPath(),
      "run",
      "--quiet",
      `--config=${ROOT}/deno.json`,
      "--allow-read",
      "--allow-run",
      "--allow-env",
      script,
    ], { timeoutMs: 60_000 });
    assert.equal(withoutFfi.exitCode, 0, explain(withoutFfi));
    assert.deepEqual(JSON.parse(withoutFfi.stdout), inProcess);
  } finally {
    await Deno.remove(script);
  }
});
