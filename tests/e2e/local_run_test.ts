/**
 * A replayed agentic run (examples/hello) in sandbox mode local, from the CLI: the agent works in
 * a bubblewrap sandbox with no Docker, its model reached through the relay and the host's proxies,
 * and `--repo` brings its commit back as a branch of the user's repository.
 */
import { git } from "../_git.ts";
import assert from "node:assert/strict";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { explain, ROOT, runCli, tempDir, uniqueProfile } from "../_helpers.ts";
import { assertLocal, localTest } from "../_local.ts";

Deno.test({
  name: "a replayed run in mode local streams its events and brings its branch back",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-");
    const profile = uniqueProfile("e2e-local");
    const config = `${dir.path}/sandbox.yaml`;
    await Deno.writeTextFile(config, `profiles:\n  ${profile}:\n    sandbox: {mode: local}\n`);
    await Deno.copyFile(`${ROOT}/examples/hello/prompt.txt`, `${dir.path}/prompt.txt`);
    await Deno.copyFile(`${ROOT}/examples/hello/recording.json`, `${dir.path}/recording.json`);
    const repo = `${dir.path}/repo`;
    await Deno.mkdir(repo);
    await git(repo, "init", "-q");
    await git(
      repo,
      "-c",
      "user.name=t",
      "-c",
      "user.email=t@t.invalid",
      "commit",
      "-q",
      "--allow-empty",
      "-m",
      "init",
    );
    const result = await runCli([
      "run",
      "agentic",
      "-p",
      profile,
      "--prompt-file",
      `${dir.path}/prompt.txt`,
      "--model",
      `replay:${dir.path}/recording.json`,
      "--format",
      "ndjson",
      "--repo",
      repo,
    ], { config, env: { XDG_STATE_HOME: `${dir.path}/state` } });
    assert.equal(result.exitCode, 0, explain(result));
    const messages = result.stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
    const ran = messages.find((m) => m.type === "tool_result" && m.tool_name === "execute");
    assert.match(String(ran?.tool_output), /Hello from the sandbox/);
    assert.equal(messages.filter((m) => m.type === "result").length, 1);
    const branch = /branch (sandbox\/\S+) in /.exec(result.stderr)?.[1];
    assert.ok(branch, explain(result));
    assert.match(await git(repo, "show", `${branch}:greet.sh`), /Hello from the sandbox/);
    const left = await Array.fromAsync(Deno.readDir(`${dir.path}/state/sandbox/local`));
    assert.deepEqual(left.map((e) => e.name), [], "the sandbox's directory is gone");
  },
});
