/**
 * The bundled CLI is self-contained: built by `deno task bundle`, copied alone into an empty
 * directory, it runs, and runs an offline agent (the shipped replay recording) in a sandbox.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { assertDocker, dockerTest, explain, ROOT, tempDir } from "../_helpers.ts";

Deno.test({
  name: "the bundled CLI runs from an empty directory and completes an offline replayed run",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const built = await run(["bash", `${ROOT}/scripts/bundle.sh`]);
    assert.equal(built.exitCode, 0, explain(built));
    await using empty = await tempDir("sandbox-bundle-");
    await Deno.copyFile(`${ROOT}/dist/sandbox.js`, `${empty.path}/sandbox.js`);
    await Deno.copyFile(`${ROOT}/examples/hello/prompt.txt`, `${empty.path}/prompt.txt`);
    await Deno.copyFile(`${ROOT}/examples/hello/recording.json`, `${empty.path}/recording.json`);
    const sandbox = (...args: string[]) =>
      run([Deno.execPath(), "run", "--allow-all", "--no-config", "sandbox.js", ...args], {
        cwd: empty.path,
        env: { XDG_STATE_HOME: `${empty.path}/state` },
      });

    const version = await sandbox("--version");
    assert.equal(version.exitCode, 0, explain(version));
    assert.match(version.stdout.trim(), /^\d+\.\d+\.\d+$/);

    const result = await sandbox("run", "agentic", "--prompt-file", "prompt.txt", "--model", "replay:recording.json");
    assert.equal(result.exitCode, 0, explain(result));
    const messages = result.stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
    assert.equal(messages.at(-1)?.type, "usage");
    assert.equal(messages.filter((m) => m.type === "result").length, 1);
    const ran = messages.find((m) => m.type === "tool_result" && m.tool_name === "execute");
    assert.match(ran?.tool_output ?? "", /Hello from the sandbox, sandbox!/);
  },
});
