/**
 * Attack: exhaust what the sandbox shares with the host and with later runs (issue 9, item 10):
 * fill the host's disk through `/workspace` (a volume with no size limit on this storage), hide
 * the writes in a file deleted while open, fill `/tmp` and home (tmpfs, whose pages count against
 * the memory limit) until nothing can start, and leave the container wedged for `up` to call
 * running.
 *
 * Each attack is done as a user's command or an agent's would be: `sandbox exec` or a scripted
 * agent run. Each has its twin: the same write under the limit succeeds on the same path.
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

Deno.test({
  name: "writing past resources.disk in /workspace is stopped within seconds with a clear error, and the disk use stays bounded",
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
    const exec = (script: string) => fixture.cli(["exec", "-p", fixture.profile, "--", "sh", "-c", script]);

    await t.step("twin: writing under the limit succeeds", async () => {
      const result = await exec("head -c 32M /dev/zero >/workspace/ok && echo wrote");
      assert.equal(result.exitCode, 0, explain(result));
      assert.equal(result.stdout, "wrote\n");
    });

    await t.step("a writer that would fill the host's disk is stopped: exit 125, naming resources.disk", async () => {
      const started = performance.now();
      const result = await exec("dd if=/dev/zero of=/workspace/big bs=1M count=100000 2>&1; echo dd-ended");
      const tookMs = performance.now() - started;
      assert.equal(result.exitCode, 125, explain(result));
      assert.match(result.stderr, /exceeded resources\.disk: \/workspace holds [\d.]+ [MG]iB, the limit is 64(\.0)? MiB/, explain(result));
      assert.doesNotMatch(result.stdout, /dd-ended/);
      assert.ok(tookMs < STOP_BOUND_MS, `stopped after ${Math.round(tookMs)} ms`);
      const used = await workspaceBytes(fixture.container);
      assert.ok(used < 64 * MIB + OVERSHOOT_BOUND_BYTES, `the workspace holds ${used} bytes`);
      assert.doesNotMatch(await processes(fixture.container), /^dd /m);
      console.error(`disk: stopped after ${Math.round(tookMs)} ms at ${Math.round(used / MIB)} MiB (limit 64 MiB)`);
    });

    await t.step("a workspace left over the limit can still be cleaned up", async () => {
      const result = await exec("rm -f /workspace/big && echo cleaned");
      assert.equal(result.exitCode, 0, explain(result));
      assert.ok(await workspaceBytes(fixture.container) < 64 * MIB);
    });

    await t.step("writes to a file deleted while open are counted too", async () => {
      const result = await exec("exec 3>/workspace/hidden; rm /workspace/hidden; dd if=/dev/zero bs=1M count=100000 >&3 2>/dev/null; echo dd-ended");
      assert.equal(result.exitCode, 125, explain(result));
      assert.match(result.stderr, /exceeded resources\.disk/);
      assert.doesNotMatch(await processes(fixture.container), /^dd /m);
    });

    const agentRun = (command: string) => {
      // (A run stopped during its tool call leaves its last answer unasked.)
      llm.script.splice(0, llm.script.length, toolCall("execute", { command }), text("Done"));
      return fixture.cli(["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile, "--format", "ndjson"]);
    };

    await t.step("an agent run that fills the workspace ends with exit 125 and the same message; its lease watched, no exec of its own", async () => {
      const since = new Date();
      const result = await agentRun("dd if=/dev/zero of=/workspace/big bs=1M count=100000 2>&1; echo dd-ended");
      const until = new Date(Date.now() + 1_000);
      assert.equal(result.exitCode, 125, explain(result));
      assert.match(result.stderr, /exceeded resources\.disk: \/workspace holds/, explain(result));
      assert.doesNotMatch(await processes(fixture.container), /^dd /m);
      const id = /run (\S+) \(/.exec(result.stderr)?.[1];
      assert.ok(id, result.stderr);
      const meta = await fixture.meta(id);
      assert.equal(meta.status, "failed");
      assert.equal(meta.exitCode, 125);
      assert.match(meta.error ?? "", /resources\.disk/);
      const execs = await execsBetween(fixture.container, since, until);
      assert.ok(execs.some((line) => /sandbox-exec --lease lease-/.test(line)), execs.join("\n"));
      assert.ok(!execs.some((line) => /sandbox-exec --du /.test(line)), execs.join("\n"));
      await run(["docker", "exec", "--user", "0", fixture.container, "rm", "-f", "/workspace/big"]);
    });

    // The lease's disk watcher is a child of the lease (same argv, the lease its parent), of the
    // sandbox user's uid like the agent: the agent can kill it, or the lease. Either stops the run.
    // `set -- WATCHER LEASE`, once the watcher is there (it starts 250 ms into the run).
    const findWatcher = String.raw`
      lease() { { tr '\0' ' ' <"$1/cmdline"; } 2>/dev/null | grep -q '^[^ ]*sandbox-perl [^ ]*sandbox-exec --lease lease-'; }
      watcher() {
        for i in $(seq 100); do
          for d in /proc/[0-9]*; do
            lease "$d" || continue
            parent=$(sed 's/.*) //' "$d/stat" | cut -d' ' -f2)
            if lease "/proc/$parent"; then echo "$(basename "$d") $parent"; return; fi
          done
          sleep 0.1
        done
      }
      set -- $(watcher)`;
    await t.step("twin: the same agent command without the kill runs to its end", async () => {
      const result = await agentRun(`${findWatcher}; [ -n "$2" ] && echo found-watcher; sleep 3; echo survived`);
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(result.stdout, /"tool_output":"found-watcher\\nsurvived\\n/, explain(result));
    });

    for (const [what, pid] of [["its disk watcher", "$1"], ["its lease", "$2"]]) {
      await t.step(`an agent that kills ${what} is stopped (the watch fails closed), not left unwatched`, async () => {
        const result = await agentRun(`${findWatcher}; kill -KILL "${pid}" && echo killed; sleep 5; echo survived`);
        assert.equal(result.exitCode, 125, explain(result));
        assert.match(result.stderr, /disk watch of sandbox "[^"]+" stopped/, explain(result));
        assert.doesNotMatch(result.stdout, /"tool_output":"[^"]*survived/, explain(result));
      });
    }
  },
});

Deno.test({
  name: "filling /tmp and home does not wedge the sandbox: they fit in half the memory limit, and the next command runs",
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
    const exec = (script: string) => fixture.cli(["exec", "-p", fixture.profile, "--", "sh", "-c", script]);

    await t.step("twin: a file that fits is written", async () => {
      const result = await exec("head -c 16M /dev/zero >/tmp/fits && echo wrote");
      assert.equal(result.exitCode, 0, explain(result));
    });

    await t.step("filling both is refused by their size (64 MiB each: a quarter of 256 MiB)", async () => {
      const result = await exec("df -k /tmp ~ | tail -n 2; head -c 1G /dev/zero >/tmp/fill; head -c 1G /dev/zero >~/fill; echo tried");
      assert.match(result.stderr, /No space left on device/, explain(result));
      const sizes = result.stdout.split("\n").filter((l) => l.startsWith("tmpfs")).map((l) => Number(l.split(/\s+/)[1]));
      assert.deepEqual(sizes, [65536, 65536], result.stdout);
      assert.match(result.stdout, /tried/);
    });

    await t.step("with both full, the next command still starts, and up finds the sandbox healthy", async () => {
      const result = await exec("du -sk /tmp/fill ~/fill; echo alive");
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(result.stdout, /alive/);
      const before = await docker("container", "inspect", "--format", "{{.Id}}", fixture.container);
      const up = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
      assert.equal(up.exitCode, 0, explain(up));
      assert.doesNotMatch(up.stderr, /Replacing/);
      assert.equal(before.startsWith(JSON.parse(up.stdout).id), true);
    });
  },
});

Deno.test({
  name: "up replaces a wedged sandbox (no command can start in it) instead of calling it running",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-wedge",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_WEDGE_KEY",
      prompt: "unused\n",
      sandboxYaml: "{resources: {pids: 32, cpus: 0.5}}",
    });
    const first = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
    assert.equal(first.exitCode, 0, explain(first));
    const before = JSON.parse(first.stdout).id as string;

    await t.step("processes left running hold every pid: nothing can start", async () => {
      // Started as a user's plain `docker exec` would: outside any wrapper, nothing ends it. It
      // forks again at once whenever a pid comes free (bash would back off for seconds after a
      // failed fork, and a thread the waiting worker's runtime retires would let a probe in).
      await docker("exec", "--detach", "--user", "10001", fixture.container, "perl", "-e", "while (1) { my $p = fork; if (defined $p && !$p) { sleep 1000; exit } }");
      // `docker exec` itself still gets a process in (it is moved into the container, not forked
      // there), but that process cannot fork: no command that starts another can run.
      let blocked = false;
      for (let attempt = 0; attempt < 50 && !blocked; attempt++) {
        const probe = await run(["docker", "exec", fixture.container, "sh", "-c", "ls / >/dev/null && echo ran"], { timeoutMs: 10_000 });
        blocked = !probe.stdout.includes("ran");
        if (!blocked) await new Promise((resolve) => setTimeout(resolve, 200));
      }
      assert.ok(blocked, "the processes never exhausted the pids");
    });

    await t.step("up replaces it, says so, and the new one runs commands", async () => {
      const up = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
      assert.equal(up.exitCode, 0, explain(up));
      assert.match(up.stderr, new RegExp(`Replacing sandbox ${fixture.container}: it cannot run commands`));
      const status = JSON.parse(up.stdout);
      assert.equal(status.state, "running");
      assert.notEqual(status.id, before);
      const alive = await fixture.cli(["exec", "-p", fixture.profile, "--", "echo", "alive"]);
      assert.equal(alive.stdout, "alive\n", explain(alive));
    });

    await t.step("twin: up on a healthy sandbox keeps it", async () => {
      const up = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
      assert.doesNotMatch(up.stderr, /Replacing/);
      const id = JSON.parse(up.stdout).id;
      const again = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
      assert.equal(JSON.parse(again.stdout).id, id);
    });
  },
});
