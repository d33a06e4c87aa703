/**
 * Attack: leave a process behind that outlives the run or exec that started it, to spy on the
 * next one (issue 9, item 4). The agent's side does what real code does to detach: `setsid -f`,
 * a double fork, `nohup … &`, a classic daemon (fork, setsid, fork, close everything), and
 * killing its own wrapper so that its children are orphaned to init. Every escapee is a `sleep`
 * with its own duration, so `ps` names it.
 *
 * Each test first sees the escapees alive (they did leave their process group, or their wrapper)
 * and then sees them gone; and where a defence is only the last line, its twin shows the escape
 * working without it.
 */
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { run } from "../../lib/process.ts";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import { text, toolCall } from "../_fake_llm.ts";
import { HeldLlm } from "../_held_llm.ts";
import {
  assertDocker,
  dockerTest,
  explain,
  profileContainers,
  removeProfile,
  runCli,
  spawnCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";

console.error("security: leftover process tests starting");

/**
 * Shell that starts five detached `sleep N` (N = base+1 … base+5), each by another trick. Each
 * lets go of the command's output, as a daemon does, so that the command itself can end.
 */
function escapes(base: number): string {
  const [a, b, c, d, e] = [1, 2, 3, 4, 5].map((i) => base + i);
  const quiet = "</dev/null >/dev/null 2>&1";
  return [
    `setsid -f sleep ${a} ${quiet}`,
    `(sleep ${b} ${quiet} &)`,
    `nohup sleep ${c} ${quiet} &`,
    `sh -c 'sleep ${d} ${quiet} & exit 0'`,
    // A classic daemon: fork, new session, fork again, no inherited descriptors.
    `perl -MPOSIX -e 'exit if fork; POSIX::setsid(); exit if fork; close STDIN; close STDOUT; close STDERR; exec "sleep", "${e}"'`,
    "echo ESCAPES-STARTED",
  ].join("\n");
}

/** The `sleep NNNN` commands among the sandbox's processes, read as root from outside. */
async function sleepers(container: string): Promise<string[]> {
  const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "args="]);
  assert.equal(ps.exitCode, 0, ps.stderr);
  assert.match(ps.stdout, /ps -eo args=/, "ps did not list itself: the check would prove nothing");
  return ps.stdout.split("\n").filter((line) => /^sleep \d{4}$/.test(line)).sort();
}

function sleeps(base: number): string[] {
  return [1, 2, 3, 4, 5].map((i) => `sleep ${base + i}`);
}

/**
 * A running sandbox of a fresh profile, removed on dispose; `cli` runs the CLI on the same
 * profile (its config file, a private state directory).
 */
async function sandbox(prefix: string) {
  assertDocker();
  const dir = await tempDir(`sandbox-${prefix}-`);
  const name = uniqueProfile(prefix);
  const yaml = `profiles:\n  ${name}: {}\n`;
  const config = await writeConfig(dir.path, yaml);
  const parsed = parseConfig(yaml, config, () => undefined);
  if (parsed.kind !== "ok") throw new Error(JSON.stringify(parsed.issues));
  const provider = new DockerSandboxProvider(resolveProfile(parsed.config, name));
  await provider.ensureRunning();
  return Object.assign(provider, {
    cli: (args: string[]) =>
      runCli(args, {
        config,
        env: { XDG_STATE_HOME: `${dir.path}/state`, OPENAI_API_KEY: "sk-unused-by-exec" },
        timeoutMs: CLI_TIMEOUT_MS,
      }),
    async [Symbol.asyncDispose]() {
      await removeProfile(name);
      await dir[Symbol.asyncDispose]();
    },
  });
}

