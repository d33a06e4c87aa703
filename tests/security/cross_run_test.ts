/**
 * Attack: spy on a later run from an earlier one (issue 9, item 4). Run 1's agent, on repository
 * A, leaves a note in the workspace and starts a spy that copies every `SANDBOX_LLM_TOKEN` it can
 * read from `/proc/*\/environ` into the workspace. Then run 2 on the same repository, and run 3 on
 * repository B, look for the spy, its catch and the note.
 *
 * What must hold: run 2 shares A's container and workspace (the note is there: the positive twin),
 * but the spy is gone and never saw run 2's token; run 3 is in another container, where nothing of
 * A exists. Tokens come from the agents themselves (each prints its own), as the fake LLM receives
 * them in the next request.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";

console.error("security: cross-run tests starting");

const SPY = [
  "echo A-NOTES-SECRET >/workspace/a-notes.txt",
  `setsid -f sh -c 'while :; do for f in /proc/[0-9]*/environ; do tr "\\0" "\\n" <"$f" 2>/dev/null | grep "^SANDBOX_LLM_TOKEN=" >>/workspace/spy.log; done; sleep 0.2; done' </dev/null >/dev/null 2>&1`,
  "sleep 1",
  "echo OWN=$SANDBOX_LLM_TOKEN",
  "echo HOST=$(hostname)",
  "echo SPY-LOG; sort -u /workspace/spy.log; echo SPY-LOG-END",
].join("\n");

const LOOK_SAME_REPO = [
  "echo OWN=$SANDBOX_LLM_TOKEN",
  "echo HOST=$(hostname)",
  "sleep 1",
  "echo SPY-LOG; sort -u /workspace/spy.log; echo SPY-LOG-END",
  "echo PS; ps -eo args; echo PS-END",
  "echo NOTES; cat /workspace/a-notes.txt",
].join("\n");

const LOOK_OTHER_REPO = [
  "echo HOST=$(hostname)",
  "echo NOTES; cat /workspace/a-notes.txt /workspace/spy.log 2>&1",
  "echo REPOS; ls -A /workspace/repos; echo REPOS-END",
  "echo FOUND; find / -xdev \\( -name 'a-notes.txt' -o -name spy.log -o -name 'repo-a-*' \\) 2>/dev/null; echo FOUND-END",
].join("\n");

/** The `execute` tool's output in the last request the fake received (the agent's view). */
function lastToolOutput(llm: FakeLlm): string {
  const body = JSON.stringify(llm.requests.at(-1)?.body ?? {});
  const messages = (llm.requests.at(-1)?.body?.messages ?? []) as { role: string; content: unknown }[];
  const tool = messages.filter((m) => m.role === "tool").at(-1);
  assert.ok(tool, `no tool result in the request: ${body.slice(0, 500)}`);
  return typeof tool.content === "string" ? tool.content : JSON.stringify(tool.content);
}

function between(output: string, start: string, end: string): string[] {
  const from = output.indexOf(`${start}\n`);
  const to = output.indexOf(end, from);
  assert.ok(from >= 0 && to > from, `no ${start}…${end} in:\n${output}`);
  return output.slice(from + start.length + 1, to).split("\n").filter(Boolean);
}

function field(output: string, name: string): string {
  const match = new RegExp(`^${name}=(\\S+)$`, "m").exec(output);
  assert.ok(match, `no ${name}= in:\n${output}`);
  return match[1];
}

async function gitRepo(path: string, file: string): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  const git = (...args: string[]) => run(["git", "-C", path, "-c", "user.name=u", "-c", "user.email=u@x", ...args]);
  assert.equal((await git("init", "-q", "-b", "main")).exitCode, 0);
  await Deno.writeTextFile(`${path}/${file}`, `${file}\n`);
  await git("add", ".");
  assert.equal((await git("commit", "-qm", "init")).exitCode, 0);
  return path;
}

