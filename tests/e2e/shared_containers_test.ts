/**
 * `sandbox.containers: N`: a profile keeps N shared containers, each serving one run at a time.
 * Real engine, the CLI as a user runs it: `up` makes them all, each with a worker and a relay
 * waiting (the relay is the one the next run claims, and passes on); a run
 * that starts while another holds the first leases one of the others (no container of its own, and
 * not the busy one: the hostile-agent rule of one run per container holds); the next run, alone,
 * goes back to the first; `down` removes them all.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { text } from "../_fake_llm.ts";
import { HeldLlm } from "../_held_llm.ts";
import { assertDocker, dockerTest, spawnCli } from "../_helpers.ts";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";

console.error("e2e: shared containers tests starting");

/** The container a run worked in, from its run log. */
async function containerOf(fixture: RunFixture, stderr: string): Promise<string> {
  const id = /run (\d{8}-\d{6}-[0-9a-f]{6})/.exec(stderr)?.[1];
  assert.ok(id, `no run id in:\n${stderr}`);
  const meta = JSON.parse(await Deno.readTextFile(`${fixture.stateDir}/sandbox/runs/${id}/meta.json`));
  return meta.extra.container;
}

/** The pids of the relays waiting in `container` for their next session (`relay.js --spare`). */
async function spareRelays(container: string): Promise<string[]> {
  const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "pid=,args="]);
  return ps.stdout.split("\n").filter((line) => /^\s*\d+ deno run .*relay\.js --spare /.test(line)).map((line) => line.trim().split(" ")[0]);
}

function startRun(fixture: RunFixture) {
  const child = spawnCli(["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile, "--format", "ndjson"], {
    config: fixture.config,
    env: fixture.env,
    timeoutMs: CLI_TIMEOUT_MS,
  });
  return { child, output: new Response(child.stdout).text() };
}

Deno.test({
  name: "sandbox.containers: up makes them warm; a run that finds the first busy leases another, never the busy one nor one of its own; alone, runs go to the first; down removes them",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new HeldLlm([text("first"), text("second"), text("third")]);
    await using fixture = await RunFixture.make({
      prefix: "e2e-slots",
      llmUrl: llm.baseUrl,
      keyEnv: "E2E_SLOTS_KEY",
      prompt: "Say something\n",
      sandboxYaml: "{containers: 2}",
    });
    const second = `${fixture.container}-s2`;

    /** The relay `up` left waiting in the second container. */
    let upRelay: string[] = [];

    await t.step("up makes both, each with a worker and a relay waiting for its run", async () => {
      const up = await fixture.cli(["up", "--profile", fixture.profile]);
      assert.equal(up.exitCode, 0, up.stderr);
      assert.match(up.stdout, new RegExp(`sandbox ${fixture.container} is running`));
      assert.match(up.stdout, new RegExp(`sandbox ${second} is running`));
      for (const container of [fixture.container, second]) {
        const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "args="]);
        assert.match(ps.stdout, /^deno run .*worker\.js serve --socket/m, `no worker waits in ${container}:\n${ps.stdout}`);
        assert.equal((await spareRelays(container)).length, 1, `no relay waits in ${container}:\n${ps.stdout}`);
      }
      upRelay = await spareRelays(second);
    });

    await t.step("while a run holds the first, the next leases the second: both succeed, in different shared containers", async () => {
      const held = llm.hold(1);
      const first = startRun(fixture);
      await Promise.race([held, first.child.finished.then((e) => Promise.reject(new Error(`the run ended early: ${e.stderrTail}`)))]);
      const other = startRun(fixture);
      const [otherOut, otherEnd] = await Promise.all([other.output, other.child.finished]);
      llm.release();
      const [firstOut, firstEnd] = await Promise.all([first.output, first.child.finished]);
      assert.equal(firstEnd.exitCode, 0, `${firstOut}\n${firstEnd.stderrTail}`);
      assert.equal(otherEnd.exitCode, 0, `${otherOut}\n${otherEnd.stderrTail}`);
      assert.doesNotMatch(otherEnd.stderrTail, /a container of its own/);
      const places = [await containerOf(fixture, firstEnd.stderrTail), await containerOf(fixture, otherEnd.stderrTail)];
      assert.deepEqual(places, [fixture.container, second]);
      // The run in the second claimed the relay up left there (serving what a run needs), and
      // passed it on: the same process waits again, no other.
      assert.deepEqual(await spareRelays(second), upRelay);
    });

    await t.step("alone, a run goes to the first again", async () => {
      const alone = startRun(fixture);
      const [out, ended] = await Promise.all([alone.output, alone.child.finished]);
      assert.equal(ended.exitCode, 0, `${out}\n${ended.stderrTail}`);
      assert.equal(await containerOf(fixture, ended.stderrTail), fixture.container);
    });

    await t.step("down removes both", async () => {
      const down = await fixture.cli(["down", "--profile", fixture.profile]);
      assert.equal(down.exitCode, 0, down.stderr);
      const left = await run(["docker", "ps", "-a", "--format", "{{.Names}}", "--filter", `name=^${fixture.container}`]);
      assert.equal(left.stdout.trim(), "");
    });
  },
});