Deno.test({
  name:
    "what an agent detaches with setsid, a double fork, nohup or a daemon runs during its run and is gone after it",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new HeldLlm([
      toolCall("execute", { command: escapes(1000) }),
      text("Started them"),
    ]);
    await using fixture = await RunFixture.make({
      prefix: "sec-left",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_LEFT_KEY",
      prompt: "Start the helpers\n",
    });
    const held = llm.hold(2);
    const child = spawnCli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "ndjson",
    ], {
      config: fixture.config,
      env: fixture.env,
      timeoutMs: CLI_TIMEOUT_MS,
    });
    const output = new Response(child.stdout).text();
    const toolResults = await Promise.race([
      held,
      child.finished.then((ended) =>
        Promise.reject(
          new Error(`the run ended before its second LLM request\n${ended.stderrTail}`),
        )
      ),
    ]);
    assert.match(toolResults, /ESCAPES-STARTED/);

    // The run's own container: no other run or exec has one like it, and it goes with the run.
    const container = await fixture.liveContainer();
    await t.step("while the run is live, all five are running", async () => {
      assert.deepEqual(await sleepers(container), sleeps(1000));
    });

    llm.release();
    const [stdout, ended] = await Promise.all([output, child.finished]);
    assert.equal(ended.exitCode, 0, `${stdout}\n${ended.stderrTail}`);

    await t.step(
      "after the run, its container is gone with them, and none runs in any other container of the profile",
      async () => {
        let inspected = 0;
        for (
          ;
          inspected < 300 &&
          (await run(["docker", "container", "inspect", container])).exitCode === 0;
          inspected++
        ) {
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
        assert.ok(inspected < 300, `the run's container ${container} is still there`);
        const others = await profileContainers(fixture.profile);
        for (const name of others) assert.deepEqual(await sleepers(name), [], name);
      },
    );
  },
});

Deno.test({
  name: "a command's detached processes die when its exec ends, even with no sweep after it",
  ...dockerTest(),
  async fn(t) {
    await using box = await sandbox("sec-exec");

    await t.step("under the wrapper (a subreaper) the escapees end with the command", async () => {
      const result = await box.exec(["sh", "-c", escapes(2000)]);
      assert.equal(result.exitCode, 0, result.stderr);
      assert.equal(result.stdout.trim(), "ESCAPES-STARTED");
      assert.deepEqual(await sleepers(box.containerName), []);
    });

    await t.step(
      "twin: the same command without the wrapper leaves them all running, until a sweep",
      async () => {
        const plain = await run([
          "docker",
          "exec",
          "--user",
          "10001",
          box.containerName,
          "sh",
          "-c",
          escapes(2100),
        ]);
        assert.equal(plain.exitCode, 0, plain.stderr);
        assert.deepEqual(await sleepers(box.containerName), sleeps(2100));
        await box.sweep();
        assert.deepEqual(await sleepers(box.containerName), []);
      },
    );
  },
});

/** Shell: start `sleep N` detached, then SIGKILL the wrapper this command runs under. */
function killOwnWrapper(n: number): string {
  return `setsid -f sleep ${n} </dev/null >/dev/null 2>&1; p=$$; ` +
    `while q=$(ps -o ppid= -p "$p" | tr -d ' ') && [ "$q" != 0 ]; do p=$q; done; ` +
    `echo "killing wrapper $p: $(tr '\\0' ' ' </proc/$p/cmdline)"; kill -9 "$p"; sleep 5`;
}

