/**
 * The waiting command wrapper (lib/sandbox/waiting_exec.ts, scripts/sandbox-exec --waiting): `up`
 * leaves one in the container, and `sandbox exec` hands its command to it over a socket in the
 * read-only mount instead of a `docker exec`, then passes it on. Through the real CLI and engine:
 *
 * - it runs the command as a `docker exec` would: stdout, stderr, exit code, stdin whole, the
 *   working directory and variables asked for — set for that command only, never for the next;
 *   what the command leaves running dies with it; the same process serves the next command;
 * - the agent reads neither its key nor its environment; killed by the agent, the next command
 *   runs the usual way and leaves a new one;
 * - the agent's connections to its job socket (a wrong key, garbage, silence held open) do not pass
 *   for it: with it held still, the command runs once, the usual way, and the wrapper is stopped;
 * - a run's lease does not count it while it waits, and does while it runs a command.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { PROXY_MOUNT_PATH } from "../../lib/sandbox/proxy_mount.ts";
import { assertDocker, dockerTest, explain, removeProfile, runCli, tempDir, uniqueProfile, writeConfig } from "../_helpers.ts";
import { squatScript } from "../_squat.ts";
import { waitingWrapper } from "../_waiting_wrapper.ts";

console.error("security: waiting exec tests starting");

/** `sh -c script` as the agent (the sandbox user), outside any wrapper: its stdout. */
async function asAgent(container: string, script: string): Promise<string> {
  const result = await run(["docker", "exec", "--user", "10001", container, "sh", "-c", script], { timeoutMs: 60_000 });
  assert.equal(result.exitCode, 0, explain(result));
  return result.stdout;
}

/** The agent's attempt on the job socket: a wrong key in each role, garbage, silence. */
const SQUAT = squatScript("job.sock", ["c", "o", "e"].map((role) => `${"0".repeat(64)} ${role}\n`).concat(["garbage\n", ""]));

