/**
 * A run lives in a supervisor of its own: SIGKILL of the CLI leaves it going to its end (its
 * branch back, its events in the store for `attach`); `run --detach` prints its id and `attach
 * --from 0` replays every event in order; `stop ID` ends it; a run whose supervisor died reads as
 * crashed in `runs` and `runs --json`, its events intact, and `attach` says so. The real CLI, a
 * real engine, a real repository, the scripted fake LLM on 127.0.0.1 (held between two turns).
 */
import { git } from "../_git.ts";
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { HeldLlm } from "../_held_llm.ts";
import { LiveCli } from "../_live_cli.ts";
import { type FakeStep, text, toolCall } from "../_fake_llm.ts";
import { run } from "../../lib/process.ts";
import { assertDocker, dockerTest, explain, tempDir } from "../_helpers.ts";

console.error("e2e: durable run tests starting");

const KEY_ENV = "SANDBOX_E2E_DURABLE_KEY";
const USER_GIT = ["-c", "user.name=Owner", "-c", "user.email=o@example.test"];
const COMMIT = "echo work > work.txt && git add work.txt && git commit -qm 'agent work'";

/** A fixture with a repository, and an LLM that holds its second request (after the commit). */
async function start(prefix: string, script: FakeStep[]) {
  const held = new HeldLlm(script);
  const arrived = held.hold(2);
  const fixture = await RunFixture.make({
    prefix,
    llmUrl: held.baseUrl,
    keyEnv: KEY_ENV,
    prompt: "Work\n",
  });
  const repo = `${fixture.dir.path}/repo`;
  await Deno.mkdir(repo);
  await git(repo, "init", "-q", "-b", "main");
  await Deno.writeTextFile(`${repo}/README`, "base\n");
  await git(repo, "add", "-A");
  await git(repo, ...USER_GIT, "commit", "-qm", "base");
  const runArgs = (...extra: string[]) => [
    "run",
    "agentic",
    "--prompt-file",
    fixture.promptFile,
    "--profile",
    fixture.profile,
    "--repo",
    repo,
    "--format",
    "ndjson",
    ...extra,
  ];
  return {
    held,
    arrived,
    fixture,
    repo,
    runArgs,
    async [Symbol.asyncDispose]() {
      await held[Symbol.asyncDispose]();
      await fixture[Symbol.asyncDispose]();
    },
  };
}

type Started = Awaited<ReturnType<typeof start>>;

/** `run --detach --json`: the run's id. */
async function detach(s: Started): Promise<string> {
  const started = await s.fixture.cli(s.runArgs("--detach", "--json"));
  assert.equal(started.exitCode, 0, explain(started));
  const printed = JSON.parse(started.stdout) as { id: string; status: string };
  assert.equal(printed.status, "running", started.stdout);
  return printed.id;
}

/** `runs --json`'s record of run `id`. */
async function runRecord(s: Started, id: string): Promise<Record<string, unknown>> {
  const runs = await s.fixture.cli(["runs", "--json"]);
  assert.equal(runs.exitCode, 0, explain(runs));
  const found = (JSON.parse(runs.stdout) as { id: string }[]).find((r) => r.id === id);
  assert.ok(found, runs.stdout);
  return found as Record<string, unknown>;
}

function types(lines: string[]): string[] {
  return lines.filter(Boolean).map((line) => JSON.parse(line).type);
}

Deno.test({
  name:
    "a run goes on when its CLI is SIGKILLed: it finishes, its branch comes back, and attach shows what happened meanwhile",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using s = await start("durable-kill", [
      toolCall("execute", { command: COMMIT }),
      text("done"),
    ]);
    const cli = new LiveCli(s.runArgs(), { config: s.fixture.config, env: s.fixture.env });
    await using _cli = cli;
    await s.arrived;
    const id = /run (\S+) \(profile/.exec(cli.stderr)?.[1];
    assert.ok(id, cli.explain());
    Deno.kill(cli.pid, "SIGKILL");
    const killed = await cli.child.status;
    assert.equal(killed.signal, "SIGKILL");
    assert.equal((await runRecord(s, id)).status, "running", "the run ended with its CLI");
    s.held.release();
    const attach = await s.fixture.cli(["attach", id, "--from", "1"]);
    assert.equal(attach.exitCode, 0, explain(attach));
    const shown = types(attach.stdout.split("\n"));
    assert.deepEqual(shown.slice(-2), ["result", "usage"], attach.stdout);
    assert.ok(shown.includes("tool_result"), attach.stdout);
    // Followed to its end, or (the run quick once released) replayed whole after it ended.
    assert.match(attach.stderr, new RegExp(`run ${id} (has )?ended \\(succeeded, exit 0\\)`));
    const record = await runRecord(s, id);
    assert.equal(record.status, "succeeded", JSON.stringify(record));
    const branch = `sandbox/${id}`;
    assert.equal((record.extra as Record<string, unknown>).branch, branch);
    assert.equal(await git(s.repo, "log", "--format=%s", `main..${branch}`), "agent work");
  },
});