Deno.test({
  name: "a later run on the same repository sees no process or token of an earlier one, and a run on another repository sees none of its files",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({ prefix: "sec-xrun", llmUrl: llm.baseUrl, keyEnv: "SEC_XRUN_KEY", prompt: "Work\n" });
    const repoA = await gitRepo(`${fixture.dir.path}/repo-a`, "a.txt");
    const repoB = await gitRepo(`${fixture.dir.path}/repo-b`, "b.txt");
    const runOn = async (repo: string, command: string) => {
      llm.script.push(toolCall("execute", { command }), text("Done"));
      const result = await fixture.cli(["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile, "--repo", repo, "--format", "ndjson"]);
      assert.equal(result.exitCode, 0, explain(result));
      return lastToolOutput(llm);
    };

    const first = await runOn(repoA, SPY);
    const token1 = field(first, "OWN");
    await t.step("run 1: the spy works while its run lives (it caught run 1's own token)", () => {
      assert.match(token1, /^sbx_/);
      assert.deepEqual(between(first, "SPY-LOG", "SPY-LOG-END"), [`SANDBOX_LLM_TOKEN=${token1}`]);
    });

    const second = await runOn(repoA, LOOK_SAME_REPO);
    const token2 = field(second, "OWN");
    await t.step("run 2 shares repository A's container and workspace (the note is there)", async () => {
      assert.equal(field(second, "HOST"), field(first, "HOST"));
      assert.equal(field(first, "HOST"), await fixture.repoContainer(repoA));
      assert.match(second, /^NOTES\nA-NOTES-SECRET$/m);
    });
    await t.step("but the spy is gone and never saw run 2's token", () => {
      assert.notEqual(token2, token1);
      assert.deepEqual(between(second, "SPY-LOG", "SPY-LOG-END"), [`SANDBOX_LLM_TOKEN=${token1}`]);
      const processes = between(second, "PS", "PS-END");
      assert.ok(processes.some((p) => p.includes("worker.js")), processes.join("\n"));
      assert.deepEqual(processes.filter((p) => p.includes("while")), [], processes.join("\n"));
    });

    await t.step("`sandbox exec --repo` reaches the same container as the runs on that repository", async () => {
      const result = await fixture.cli(["exec", "-p", fixture.profile, "--repo", repoA, "--", "sh", "-c", "hostname; cat /workspace/a-notes.txt"]);
      assert.equal(result.exitCode, 0, explain(result));
      assert.equal(result.stdout, `${field(first, "HOST")}\nA-NOTES-SECRET\n`);
    });

    const third = await runOn(repoB, LOOK_OTHER_REPO);
    await t.step("run 3, on repository B, is in another container with nothing of A", async () => {
      assert.equal(field(third, "HOST"), await fixture.repoContainer(repoB));
      assert.notEqual(field(third, "HOST"), field(first, "HOST"));
      assert.match(third, /a-notes\.txt: No such file or directory/);
      assert.match(third, /spy\.log: No such file or directory/);
      assert.deepEqual(between(third, "REPOS", "REPOS-END").filter((name) => name.startsWith("repo-a-")), []);
      assert.ok(between(third, "REPOS", "REPOS-END").some((name) => name.startsWith("repo-b-")), third);
      assert.deepEqual(between(third, "FOUND", "FOUND-END"), []);
      assert.doesNotMatch(third, /A-NOTES-SECRET/);
    });

    await t.step("a run without a repository uses neither container", async () => {
      llm.script.push(toolCall("execute", { command: "echo HOST=$(hostname); ls -A /workspace" }), text("Done"));
      const result = await fixture.cli(["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile, "--format", "ndjson"]);
      assert.equal(result.exitCode, 0, explain(result));
      const output = lastToolOutput(llm);
      assert.equal(field(output, "HOST"), fixture.container);
      assert.doesNotMatch(output, /repos|a-notes|spy\.log/);
    });
  },
});
