/**
 * Attack: silence the disk watch, then fill the workspace past `resources.disk` (issue 24, item 4).
 * The agent sends SIGSTOP to every process of the sandbox it can (all but its own command's chain),
 * SIGKILL to every other one, then writes 200 MiB into a workspace limited to 64 MiB.
 *
 * What must hold: the watch is the container's init, which nothing inside can stop, kill or speak
 * for; the write is stopped (exit 125, the disk limit named), from `sandbox exec` and from a run.
 * The twin: the same stops and kills, then a write under the limit, run to their end.
 */
import assert from "node:assert/strict";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";

console.error("security: disk watch attack tests starting");

/** Stop or kill every process but this command's own chain (init, pid 1, is never delivered either). */
const SILENCE = [
  `chain=" $$ "; p=$$; while [ "$p" -gt 1 ]; do p=$(awk '{print $4}' /proc/$p/stat); chain="$chain$p "; done`,
  `for d in /proc/[0-9]*; do pid=\${d#/proc/}; case "$chain" in *" $pid "*) continue;; esac; kill -STOP $pid 2>/dev/null; done`,
  `kill -STOP 1 2>/dev/null; kill -KILL 1 2>/dev/null; echo SILENCED`,
].join("; ");

const write = (mib: number) =>
  `dd if=/dev/zero of=/workspace/fill bs=1M count=${mib} 2>/dev/null; sleep 4; echo WROTE`;

Deno.test({
  name:
    "an exec that stops and kills what it can, then writes past resources.disk, is stopped; under the limit it runs to its end",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-diskx",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_DISKX_KEY",
      prompt: "Fill\n",
      sandboxYaml: "{resources: {disk: 64m}}",
    });
    await t.step("twin: silenced, then 16 MiB: the command ends, exit 0", async () => {
      const result = await fixture.cli([
        "exec",
        "-p",
        fixture.profile,
        "--",
        "sh",
        "-c",
        `${SILENCE}; ${write(16)}; rm -f /workspace/fill`,
      ]);
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(result.stdout, /SILENCED\nWROTE/);
    });
    await t.step("silenced, then 200 MiB: stopped with exit 125, the limit named", async () => {
      const result = await fixture.cli([
        "exec",
        "-p",
        fixture.profile,
        "--",
        "sh",
        "-c",
        `${SILENCE}; ${write(200)}`,
      ]);
      assert.equal(result.exitCode, 125, explain(result));
      assert.match(result.stderr, /exceeded resources\.disk/, explain(result));
      assert.doesNotMatch(result.stdout, /WROTE/);
    });
  },
});

Deno.test({
  name:
    "a run whose agent stops and kills what it can, then writes past resources.disk, is stopped (exit 125)",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: `${SILENCE}; ${write(200)}` }),
      text("Done"),
    ]);
    await using fixture = await RunFixture.make({
      prefix: "sec-diskr",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_DISKR_KEY",
      prompt: "Fill\n",
      sandboxYaml: "{resources: {disk: 64m}}",
    });
    const result = await fixture.cli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
    ]);
    assert.equal(result.exitCode, 125, explain(result));
    assert.match(result.stderr, /exceeded resources\.disk/, explain(result));
  },
});
