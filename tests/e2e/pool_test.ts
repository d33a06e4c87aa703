/**
 * The warm pool through the CLI: `up` fills it (two at once make the pool once between them), runs
 * claim from it (each its own container, also when two start at once), a pooled container made with another configuration is removed and never
 * used, `up` replaces one that runs no command, and `down` removes the pool.
 */
import assert from "node:assert/strict";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  profileContainers,
  writeConfig,
} from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";

console.error("e2e: pool tests starting");

/** The hostname the run's command printed (in its NDJSON `tool_result`). */
function hostOf(output: string): string {
  const match = /HOST=([A-Za-z0-9_.-]+)/.exec(output);
  assert.ok(match, output);
  return match[1];
}

Deno.test({
  name:
    "up fills the pool; runs started at once each claim a pooled container of their own; a stale one is removed, never used; down removes the pool",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "e2e-pool",
      llmUrl: llm.baseUrl,
      keyEnv: "E2E_POOL_KEY",
      prompt: "Where\n",
      sandboxYaml: "{pool: 2}",
    });
    const run = async () => {
      const result = await fixture.cli([
        "run",
        "agentic",
        "--prompt-file",
        fixture.promptFile,
        "--profile",
        fixture.profile,
        "--lifecycle-events",
      ]);
      assert.equal(result.exitCode, 0, explain(result));
      return result;
    };
    /** The names of every container of the profile, running or not. */
    const containers = () => profileContainers(fixture.profile, { all: true });
    const up = async () => {
      const result = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
      assert.equal(result.exitCode, 0, explain(result));
      return JSON.parse(result.stdout) as { reaped: string[]; ready: string[] };
    };

    await t.step(
      "two ups at once make sandbox.pool containers between them, and each returns once all are ready",
      async () => {
        const [first, second] = await Promise.all([up(), up()]);
        assert.equal(first.ready.length, 2, JSON.stringify(first));
        assert.deepEqual([...second.ready].sort(), [...first.ready].sort());
        const made = await containers();
        assert.deepEqual(made.sort(), [...first.ready].sort(), "no container was made twice");
      },
    );

    let ready: string[] = [];
    await t.step(
      "up makes sandbox.pool containers, ready, with no health check; a second up makes none",
      async () => {
        ready = (await up()).ready;
        assert.equal(ready.length, 2);
        for (const name of ready) {
          assert.match(name, new RegExp(`^sandbox-${fixture.profile}-p[0-9a-f]{8}$`));
          // No health check spends CPU in a container that waits (the development sandbox keeps
          // the image's: tests/security/resource_exhaustion_test.ts waits for its verdict).
          const check = await docker("inspect", "-f", "{{json .Config.Healthcheck}}", name);
          assert.deepEqual(JSON.parse(check).Test, ["NONE"], check);
        }
        assert.deepEqual((await up()).ready.sort(), [...ready].sort());
      },
    );

    await t.step("two runs started at once claim two different pooled containers", async () => {
      llm.script.push(
        toolCall("execute", { command: "echo HOST=$(hostname); sleep 1" }),
        toolCall("execute", { command: "echo HOST=$(hostname); sleep 1" }),
      );
      llm.script.push(text("Done"), text("Done"));
      const [a, b] = await Promise.all([run(), run()]);
      const hosts = [a, b].map((r) => hostOf(r.stdout));
      assert.notEqual(hosts[0], hosts[1]);
      assert.deepEqual(
        [...hosts].sort(),
        [...ready].sort(),
        "each run used one of the ready containers",
      );
    });

    await t.step(
      "a run's container is gone when its CLI exits: removed beside the refill, not after it",
      async () => {
        assert.equal((await up()).ready.length, 2);
        llm.script.push(toolCall("execute", { command: "echo HOST=$(hostname)" }), text("Done"));
        const host = hostOf((await run()).stdout);
        // At once: a removal begun only as the CLI exits is still under way (about 0.1 s).
        const left = await containers();
        assert.ok(!left.includes(host), `${host} was still there: ${left.join(", ")}`);
        assert.equal(left.length, 2, `the pool refilled: ${left.join(", ")}`);
      },
    );

    await t.step(
      "a run that claims while another run's refill is under way refills too: the pool is full after both",
      async () => {
        assert.equal((await up()).ready.length, 2);
        const pool = `${fixture.stateDir}/sandbox/pool`;
        const ofProfile = async (dir: string) =>
          (await Array.fromAsync(Deno.readDir(`${pool}/${dir}`)).catch(() => []))
            .filter((entry) => entry.name.startsWith(`sandbox-${fixture.profile}-p`));
        // The first run sleeps past the second; the second's command is quick.
        llm.script.push(
          toolCall("execute", { command: "sleep 3" }),
          toolCall("execute", { command: "true" }),
          text("Done"),
          text("Done"),
        );
        const first = run();
        // Its refill under way: its claimed container and the one its refill starts are held.
        for (let i = 0; (await ofProfile("claimed")).length < 2; i++) {
          assert.ok(i < 600, "the first run's refill never started");
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        await Promise.all([first, run()]);
        const ready = await ofProfile("ready");
        assert.equal(ready.length, 2, `ready afterwards: ${ready.map((e) => e.name).join(", ")}`);
      },
    );

    await t.step(
      "a pooled container made with another configuration is removed, and the run gets a new one",
      async () => {
        const stale = (await up()).ready;
        assert.equal(stale.length, 2);
        fixture.config = await writeConfig(
          fixture.dir.path,
          (await Deno.readTextFile(fixture.config)).replace(
            "{pool: 2}",
            "{pool: 2, resources: {memory: 3g}}",
          ),
        );
        llm.script.push(toolCall("execute", { command: "echo HOST=$(hostname)" }), text("Done"));
        const result = await run();
        const host = hostOf(result.stdout);
        assert.ok(!stale.includes(host), `the run used stale ${host}`);
        assert.match(
          result.stderr,
          /removing pooled sandbox .*: made with another configuration/,
          explain(result),
        );
        const left = await containers();
        assert.ok(
          stale.every((name) => !left.includes(name)),
          `stale containers left: ${left.join(", ")}`,
        );
      },
    );

    await t.step(
      "up removes a ready container that runs no command (paused) and fills its place; its twin stays",
      async () => {
        const before = (await up()).ready;
        assert.equal(before.length, 2);
        const [wedged, healthy] = before;
        await docker("pause", wedged);
        try {
          const result = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
          assert.equal(result.exitCode, 0, explain(result));
          assert.match(
            result.stderr,
            new RegExp(`removing pooled sandbox ${wedged}: it runs no command`),
            explain(result),
          );
          const after = (JSON.parse(result.stdout) as { ready: string[] }).ready;
          assert.equal(after.length, 2);
          assert.ok(!after.includes(wedged), `the wedged ${wedged} is still offered`);
          assert.ok(after.includes(healthy), `the healthy ${healthy} was removed`);
        } finally {
          // Removed by up; if the test failed before, unpaused so that down can remove it.
          await docker("unpause", wedged).catch(() => {});
        }
      },
    );

    await t.step("down removes the pool, and up fills it again", async () => {
      const down = await fixture.cli(["down", "-p", fixture.profile, "--json"]);
      assert.equal(down.exitCode, 0, explain(down));
      assert.equal(
        await docker("ps", "-aq", "--filter", `label=dev.sandbox.profile=${fixture.profile}`),
        "",
      );
      assert.equal((await up()).ready.length, 2);
    });
  },
});
