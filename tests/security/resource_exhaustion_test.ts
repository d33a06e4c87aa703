/**
 * Attack: exhaust what the sandbox shares with the host (issue 9, item 10): fill the host's disk
 * through `/workspace` (a volume with no size limit on this storage), hide the writes in a file
 * deleted while open, fill `/tmp` and home (tmpfs, whose pages count against the memory limit)
 * until nothing can start, and leave the development sandbox wedged (every pid held).
 *
 * Each attack is done as a user's command or an agent's would be: `sandbox exec` or a scripted
 * agent run. Each has its twin: the same write under the limit succeeds on the same path. A run's
 * container is its own and goes with it, so a wedged development sandbox holds no run up.
 * (Stopping or killing the disk watcher: tests/security/disk_watch_attack_test.ts.)
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, docker, dockerTest, explain } from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";
import { execsBetween } from "../_engine_events.ts";

console.error("security: resource exhaustion tests starting");

const MIB = 1024 ** 2;
const DISK_LIMIT = "64m";
/**
 * How far past the limit a writer may get before it is stopped: the watch looks at least once a
 * second and at once when free space falls by 64 MiB, and stopping takes a `docker exec` or two;
 * a writer to the page cache manages a few hundred MiB in that time on these machines.
 */
const OVERSHOOT_BOUND_BYTES = 1536 * MIB;
/** Generous for a loaded CI machine; the watch itself reacts within about a second. */
const STOP_BOUND_MS = 30_000;

async function workspaceBytes(container: string): Promise<number> {
  const du = await run(["docker", "exec", "--user", "0", container, "du", "-sxk", "/workspace"]);
  assert.equal(du.exitCode, 0, du.stderr);
  return Number(du.stdout.split(/\s/)[0]) * 1024;
}

async function processes(container: string): Promise<string> {
  return (await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "args="])).stdout;
}

