/**
 * A warm run reaches the worker waiting in its leased container through the container's waiting
 * command wrapper (lib/sandbox/spare.ts attachSpareOn), so the engine starts one `docker exec` for
 * it, its lease, where it started two; the wrapper, the same process, is passed on to the next run
 * and to `sandbox exec`. Attacked: an agent that kills the wrapper during its run leaves nothing of
 * it behind, and the next run reaches its worker the usual way and leaves a new wrapper.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";
import { waitingWrapper } from "../_waiting_wrapper.ts";
import { execsBetween } from "../_engine_events.ts";

/** Until the worker waiting for the next run listens (bounded). */
async function spareReady(container: string): Promise<void> {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline;) {
    const ready = await run(["docker", "exec", "--user", "10001", container, "test", "-S", "/tmp/.sandbox-spare.sock"]);
    if (ready.exitCode === 0) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`no worker waiting in ${container}`);
}

Deno.test({
  name: "a warm run reaches its waiting worker on the container's waiting wrapper: one docker exec, the lease; the wrapper is passed on, and an agent that kills it harms only its own run",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([
      text("one"),
      text("two"),
      toolCall("execute", { command: "pkill -KILL -f 'sandbox-exec --waiting' && echo killed" }),
      text("three"),
      text("four"),
      text("five"),
    ]);
    await using fixture = await RunFixture.make({ prefix: "e2e-warm-exec", llmUrl: llm.baseUrl, keyEnv: "E2E_WARM_EXEC_KEY", prompt: "Say something\n" });
    const runOnce = async () => {
      const result = await fixture.cli(["run", "agentic", "-p", fixture.profile, "--prompt-file", fixture.promptFile], { SANDBOX_TRACE: "1" });
      assert.doesNotMatch(result.stderr, /another run of this profile is live/, explain(result));
      return result;
    };
    const up = await fixture.cli(["up", "-p", fixture.profile]);
    assert.equal(up.exitCode, 0, explain(up));
    const container = fixture.container;
    await spareReady(container);
    const left = await waitingWrapper(container);
    assert.ok(left, "up left no wrapper waiting");

    await t.step("the run's connector runs on the waiting wrapper, which is passed on: the same process waits after it", async () => {
      const result = await runOnce();
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(result.stdout, /"content":"one"/, explain(result));
      assert.match(result.stderr, /waiting exec: connected/, explain(result));
      assert.match(result.stderr, /waiting exec: passed on/, explain(result));
      assert.equal((await waitingWrapper(container))?.pid, left.pid, "the wrapper was not passed on");
    });

    await t.step("the engine starts one exec for a warm run: its lease", async () => {
      await spareReady(container);
      const since = new Date();
      const result = await runOnce();
      const until = new Date(Date.now() + 1_000);
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(result.stdout, /"content":"two"/, explain(result));
      // (A run that takes over 250 ms also gets its disk watch: from the lease, no exec of its own.)
      const execs = await execsBetween(container, since, until);
      assert.equal(execs.length, 1, execs.join("\n"));
      assert.match(execs[0], /sandbox-exec --lease lease-/, execs.join("\n"));
    });

    await t.step("sandbox exec takes the wrapper the run passed on", async () => {
      const result = await fixture.cli(["exec", "-p", fixture.profile, "--", "echo", "on-the-wrapper"], { SANDBOX_TRACE: "1" });
      assert.equal(result.stdout, "on-the-wrapper\n", explain(result));
      assert.match(result.stderr, /waiting exec: connected/, explain(result));
      assert.equal((await waitingWrapper(container))?.pid, left.pid, "the wrapper was not passed on");
    });

    await t.step("an agent that kills the wrapper mid-run leaves nothing behind; the next run reaches its worker the usual way and leaves a new wrapper", async () => {
      await spareReady(container);
      const attacked = await runOnce();
      // It ends as the run it was: its result, or a failure that says the worker ended without one
      // (never the connection cut under the host: that once ended it "operation canceled").
      assert.ok(attacked.exitCode === 0 || /Worker did not emit a result/.test(attacked.stderr), explain(attacked));
      assert.doesNotMatch(attacked.stderr, /operation canceled|Uncaught|^\s+at /m, explain(attacked));
      // The agent did reach it (the positive control): its command said so, and the process is gone.
      const killed = llm.requests.some((request) => JSON.stringify(request.body).includes("killed"));
      const gone = await run(["docker", "exec", "--user", "0", container, "test", "-d", `/proc/${left.pid}`]);
      assert.ok(killed || gone.exitCode !== 0, `the agent did not kill the wrapper\n${explain(attacked)}`);
      assert.notEqual(gone.exitCode, 0, "the wrapper outlived the agent's kill");
      // Nothing of that run is left: its connector (the wrapper's orphan) went with the lease's
      // sweep (which the host waits for only a moment: looked at for a few seconds).
      let ps = "";
      for (const deadline = Date.now() + 5_000; Date.now() < deadline;) {
        ps = (await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "args="])).stdout;
        if (!/sandbox-attach/.test(ps)) break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.doesNotMatch(ps, /sandbox-attach/, ps);
      assert.equal(await waitingWrapper(container), undefined, "a dead wrapper is still recorded");

      await spareReady(container);
      const next = await runOnce();
      assert.equal(next.exitCode, 0, explain(next));
      assert.match(next.stdout, /"content":"(three|four)"/, explain(next));
      assert.doesNotMatch(next.stderr, /waiting exec: connected/, explain(next));
      const fresh = await waitingWrapper(container);
      assert.ok(fresh && fresh.pid !== left.pid, "the run left no new wrapper");

      await spareReady(container);
      const after = await runOnce();
      assert.equal(after.exitCode, 0, explain(after));
      assert.match(after.stderr, /waiting exec: connected/, explain(after));
      assert.equal((await waitingWrapper(container))?.pid, fresh.pid, "the new wrapper was not passed on");
    });
  },
});