Deno.test({
  name:
    "a command that kills its own wrapper orphans its children only until the sweep that ends every exec",
  ...dockerTest(),
  async fn(t) {
    await using box = await sandbox("sec-wrap");

    await t.step("the escape works: the wrapper is killed, the orphan runs on", async () => {
      const result = await box.exec(["sh", "-c", killOwnWrapper(3001)]);
      assert.match(
        result.stdout,
        /killing wrapper \d+: \/usr\/local\/libexec\/sandbox-perl \/usr\/local\/bin\/sandbox-exec /,
      );
      assert.equal(result.exitCode, 137, result.stderr);
      assert.deepEqual(await sleepers(box.containerName), ["sleep 3001"]);
    });

    await t.step("the sweep kills it", async () => {
      await box.sweep();
      assert.deepEqual(await sleepers(box.containerName), []);
    });

    await t.step(
      "nor does an orphan the agent made undumpable, or dressed as a wrapper: only what was started from outside is spared",
      async () => {
        // Its own run of the wrappers' perl (undumpable as they are), and a wrapper it started itself.
        const quiet = "</dev/null >/dev/null 2>&1";
        const result = await box.exec([
          "sh",
          "-c",
          [
            `setsid -f /usr/local/libexec/sandbox-perl -e '$0 = "sleep 3011"; sleep 300' ${quiet}`,
            `setsid -f /usr/local/bin/sandbox-exec fake-3012 sleep 3012 ${quiet}`,
            killOwnWrapper(3013),
          ].join("; "),
        ]);
        assert.equal(result.exitCode, 137, result.stderr);
        assert.deepEqual(await sleepers(box.containerName), [
          "sleep 3011",
          "sleep 3012",
          "sleep 3013",
        ]);
        const premise = await box.exec([
          "sh",
          "-c",
          "for p in $(pgrep -x -f 'sleep 3011'); do cat /proc/$p/environ >/dev/null 2>&1 && echo readable || echo undumpable; done",
        ]);
        assert.equal(premise.stdout, "undumpable\n", premise.stderr);
        await box.sweep();
        assert.deepEqual(await sleepers(box.containerName), []);
      },
    );

    await t.step("`sandbox exec` sweeps when it ends: nothing survives it", async () => {
      const result = await box.cli([
        "exec",
        "-p",
        box.profile.name,
        "--",
        "sh",
        "-c",
        killOwnWrapper(3002),
      ]);
      assert.match(result.stdout, /killing wrapper/, explain(result));
      assert.deepEqual(await sleepers(box.containerName), []);
    });

    await t.step("the sweep keeps what live commands are running", async () => {
      const live = box.execStream([
        "sh",
        "-c",
        "setsid -f sleep 3003 </dev/null >/dev/null 2>&1; echo up; sleep 3030",
      ]);
      const iterator = live[Symbol.asyncIterator]();
      assert.equal((await iterator.next()).value, "up");
      await box.sweep();
      assert.deepEqual(await sleepers(box.containerName), ["sleep 3003", "sleep 3030"]);
      await iterator.return?.(undefined);
      await live.outcome.catch(() => {});
      assert.deepEqual(await sleepers(box.containerName), []);
    });

    await t.step(
      "a sweep keeps a command whose wrapper is only starting (sweeps and starts side by side)",
      async () => {
        // Other commands' ends sweep while a command starts (two `sandbox exec` at once, say): a
        // wrapper is live from its exec on, never taken for a leftover.
        // Here, sweeps back to back inside the container, while commands start one after another.
        const sweeping = box.execStream([
          "sh",
          "-c",
          "echo up; while :; do sandbox-exec --sweep >/dev/null; done",
        ]);
        const iterator = sweeping[Symbol.asyncIterator]();
        assert.equal((await iterator.next()).value, "up");
        try {
          for (let i = 0; i < 20; i++) {
            const result = await box.exec(["sh", "-c", "echo ran"]);
            assert.deepEqual(
              [result.exitCode, result.stdout],
              [0, "ran\n"],
              `start ${i}: ${result.stderr}`,
            );
          }
        } finally {
          await iterator.return?.(undefined);
          await sweeping.outcome.catch(() => {});
        }
      },
    );
  },
});