/** Whether `container` is gone within a minute (a run's is removed, detached, once it ends). */
async function removed(container: string): Promise<boolean> {
  for (let i = 0; i < 600; i++) {
    if ((await run(["docker", "container", "inspect", container])).exitCode !== 0) return true;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return false;
}

Deno.test({
  name:
    "writing past resources.disk in /workspace is stopped within seconds with a clear error, and the disk use stays bounded",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-disk",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_DISK_KEY",
      prompt: "Fill the disk\n",
      sandboxYaml: `{resources: {disk: ${DISK_LIMIT}}}`,
    });
    const exec = (script: string) =>
      fixture.cli(["exec", "-p", fixture.profile, "--", "sh", "-c", script]);

    await t.step("twin: writing under the limit succeeds", async () => {
      const result = await exec("head -c 32M /dev/zero >/workspace/ok && echo wrote");
      assert.equal(result.exitCode, 0, explain(result));
      assert.equal(result.stdout, "wrote\n");
    });

    await t.step(
      "a writer that would fill the host's disk is stopped: exit 125, naming resources.disk",
      async () => {
        const started = performance.now();
        const result = await exec(
          "dd if=/dev/zero of=/workspace/big bs=1M count=100000 2>&1; echo dd-ended",
        );
        const tookMs = performance.now() - started;
        assert.equal(result.exitCode, 125, explain(result));
        assert.match(
          result.stderr,
          /exceeded resources\.disk: \/workspace holds [\d.]+ [MG]iB, the limit is 64(\.0)? MiB/,
          explain(result),
        );
        assert.doesNotMatch(result.stdout, /dd-ended/);
        assert.ok(tookMs < STOP_BOUND_MS, `stopped after ${Math.round(tookMs)} ms`);
        const used = await workspaceBytes(fixture.container);
        assert.ok(used < 64 * MIB + OVERSHOOT_BOUND_BYTES, `the workspace holds ${used} bytes`);
        assert.doesNotMatch(await processes(fixture.container), /^dd /m);
        console.error(
          `disk: stopped after ${Math.round(tookMs)} ms at ${
            Math.round(used / MIB)
          } MiB (limit 64 MiB)`,
        );
      },
    );

    await t.step("a workspace left over the limit can still be cleaned up", async () => {
      const result = await exec("rm -f /workspace/big && echo cleaned");
      assert.equal(result.exitCode, 0, explain(result));
      assert.ok(await workspaceBytes(fixture.container) < 64 * MIB);
    });

    await t.step("writes to a file deleted while open are counted too", async () => {
      const result = await exec(
        "exec 3>/workspace/hidden; rm /workspace/hidden; dd if=/dev/zero bs=1M count=100000 >&3 2>/dev/null; echo dd-ended",
      );
      assert.equal(result.exitCode, 125, explain(result));
      assert.match(result.stderr, /exceeded resources\.disk/);
      assert.doesNotMatch(await processes(fixture.container), /^dd /m);
    });

    const agentRun = (command: string) => {
      // (A run stopped during its tool call leaves its last answer unasked.)
      llm.script.splice(0, llm.script.length, toolCall("execute", { command }), text("Done"));
      return fixture.cli([
        "run",
        "agentic",
        "--prompt-file",
        fixture.promptFile,
        "--profile",
        fixture.profile,
        "--format",
        "ndjson",
      ]);
    };

    await t.step(
      "an agent run that fills the workspace ends with exit 125 and the same message; watched from its container's log, no exec of its own; its container goes",
      async () => {
        const since = new Date();
        const result = await agentRun(
          "dd if=/dev/zero of=/workspace/big bs=1M count=100000 2>&1; echo dd-ended",
        );
        const until = new Date(Date.now() + 1_000);
        assert.equal(result.exitCode, 125, explain(result));
        assert.match(result.stderr, /exceeded resources\.disk: \/workspace holds/, explain(result));
        const id = /run (\S+) \(/.exec(result.stderr)?.[1];
        assert.ok(id, result.stderr);
        const meta = await fixture.meta(id);
        assert.equal(meta.status, "failed");
        assert.equal(meta.exitCode, 125);
        assert.match(meta.error ?? "", /resources\.disk/);
        const container = meta.extra?.container;
        assert.ok(
          typeof container === "string" && container !== fixture.container,
          JSON.stringify(meta.extra),
        );
        // The engine saw the run's worker started in its container, and no exec to watch the disk.
        const execs = await execsBetween(container, since, until);
        assert.ok(execs.some((line) => /sandbox-exec worker-/.test(line)), execs.join("\n"));
        assert.ok(!execs.some((line) => /sandbox-exec --du /.test(line)), execs.join("\n"));
        assert.ok(await removed(container), `the run's container ${container} is still there`);
      },
    );
  },
});

Deno.test({
  name:
    "filling /tmp and home does not wedge the sandbox: they fit in half the memory limit, and the next command runs",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-tmp",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_TMP_KEY",
      prompt: "unused\n",
      sandboxYaml: "{resources: {memory: 256m}}",
    });
    const exec = (script: string) =>
      fixture.cli(["exec", "-p", fixture.profile, "--", "sh", "-c", script]);

    await t.step("twin: a file that fits is written", async () => {
      const result = await exec("head -c 16M /dev/zero >/tmp/fits && echo wrote");
      assert.equal(result.exitCode, 0, explain(result));
    });

    await t.step(
      "filling both is refused by their size (64 MiB each: a quarter of 256 MiB)",
      async () => {
        const result = await exec(
          "df -k /tmp ~ | tail -n 2; head -c 1G /dev/zero >/tmp/fill; head -c 1G /dev/zero >~/fill; echo tried",
        );
        assert.match(result.stderr, /No space left on device/, explain(result));
        const sizes = result.stdout.split("\n").filter((l) => l.startsWith("tmpfs")).map((l) =>
          Number(l.split(/\s+/)[1])
        );
        assert.deepEqual(sizes, [65536, 65536], result.stdout);
        assert.match(result.stdout, /tried/);
      },
    );

    await t.step(
      "with both full, the next commands still start (pipelines too), in the same sandbox",
      async () => {
        const before = await docker(
          "container",
          "inspect",
          "--format",
          "{{.Id}}",
          fixture.container,
        );
        for (let i = 0; i < 2; i++) {
          const result = await exec("du -sk /tmp/fill ~/fill | cat; echo alive");
          assert.equal(result.exitCode, 0, explain(result));
          assert.match(result.stdout, /alive/);
          assert.doesNotMatch(result.stderr, /Replacing/);
        }
        assert.equal(
          await docker("container", "inspect", "--format", "{{.Id}}", fixture.container),
          before,
        );
      },
    );
  },
});