Deno.test({
  name:
    "run --detach prints the id; attach --from 0 replays every event in order, then says the run has ended; bad input is refused",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using s = await start("durable-detach", [
      toolCall("execute", { command: COMMIT }),
      text("done"),
    ]);
    s.held.release();
    const id = await detach(s);
    const followed = await s.fixture.cli(["attach", id, "--from", "0"]);
    assert.equal(followed.exitCode, 0, explain(followed));

    await t.step("the events replayed are the run's log, in order", async () => {
      const logs = await s.fixture.cli(["logs", id, "--format", "ndjson"]);
      assert.equal(logs.exitCode, 0, explain(logs));
      assert.equal(followed.stdout, logs.stdout);
      assert.deepEqual(types(followed.stdout.split("\n")).slice(-2), ["result", "usage"]);
    });

    await t.step("attaching to the finished run replays it and says so", async () => {
      const again = await s.fixture.cli(["attach", id, "--from", "0"]);
      assert.equal(again.exitCode, 0, explain(again));
      assert.equal(again.stdout, followed.stdout);
      assert.match(again.stderr, /has ended \(succeeded, exit 0\): replayed above/);
    });

    await t.step("the branch came back", async () => {
      assert.equal(await git(s.repo, "log", "--format=%s", `main..sandbox/${id}`), "agent work");
    });

    await t.step(
      "attach to an unknown id, stop a finished run, --json alone, a missing prompt detached",
      async () => {
        const unknown = await s.fixture.cli(["attach", "no-such-run"]);
        assert.equal(unknown.exitCode, 2, explain(unknown));
        assert.match(unknown.stderr, /^sandbox: .*No session "no-such-run"/m);
        const stop = await s.fixture.cli(["stop", id]);
        assert.equal(stop.exitCode, 2, explain(stop));
        assert.match(stop.stderr, new RegExp(`Run "${id}" is not running: it succeeded`));
        const json = await s.fixture.cli(s.runArgs("--json"));
        assert.equal(json.exitCode, 2, explain(json));
        assert.match(json.stderr, /--json is for run --detach/);
        const missing = `${s.fixture.dir.path}/missing.md`;
        const detached = await s.fixture.cli(
          ["run", "agentic", "--prompt-file", missing, "--profile", s.fixture.profile, "--detach"],
        );
        assert.equal(detached.exitCode, 2, explain(detached));
        assert.match(detached.stderr, /^sandbox: error: Cannot read prompt file ".*missing\.md"/m);
        assert.equal(detached.stdout, "", "an id was printed for a run that never started");
      },
    );
  },
});

Deno.test({
  name:
    "stop ID ends a detached run as Ctrl-C ends a run in the foreground: interrupted, its sandbox gone, no branch",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using s = await start("durable-stop", [
      toolCall("execute", { command: COMMIT }),
      text("done"),
    ]);
    const id = await detach(s);
    await s.arrived;
    const container = await s.fixture.liveContainer();
    const stop = await s.fixture.cli(["stop", id]);
    assert.equal(stop.exitCode, 0, explain(stop));
    assert.match(stop.stderr, new RegExp(`run ${id} stopped: interrupted \\(exit 130\\)`));
    const record = await runRecord(s, id);
    assert.equal(record.status, "interrupted", JSON.stringify(record));
    // Its sandbox goes by a detached process once the run has ended (docs/runs.md): awaited.
    let gone = false;
    for (let i = 0; i < 300 && !gone; i++) {
      gone = (await run(["docker", "container", "inspect", container])).exitCode !== 0;
      if (!gone) await new Promise((resolve) => setTimeout(resolve, 200));
    }
    assert.ok(gone, `the run's sandbox ${container} stayed`);
    // As for a run interrupted with Ctrl-C: nothing comes back half-done.
    assert.equal(await git(s.repo, "for-each-ref", "--format=%(refname)"), "refs/heads/main");
  },
});