Deno.test({
  name:
    "nothing in the sandbox can ptrace init or a wrapper (to run code in a protected tree), or read their environment",
  ...dockerTest(),
  async fn(t) {
    await using box = await sandbox("sec-ptrace");
    const live = box.execStream(["sh", "-c", "echo up; exec sleep 40"]);
    const iterator = live[Symbol.asyncIterator]();
    assert.equal((await iterator.next()).value, "up");
    try {
      const table = await box.exec(["ps", "-eo", "pid=,ppid=,args="]);
      const rows = table.stdout.split("\n").map((l) => l.trim().split(/\s+/)).filter((r) =>
        r.length > 2
      );
      const wrapper = rows.find((r) =>
        r[1] === "0" && r.join(" ").includes("sandbox-exec") &&
        r.join(" ").endsWith("echo up; exec sleep 40")
      );
      const sleeper = rows.find((r) => r.slice(2).join(" ") === "sleep 40");
      assert.ok(wrapper && sleeper, table.stdout);
      // PTRACE_ATTACH (16) from the sandbox user; the syscall number by architecture.
      const attach = (pid: string) =>
        box.exec([
          "perl",
          "-e",
          `my $n = (\`uname -m\` =~ /aarch64/) ? 117 : 101; my $pid = ${Number(pid)};
          if (syscall($n, 16, $pid, 0, 0) == 0) { waitpid($pid, 0); syscall($n, 17, $pid, 0, 0); print "attached\\n" }
          else { print "refused: $!\\n" }`,
        ]);

      await t.step("init and the wrapper refuse ptrace", async () => {
        assert.match((await attach("1")).stdout, /^refused: Operation not permitted/);
        assert.match((await attach(wrapper[0])).stdout, /^refused: Operation not permitted/);
      });
      await t.step("twin: an ordinary process of the same user can be attached", async () => {
        assert.equal((await attach(sleeper[0])).stdout, "attached\n");
      });
      await t.step(
        "a wrapper is so from its exec on: the agent, watching for new ones, attaches to none and reads no environment",
        async () => {
          // As the agent: every new process whose command is `sandbox-exec ... true` (the host's,
          // below) is tried the moment it is seen, while perl is still compiling the wrapper.
          const watcher = box.execStream([
            "perl",
            "-e",
            `
          my $n = (\`uname -m\` =~ /aarch64/) ? 117 : 101;
          my %done = map { $_ => 1 } grep { /^\\d+$/ } do { opendir(my $d, "/proc"); readdir $d };
          my ($seen, $read, $attached) = (0, 0, 0);
          $| = 1;
          print "watching\\n";
          my $until = time + 20;
          while (time < $until && !-e "/tmp/.watched") {
            opendir(my $d, "/proc") or next;
            for my $pid (grep { /^\\d+$/ && !$done{$_} } readdir $d) {
              open(my $c, "<", "/proc/$pid/cmdline") or next;
              my $cmd = do { local $/; <$c> } // "";
              # Not exec'd yet (runc's init): looked at again next round.
              next unless $cmd =~ /sandbox-exec\\0[^\\0]+\\0true\\0$/;
              # The wrapper (started from outside: ppid 0), not its child before it execs true.
              open(my $s, "<", "/proc/$pid/stat") or next;
              next unless (do { local $/; <$s> } // "") =~ /\\) \\S 0 /s;
              $done{$pid} = 1;
              $seen++;
              if (open(my $e, "<", "/proc/$pid/environ")) { $read++ if length(do { local $/; <$e> } // "") }
              if (syscall($n, 16, $pid, 0, 0) == 0) { $attached++; waitpid($pid, 0); syscall($n, 17, $pid, 0, 0) }
            }
          }
          print "seen $seen read $read attached $attached\\n";
        `,
          ]);
          const lines = watcher[Symbol.asyncIterator]();
          assert.equal((await lines.next()).value, "watching");
          for (let i = 0; i < 40; i++) assert.equal((await box.exec(["true"])).exitCode, 0);
          await box.exec(["touch", "/tmp/.watched"]);
          let verdict = "";
          for (let line = await lines.next(); !line.done; line = await lines.next()) {
            verdict += line.value;
          }
          assert.equal((await watcher.outcome).exitCode, 0, verdict);
          const [seen, read, attached] =
            (verdict.match(/^seen (\d+) read (\d+) attached (\d+)$/) ?? []).slice(1).map(Number);
          // It saw them start (else it proves nothing), and got nothing of any.
          assert.ok(seen >= 20, `the watcher saw ${seen} of 40 wrappers: ${verdict}`);
          assert.equal(read, 0, verdict);
          assert.equal(attached, 0, verdict);
        },
      );
      await t.step("their environment is unreadable; an ordinary one's is readable", async () => {
        const read = await box.exec([
          "sh",
          "-c",
          `cat /proc/1/environ; cat /proc/${wrapper[0]}/environ; cat /proc/${
            sleeper[0]
          }/environ | tr '\\0' '\\n' | grep -c HOME=`,
        ]);
        assert.match(read.stderr, /\/proc\/1\/environ: Permission denied/);
        assert.match(read.stderr, new RegExp(`/proc/${wrapper[0]}/environ: Permission denied`));
        assert.equal(read.stdout, "1\n");
      });
    } finally {
      await iterator.return?.(undefined);
      await live.outcome.catch(() => {});
    }
  },
});