Deno.test({
  name:
    "a wedged development sandbox (no command can start in it) holds no run up, and exec replaces it once the engine finds it unhealthy",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-wedge",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_WEDGE_KEY",
      prompt: "Say alive\n",
      sandboxYaml: "{resources: {pids: 32, cpus: 0.5}}",
    });
    const first = await fixture.cli(["start", "-p", fixture.profile, "--json"]);
    assert.equal(first.exitCode, 0, explain(first));
    const before = JSON.parse(first.stdout).id as string;

    await t.step("twin: exec on a healthy sandbox keeps it", async () => {
      const alive = await fixture.cli(["exec", "-p", fixture.profile, "--", "echo", "alive"]);
      assert.equal(alive.stdout, "alive\n", explain(alive));
      assert.doesNotMatch(alive.stderr, /Replacing/);
      assert.ok(
        (await docker("container", "inspect", "--format", "{{.Id}}", fixture.container)).startsWith(
          before,
        ),
      );
    });

    await t.step("processes left running hold every pid: nothing can start", async () => {
      // Started as a user's plain `docker exec` would: outside any wrapper, nothing ends it. It
      // forks again at once whenever a pid comes free (bash would back off for seconds after a
      // failed fork).
      await docker(
        "exec",
        "--detach",
        "--user",
        "10001",
        fixture.container,
        "perl",
        "-e",
        "while (1) { my $p = fork; if (defined $p && !$p) { sleep 1000; exit } }",
      );
      // `docker exec` itself still gets a process in (it is moved into the container, not forked
      // there), but that process cannot fork: no command that starts another can run.
      let blocked = false;
      for (let attempt = 0; attempt < 50 && !blocked; attempt++) {
        const probe = await run([
          "docker",
          "exec",
          fixture.container,
          "sh",
          "-c",
          "ls / >/dev/null && echo ran",
        ], { timeoutMs: 10_000 });
        blocked = !probe.stdout.includes("ran");
        if (!blocked) await new Promise((resolve) => setTimeout(resolve, 200));
      }
      assert.ok(blocked, "the processes never exhausted the pids");
    });

    await t.step(
      "a run meanwhile gets a sandbox of its own and runs its command to its end",
      async () => {
        llm.script.splice(
          0,
          llm.script.length,
          toolCall("execute", { command: "echo alive-in-$(hostname)" }),
          text("Done"),
        );
        const result = await fixture.cli([
          "run",
          "agentic",
          "--prompt-file",
          fixture.promptFile,
          "--profile",
          fixture.profile,
          "--format",
          "ndjson",
        ]);
        assert.equal(result.exitCode, 0, explain(result));
        assert.match(result.stdout, /"tool_output":"alive-in-/, explain(result));
        const id = /run (\S+) \(/.exec(result.stderr)?.[1];
        assert.ok(id, result.stderr);
        const container = (await fixture.meta(id)).extra?.container;
        assert.ok(
          typeof container === "string" && container !== fixture.container,
          String(container),
        );
      },
    );

    await t.step(
      "once the engine's health check calls it unhealthy, exec replaces it, says so, and the new one runs commands",
      async () => {
        // The image's health check runs every 30 s and needs three failures: wait for its verdict.
        let health = "";
        for (let i = 0; i < 300 && health !== "unhealthy"; i++) {
          health = await docker(
            "container",
            "inspect",
            "--format",
            "{{.State.Health.Status}}",
            fixture.container,
          );
          if (health !== "unhealthy") await new Promise((resolve) => setTimeout(resolve, 1_000));
        }
        assert.equal(health, "unhealthy");
        const alive = await fixture.cli(["exec", "-p", fixture.profile, "--", "echo", "alive"]);
        assert.equal(alive.stdout, "alive\n", explain(alive));
        assert.match(
          alive.stderr,
          new RegExp(`Replacing sandbox ${fixture.container}: it cannot run commands`),
        );
        assert.ok(
          !(await docker("container", "inspect", "--format", "{{.Id}}", fixture.container))
            .startsWith(before),
        );
      },
    );
  },
});