Deno.test({
  name:
    "a run whose supervisor died reads as crashed in runs and runs --json, its events intact, and attach says so",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using s = await start("durable-crash", [
      toolCall("execute", { command: COMMIT }),
      text("done"),
    ]);
    const id = await detach(s);
    await s.arrived;
    const meta = await s.fixture.killSupervisor();
    assert.equal(meta.id, id);
    assert.equal((await runRecord(s, id)).status, "crashed");
    const table = await s.fixture.cli(["runs"]);
    assert.match(table.stdout, new RegExp(`${id} .* crashed`), table.stdout);
    const attach = await s.fixture.cli(["attach", id, "--from", "1"]);
    assert.equal(attach.exitCode, 1, explain(attach));
    const shown = types(attach.stdout.split("\n"));
    assert.ok(shown.includes("tool_result"), attach.stdout);
    assert.match(attach.stderr, new RegExp(`run ${id} crashed: its supervisor died`));
  },
});

Deno.test({
  name:
    "exec --detach runs a command in the background, recorded: attach shows its lines to its end, stop ends another",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using fixture = await RunFixture.make({
      prefix: "durable-exec",
      llmUrl: "http://127.0.0.1:9/v1",
      keyEnv: KEY_ENV,
      prompt: "unused\n",
    });
    const detachExec = async (...argv: string[]) => {
      const started = await fixture.cli([
        "exec",
        "-p",
        fixture.profile,
        "--detach",
        "--json",
        "--",
        ...argv,
      ]);
      assert.equal(started.exitCode, 0, explain(started));
      return (JSON.parse(started.stdout) as { id: string }).id;
    };

    await t.step("attach follows its stdout and stderr lines, then says how it ended", async () => {
      const id = await detachExec("sh", "-c", "echo one; echo two >&2; sleep 1; echo three");
      const attach = await fixture.cli(["attach", id]);
      assert.equal(attach.exitCode, 0, explain(attach));
      assert.match(attach.stdout, /^one\nthree\n\[Process exited with code 0 in \d+ms\]\n$/);
      assert.match(attach.stderr, /^two$/m);
      assert.match(attach.stderr, new RegExp(`command ${id} (has )?ended \\(succeeded, exit 0\\)`));
      assert.equal((await fixture.meta(id)).mode, "exec");
    });

    await t.step("stop ends a detached command as Ctrl-C would", async () => {
      const id = await detachExec("sleep", "300");
      const stop = await fixture.cli(["stop", id]);
      assert.equal(stop.exitCode, 0, explain(stop));
      assert.match(stop.stderr, new RegExp(`command ${id} stopped: interrupted \\(exit 130\\)`));
      const meta = await fixture.meta(id);
      assert.equal(meta.status, "interrupted", JSON.stringify(meta));
    });
  },
});

Deno.test({
  name:
    "a shell session whose supervisor died reads as crashed in runs --json, and attach replays what it recorded and says so",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await RunFixture.make({
      prefix: "durable-shell-crash",
      llmUrl: "http://127.0.0.1:9/v1",
      keyEnv: KEY_ENV,
      prompt: "unused\n",
    });
    // A short state directory: the viewers' socket path must fit in a sockaddr_un.
    await using state = await tempDir();
    const env = { XDG_STATE_HOME: state.path };
    const started = await fixture.cli(["shell", "-p", fixture.profile, "--detach"], env);
    assert.equal(started.exitCode, 0, explain(started));
    const id = started.stdout.trim();
    const record = async () => {
      const runs = await fixture.cli(["runs", "--json"], env);
      assert.equal(runs.exitCode, 0, explain(runs));
      const found = (JSON.parse(runs.stdout) as { id: string; status: string; pid: number }[])
        .find((r) => r.id === id);
      assert.ok(found, runs.stdout);
      return found;
    };
    const meta = await record();
    assert.equal(meta.status, "running", JSON.stringify(meta));
    Deno.kill(meta.pid, "SIGKILL");
    assert.equal((await record()).status, "crashed");
    const attach = await fixture.cli(["attach", id], env);
    assert.equal(attach.exitCode, 1, explain(attach));
    assert.match(attach.stderr, new RegExp(`session ${id} is over: its supervisor died`));
  },
});
