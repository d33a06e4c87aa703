/**
 * `sandbox snapshot`: prepare the development sandbox with `exec`, snapshot it, run many. Every run
 * starts from the snapshot (its /workspace and home), none from what an earlier run changed; a
 * dropped snapshot no longer applies.
 */
import assert from "node:assert/strict";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, docker, dockerTest, explain } from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";

console.error("e2e: snapshot tests starting");

const LOOK =
  "cat /workspace/deps/marker ~/.cache-marker 2>&1; echo changed-by-run >/workspace/deps/marker";

Deno.test({
  name:
    "snapshot: runs start from the prepared development sandbox's workspace and home, each afresh; --drop goes back to the image",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "e2e-snap",
      llmUrl: llm.baseUrl,
      keyEnv: "E2E_SNAP_KEY",
      prompt: "Look\n",
    });
    const runLook = async () => {
      llm.script.push(toolCall("execute", { command: LOOK }), text("Done"));
      const result = await fixture.cli([
        "run",
        "agentic",
        "--prompt-file",
        fixture.promptFile,
        "--profile",
        fixture.profile,
      ]);
      assert.equal(result.exitCode, 0, explain(result));
      return llm.lastToolOutput();
    };

    const prepared = await fixture.cli([
      "exec",
      "-p",
      fixture.profile,
      "--",
      "sh",
      "-c",
      "mkdir -p /workspace/deps && echo prepared >/workspace/deps/marker && echo home-cache >~/.cache-marker",
    ]);
    assert.equal(prepared.exitCode, 0, explain(prepared));
    let tag = "";
    await t.step("snapshot builds an image and says the runs start from it", async () => {
      const snap = await fixture.cli(["snapshot", "-p", fixture.profile, "--json"]);
      assert.equal(snap.exitCode, 0, explain(snap));
      tag = JSON.parse(snap.stdout).tag;
      assert.match(tag, new RegExp(`^sandbox-snapshot:${fixture.profile}-[0-9a-f]{8}$`));
      assert.ok(await docker("image", "inspect", "--format", "{{.Id}}", tag));
    });
    await t.step("a run sees the prepared workspace and home", async () => {
      assert.match(await runLook(), /^prepared\nhome-cache\n/);
    });
    await t.step(
      "the next run sees them as prepared, not as the run before left them",
      async () => {
        assert.match(await runLook(), /^prepared\nhome-cache\n/);
      },
    );
    await t.step(
      "--drop: runs start from the image as built again, and the snapshot image goes",
      async () => {
        const drop = await fixture.cli(["snapshot", "--drop", "-p", fixture.profile]);
        assert.equal(drop.exitCode, 0, explain(drop));
        assert.match(await runLook(), /No such file or directory/);
        assert.notEqual(
          (await new Deno.Command("docker", {
            args: ["image", "inspect", tag],
            stdout: "null",
            stderr: "null",
          }).output()).code,
          0,
        );
      },
    );
  },
});