Deno.test({
  name:
    "a waiting command wrapper: runs each command as a docker exec would and is passed on; the agent neither reads its key nor passes for it; a lease counts it only while it runs a command",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using dir = await tempDir();
    const profile = uniqueProfile("sec-waiting-exec");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
    const env = { SANDBOX_TRACE: "1" };
    const exec = (args: string[], stdin?: string) => runCli(["exec", "-p", profile, ...args], { config, env, stdin });
    try {
      const up = await runCli(["up", "-p", profile, "--json"], { config });
      assert.equal(up.exitCode, 0, explain(up));
      const container = JSON.parse(up.stdout).name as string;
      let waiting = await waitingWrapper(container);
      assert.ok(waiting, "up left no wrapper waiting");

      await t.step("it runs the command as a docker exec would, and the same process serves the next", async () => {
        const result = await exec(["--cwd", "/tmp", "-e", "MARK=one", "--", "sh", "-c", 'cat; pwd; echo "$MARK"; echo err >&2; exit 7'], "a\nb\n");
        assert.equal(result.exitCode, 7, explain(result));
        assert.equal(result.stdout, "a\nb\n/tmp\none\n", explain(result));
        assert.match(result.stderr, /^err$/m, explain(result));
        assert.match(result.stderr, /waiting exec: connected/, explain(result));
        const next = await exec(["--", "sh", "-c", 'pwd; echo "${MARK:-unset}" "${SANDBOX_EXEC_KEY:-no-key}"']);
        assert.equal(next.exitCode, 0, explain(next));
        // Its directory and variables were the command's alone.
        assert.equal(next.stdout, "/workspace\nunset no-key\n", explain(next));
        assert.match(next.stderr, /waiting exec: connected/, explain(next));
        const after = await waitingWrapper(container);
        assert.equal(after?.pid, waiting!.pid, "the wrapper was not passed on");
      });

      await t.step("what a command leaves running dies with it; the wrapper lives on", async () => {
        const result = await exec(["--", "sh", "-c", "setsid sleep 301 >/dev/null 2>&1 & nohup sleep 302 >/dev/null 2>&1 & echo started"]);
        assert.equal(result.stdout, "started\n", explain(result));
        assert.match(result.stderr, /waiting exec: connected/, explain(result));
        const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "args="]);
        assert.doesNotMatch(ps.stdout, /sleep 30[12]/, ps.stdout);
        assert.equal((await waitingWrapper(container))?.pid, waiting!.pid);
      });

      await t.step("a command past its timeout is killed, tree and wrapper; the next runs the usual way and leaves a new one", async () => {
        const result = await exec(["--timeout", "1s", "--", "sh", "-c", "sleep 303 & sleep 304"]);
        assert.notEqual(result.exitCode, 0, explain(result));
        assert.match(result.stderr, /timed out/, explain(result));
        assert.match(result.stderr, /waiting exec: connected/, explain(result));
        const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "args="]);
        assert.doesNotMatch(ps.stdout, /sleep 30[34]/, ps.stdout);
        const next = await exec(["--", "echo", "next"]);
        assert.equal(next.stdout, "next\n", explain(next));
        waiting = await waitingWrapper(container);
        assert.ok(waiting, "no wrapper was left for the next command");
      });

      await t.step("the agent reads neither its key nor its environment", async () => {
        const lines = await asAgent(
          container,
          `cat /proc/${waiting!.pid}/environ >/dev/null 2>&1 && echo environ-read || echo environ-refused
           grep -rlsF '${waiting!.key}' / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -1 | grep -q . && echo key-found || echo key-not-found`,
        );
        assert.equal(lines, "environ-refused\nkey-not-found\n");
        // The twin: a process of the agent's own is readable.
        assert.equal(await asAgent(container, "env MARK=own sleep 5 & own=$!; sleep 0.3; tr '\\0' '\\n' </proc/$own/environ | grep -c '^MARK=own$'; kill $own"), "1\n");
      });

      await t.step("a wrapper that started dumpable (on a readable perl) refuses to wait: its key may have been read", async () => {
        const key = "ab".repeat(32);
        // Watching the waiting wrapper's own directory: no job comes there meanwhile.
        const args = ["--waiting", "waiting-dumpable", `${PROXY_MOUNT_PATH}/${waiting!.dir}`];
        const started = (perl: string) =>
          run(["docker", "exec", "--user", "10001", "--env", `SANDBOX_EXEC_KEY=${key}`, container, "timeout", "2", perl, "/usr/local/bin/sandbox-exec", ...args]);
        const readable = await started("/usr/bin/perl");
        assert.equal(readable.exitCode, 2, explain(readable));
        assert.match(readable.stderr, /started dumpable/, explain(readable));
        // The twin: on its own interpreter it waits (until `timeout` ends it: 124).
        const own = await started("/usr/local/libexec/sandbox-perl");
        assert.equal(own.exitCode, 124, explain(own));
      });

      await t.step("the agent's connections to its job socket do not pass for it: held still, it is passed over, and the command runs once the usual way", async () => {
        await asAgent(container, `cat > /tmp/squat.js <<'EOF'\n${SQUAT}\nEOF`);
        const stopped = await run(["docker", "exec", "--user", "10001", container, "kill", "-STOP", String(waiting!.pid)]);
        assert.equal(stopped.exitCode, 0, stopped.stderr);
        const squatting = run(
          ["docker", "exec", "--user", "10001", container, "deno", "run", "--quiet", "--no-config", "-A", "/tmp/squat.js", `${PROXY_MOUNT_PATH}/${waiting!.dir}`, "4"],
          { timeoutMs: 60_000 },
        );
        await new Promise((resolve) => setTimeout(resolve, 500));
        const count = `/tmp/ran-${crypto.randomUUID()}`;
        const result = await exec(["--", "sh", "-c", `echo ran >> ${count}; wc -l < ${count}`]);
        assert.equal(result.exitCode, 0, explain(result));
        assert.equal(result.stdout.trim(), "1", explain(result));
        assert.match(result.stderr, /waiting exec: did not connect/, explain(result));
        const squatted = await squatting;
        assert.ok(Number(squatted.stdout.trim()) > 0, `the agent never reached the job socket: ${explain(squatted)}`);
        const gone = await run(["docker", "exec", "--user", "0", container, "test", "-d", `/proc/${waiting!.pid}`]);
        assert.notEqual(gone.exitCode, 0, "the wrapper that did not connect was not stopped");
        // That command's end left a new one, which the next command takes.
        waiting = await waitingWrapper(container);
        assert.ok(waiting, "no wrapper was left for the next command");
        const next = await exec(["--", "true"]);
        assert.match(next.stderr, /waiting exec: connected/, explain(next));
      });

      await t.step("killed by the agent, the next command runs the usual way and leaves a new one", async () => {
        waiting = await waitingWrapper(container);
        await asAgent(container, `kill -9 ${waiting!.pid}`);
        const result = await exec(["--", "echo", "still"]);
        assert.equal(result.stdout, "still\n", explain(result));
        assert.match(result.stderr, /waiting exec: (found dead|did not connect)/, explain(result));
        const fresh = await waitingWrapper(container);
        assert.ok(fresh && fresh.pid !== waiting!.pid, "no new wrapper was left");
        waiting = fresh;
      });

      await t.step("a run's lease does not count it while it waits, and does while it runs a command", async () => {
        // A lease as a run takes it (its stdin empty: released at once when granted).
        const lease = () =>
          run(["docker", "exec", "--user", "10001", container, "sandbox-exec", "--lease", `lease-test-${crypto.randomUUID()}`, "5"], {
            timeoutMs: 60_000,
          });
        const idle = await lease();
        assert.match(idle.stdout, /^leased$/m, explain(idle));
        const running = exec(["--", "sleep", "4"]);
        // The command is on its way once the wrapper has it: wait for the wrapper to have a child.
        for (let i = 0; i < 100; i++) {
          const children = await run(["docker", "exec", "--user", "0", container, "ps", "-o", "pid=", "--ppid", String(waiting!.pid)]);
          if (children.stdout.trim()) break;
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        const busy = await lease();
        assert.equal(busy.exitCode, 75, explain(busy));
        assert.match(busy.stdout, /^busy$/m, explain(busy));
        const ran = await running;
        assert.equal(ran.exitCode, 0, explain(ran));
        assert.match(ran.stderr, /waiting exec: connected/, explain(ran));
      });
    } finally {
      await removeProfile(profile);
    }
  },
});
