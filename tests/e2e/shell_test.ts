/**
 * `sandbox shell` and durable sessions, driven in a real terminal (tmux) against the real engine:
 * typed commands and their output, the window size following a resize, Ctrl-C reaching the
 * program inside, the CLI killed while the session goes on, `attach` showing what happened
 * meanwhile and taking input, a second viewer, the exit status out, and the session's events in
 * the store. One profile of its own, removed afterwards, and a private state directory.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import {
  assertDocker,
  CLI,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { Tmux } from "../_tmux.ts";

Deno.test({
  name:
    "sandbox shell: a real terminal in a fresh sandbox, that outlives the CLI and is attached to again",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  assertDocker();
  console.log("shell_test: started");
  await using dir = await tempDir();
  const profile = uniqueProfile("shell");
  const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
  const env = { XDG_STATE_HOME: `${dir.path}/state` };
  const cli = [Deno.execPath(), "run", "-A", "--quiet", CLI, "-c", config];
  await using tmux = new Tmux();
  try {
    await tmux.start([...cli, "shell", "-p", profile], env);
    await t.step("a typed command's output is shown", async () => {
      await tmux.send("echo READY-$((6*7))", "Enter");
      await tmux.waitFor(/READY-42/);
    });
    await t.step("stty size follows the pane's size, and its resize", async () => {
      await tmux.send("stty size", "Enter");
      await tmux.waitFor(/^30 100$/m);
      await tmux.tmux("resize-window", "-t", "t", "-x", "120", "-y", "40");
      await tmux.send("clear; stty size", "Enter");
      await tmux.waitFor(/^40 120$/m);
    });
    await t.step("Ctrl-C interrupts a sleep inside", async () => {
      await tmux.send("sleep 600", "Enter");
      await tmux.waitFor(/\$ sleep 600\n/);
      await tmux.send("C-c");
      await tmux.send("echo AFTER-SLEEP-$?", "Enter");
      await tmux.waitFor(/AFTER-SLEEP-130/);
    });
    const id = await liveSession(cli, env);
    await t.step("the session goes on when the CLI is killed (SIGKILL)", async () => {
      await tmux.send("(sleep 2; echo MEANWHILE-$((2+3))) &", "Enter");
      const pane = (await tmux.tmux("display", "-p", "-t", "t", "#{pane_pid}")).trim();
      const child = (await run(["pgrep", "-P", pane])).stdout.trim().split("\n")[0];
      Deno.kill(Number(child), "SIGKILL");
      await tmux.waitFor(/CLI-EXITED-137/);
      const viaStore = await runCli(["logs", id, "--from", "1", "--format", "ndjson"], {
        env,
        config,
      });
      assert.equal(viaStore.exitCode, 0, explain(viaStore));
      assert.match(viaStore.stdout, /"type":"input"/);
      // What the shell printed with no viewer attached reaches the store all the same.
      while (
        !(await runCli(["logs", id, "--format", "ndjson"], { env, config })).stdout.includes(
          "MEANWHILE-5",
        )
      ) {
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      const runs = await runCli(["runs", "--json"], { env, config });
      assert.equal(JSON.parse(runs.stdout)[0].status, "running", explain(runs));
    });
    await t.step(
      "attach shows what happened, takes input; a viewer sees the same; exit 3 out",
      async () => {
        await tmux.tmux("kill-server");
        await tmux.start([...cli, "attach", id], env);
        await tmux.waitFor(/MEANWHILE-5/);
        await tmux.tmux(
          "new-window",
          "-t",
          "t",
          "env",
          `XDG_STATE_HOME=${env.XDG_STATE_HOME}`,
          "sh",
          "-c",
          `"$@"; echo "VIEWER-EXITED-$?"; sleep 600`,
          "sh",
          ...cli,
          "attach",
          "--view",
          id,
        );
        await tmux.tmux("send-keys", "-t", "t:0", "echo TWO-VIEWERS-$((1+1))", "Enter");
        await waitForWindow(tmux, "t:0", /TWO-VIEWERS-2/);
        const viewer = await waitForWindow(tmux, "t:1", /TWO-VIEWERS-2/);
        assert.match(viewer, /TWO-VIEWERS-2/);
        await tmux.tmux("send-keys", "-t", "t:0", "exit 3", "Enter");
        await waitForWindow(tmux, "t:0", /CLI-EXITED-3/);
        await waitForWindow(tmux, "t:1", /VIEWER-EXITED-3/);
      },
    );
    await t.step(
      "the session's record: ended with 3, every event in the store, replayed on attach",
      async () => {
        const runs = await runCli(["runs", "--json"], { env, config });
        const meta = JSON.parse(runs.stdout)[0];
        assert.equal(meta.mode, "shell");
        assert.equal(meta.exitCode, 3, explain(runs));
        const logs = await runCli(["logs", id, "--format", "ndjson"], { env, config });
        const events = logs.stdout.trim().split("\n").map((line) => JSON.parse(line));
        assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1));
        assert.match(events.at(-1).data, /Process exited with code 3/);
        assert.equal(events.at(-1).source, "system");
        const replay = await runCli(["attach", id], { env, config });
        assert.equal(replay.exitCode, 0, explain(replay));
        assert.match(replay.stdout, /MEANWHILE-5/);
        assert.match(replay.stderr, /has ended \(exit 3\)/);
      },
    );
  } finally {
    await removeProfile(profile);
  }
});

/** The live session's id, from `runs --json`. */
async function liveSession(cli: string[], env: Record<string, string>): Promise<string> {
  const runs = await run([...cli, "runs", "--json"], { env });
  const live = (JSON.parse(runs.stdout) as { id: string; mode: string; status: string }[])
    .find((r) => r.mode === "shell" && r.status === "running");
  assert.ok(live, explain(runs));
  return live.id;
}

async function waitForWindow(tmux: Tmux, target: string, pattern: RegExp): Promise<string> {
  while (true) {
    const text = await tmux.tmux("capture-pane", "-p", "-t", target, "-S", "-200");
    if (pattern.test(text)) return text;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

Deno.test("sandbox shell and attach refuse what they cannot do: no terminal, unknown id", async () => {
  await using dir = await tempDir();
  const env = { XDG_STATE_HOME: `${dir.path}/state` };
  const shell = await runCli(["shell"], { env, stdin: "" });
  assert.equal(shell.exitCode, 2, explain(shell));
  assert.match(shell.stderr, /^sandbox: error: sandbox shell needs a terminal: stdin is not one/m);
  const attach = await runCli(["attach", "20990101-000000-abcdef"], { env, stdin: "" });
  assert.equal(attach.exitCode, 2, explain(attach));
  assert.match(attach.stderr, /No session "20990101-000000-abcdef"/);
});
