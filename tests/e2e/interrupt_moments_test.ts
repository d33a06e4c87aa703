/**
 * Whatever moment a signal or an outside kill lands at, a run records the outcome it exits with and
 * says what happened: SIGINT as soon as the run has an id (its sandbox not yet there) and while its
 * branch comes back is an interrupt (130, "The run was interrupted", recorded `interrupted`); a
 * container killed with `docker kill` is named as such, not blamed on `resources.disk`. The real
 * CLI, a real engine, the scripted fake LLM on 127.0.0.1; the signal is sent on a line the CLI
 * prints (the run id on stderr, the result on stdout, the agent's command's tool call).
 */
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { LiveCli } from "../_live_cli.ts";
import { FakeLlm, type FakeStep, text, toolCall } from "../_fake_llm.ts";
import { run } from "../../lib/process.ts";
import { assertDocker, docker, dockerTest, explain } from "../_helpers.ts";

console.error("e2e: interrupt moment tests starting");

const KEY_ENV = "SANDBOX_E2E_INTERRUPT_KEY";

// deno-lint-ignore no-explicit-any
type Wire = Record<string, any>;

async function start(
  prefix: string,
  script: FakeStep[],
  extra: string[] = [],
  env: Record<string, string> = {},
  sandboxYaml?: string,
) {
  const llm = new FakeLlm(script);
  const fixture = await RunFixture.make({
    prefix,
    llmUrl: llm.baseUrl,
    keyEnv: KEY_ENV,
    prompt: "Work\n",
    sandboxYaml,
  });
  const cli = new LiveCli([
    "run",
    "agentic",
    "--prompt-file",
    fixture.promptFile,
    "--profile",
    fixture.profile,
    "--format",
    "ndjson",
    ...extra,
  ], { config: fixture.config, env: { ...fixture.env, ...env } });
  return {
    llm,
    fixture,
    cli,
    async [Symbol.asyncDispose]() {
      await cli[Symbol.asyncDispose]();
      await fixture[Symbol.asyncDispose]();
      await llm[Symbol.asyncDispose]();
    },
  };
}

/** What `pattern` captures in stderr, once it is there (polled: stderr arrives as it is written). */
async function stderrWhere(cli: LiveCli, pattern: RegExp): Promise<string> {
  let ended = false;
  cli.child.status.then(() => ended = true);
  while (!ended) {
    const found = pattern.exec(cli.stderr);
    if (found) return found[1] ?? found[0];
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  assert.fail(`the CLI ended before printing ${pattern}\n${cli.explain()}`);
}

function runIdOf(cli: LiveCli): Promise<string> {
  return stderrWhere(cli, /\brun (\S+) \(profile/);
}

/**
 * The closing record: one `result`, then `usage` last; the result is an error saying `says`, or,
 * when the run failed after its (successful) result was out, the usage's `content` says it.
 */
function assertClosing(
  lines: string[],
  says: RegExp,
  context: string,
  afterResult = false,
): void {
  const messages: Wire[] = lines.map((line) => JSON.parse(line));
  assert.equal(messages.filter((m) => m.type === "result").length, 1, context);
  const [result, usage] = messages.slice(-2);
  assert.equal(result.type, "result", context);
  assert.equal(usage.type, "usage", context);
  assert.equal(result.is_error, !afterResult, context);
  assert.match(afterResult ? usage.content : result.content, says, context);
}

async function listed(fixture: RunFixture, id: string): Promise<Wire> {
  const runs = await fixture.cli(["runs", "--json"]);
  assert.equal(runs.exitCode, 0, explain(runs));
  const meta = JSON.parse(runs.stdout).find((m: Wire) => m.id === id);
  assert.ok(meta, runs.stdout);
  return meta;
}

async function assertInterrupted(
  fixture: RunFixture,
  cli: LiveCli,
  id: string,
  afterResult = false,
): Promise<void> {
  const code = await cli.finish();
  const context = cli.explain(code);
  assert.equal(code, 130, context);
  assertClosing(cli.stdoutLines, /^The run was interrupted$/, context, afterResult);
  assert.match(cli.stderr, /^sandbox: error: The run was interrupted$/m, context);
  assert.doesNotMatch(cli.stderr, /Cannot inspect|object checks|error: (?!The run was)/, context);
  const meta = await listed(fixture, id);
  assert.equal(meta.status, "interrupted", context);
  assert.equal(meta.exitCode, 130, context);
  assert.equal(meta.error, "The run was interrupted", context);
}

Deno.test({
  name:
    "SIGINT the moment a run has its id (before its sandbox) exits 130, ends stdout with the interrupt and records it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using run = await start("e2e-int-early", [text("never reached")]);
    const id = await runIdOf(run.cli);
    Deno.kill(run.cli.pid, "SIGINT");
    await assertInterrupted(run.fixture, run.cli, id);
  },
});

Deno.test({
  name:
    "SIGINT while a run's branch comes back exits 130, records the interrupt, and keeps the work in its container",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const repo = await Deno.makeTempDir({ prefix: "sandbox-e2e-int-repo-" });
    try {
      for (
        const args of [
          ["init", "-q", "-b", "main"],
          [
            "-c",
            "user.name=O",
            "-c",
            "user.email=o@e.test",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "b",
          ],
        ]
      ) assert.equal((await run(["git", "-C", repo, ...args])).exitCode, 0);
      // A large, incompressible result: its pack takes a while to come back.
      await using live = await start(
        "e2e-int-return",
        [
          toolCall("execute", { command: "head -c 40000000 /dev/urandom > big.bin && echo made" }),
          text("done"),
        ],
        ["--repo", repo],
        { SANDBOX_TRACE: "1" },
      );
      const id = await runIdOf(live.cli);
      await stderrWhere(live.cli, /run: branch return/);
      Deno.kill(live.cli.pid, "SIGINT");
      await assertInterrupted(live.fixture, live.cli, id, true);
      const meta = await live.fixture.meta(id);
      assert.equal(meta.extra?.kept, true, `${JSON.stringify(meta)}\n${live.cli.explain()}`);
      assert.match(live.cli.stderr, /the run's work is kept in /, live.cli.explain());
    } finally {
      await Deno.remove(repo, { recursive: true });
    }
  },
});

Deno.test({
  name:
    "a run whose container is killed from outside fails with 125 naming the stopped sandbox, not resources.disk",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using live = await start("e2e-int-docker-kill", [
      toolCall("execute", { command: "sleep 600" }),
      text("never reached"),
    ]);
    const id = await runIdOf(live.cli);
    await live.cli.lineWhere((line) => JSON.parse(line).type === "tool_call");
    const container = await live.fixture.liveContainer();
    await docker("kill", container);
    const code = await live.cli.finish();
    const context = live.cli.explain(code);
    assert.equal(code, 125, context);
    const says = new RegExp(`^The run's sandbox "${container}" stopped during the run`);
    assertClosing(live.cli.stdoutLines, says, context);
    const line = /^sandbox: error: (.*)$/m.exec(live.cli.stderr)?.[1] ?? "";
    assert.match(line, says, context);
    assert.doesNotMatch(line, /resources\.disk|disk watch/, context);
    const meta = await listed(live.fixture, id);
    assert.equal(meta.status, "failed", context);
    assert.equal(meta.exitCode, 125, context);
    assert.match(meta.error, says, context);
  },
});

/**
 * What a SIGINT at `ms` after the CLI started the run's supervisor leads to, whatever phase it
 * lands in (the supervisor loading, the run starting, its sandbox being made): exit 130, one line saying so, no stack trace,
 * and `runs --json` agreeing with what the CLI said — the run it named recorded `interrupted`,
 * with stdout's closing record; or, when it named none, no run recorded and nothing on stdout.
 */
async function interruptAt(ms: number): Promise<void> {
  await using live = await start(`e2e-int-${ms}ms`, [text("never reached")], [], {
    SANDBOX_TRACE: "1",
  });
  await stderrWhere(live.cli, /cli: supervisor started/);
  await new Promise((resolve) => setTimeout(resolve, ms));
  Deno.kill(live.cli.pid, "SIGINT");
  const code = await live.cli.finish();
  const context = `SIGINT at ${ms} ms\n${live.cli.explain(code)}`;
  assert.equal(code, 130, context);
  assert.doesNotMatch(live.cli.stderr, /^\s+at |internal error|Uncaught/m, context);
  const id = /^sandbox: run (\S+) \(profile/m.exec(live.cli.stderr)?.[1];
  const said = live.cli.stderr.split("\n").filter((line) =>
    line !== "" && !/^sandbox: (run \S+ \(profile|trace )/.test(line)
  );
  const runs = await live.fixture.cli(["runs", "--json"]);
  assert.equal(runs.exitCode, 0, explain(runs));
  const recorded: Wire[] = JSON.parse(runs.stdout);
  assert.equal(said.length, 1, context);
  assert.match(said[0], /^sandbox: (error: The run was interrupted|interrupted)$/, context);
  if (id === undefined) {
    assert.deepEqual([recorded, live.cli.stdoutLines], [[], []], context);
    return;
  }
  assertClosing(live.cli.stdoutLines, /^The run was interrupted$/, context);
  assert.deepEqual(recorded.map((meta) => meta.id), [id], context);
  assert.equal(recorded[0].status, "interrupted", context);
  assert.equal(recorded[0].exitCode, 130, context);
}

for (const ms of [50, 150, 300]) {
  Deno.test({
    name:
      `SIGINT ${ms} ms after a run's supervisor started exits 130 with one line, no stack trace, and a record that agrees`,
    ...dockerTest(),
    async fn() {
      assertDocker();
      await interruptAt(ms);
    },
  });
}

/** Names of the docker objects (`container` or `volume`) labelled with `profile`. */
async function labelled(kind: "container" | "volume", profile: string): Promise<string[]> {
  const listed = await docker(
    kind,
    "ls",
    ...(kind === "container" ? ["--all"] : []),
    "--filter",
    `label=dev.sandbox.profile=${profile}`,
    "--format",
    kind === "container" ? "{{.Names}}" : "{{.Name}}",
  );
  return listed.split("\n").filter(Boolean);
}

Deno.test({
  name:
    "SIGINT while a run's own container is being made (pool 0) leaves no container or workspace volume behind",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using live = await start("e2e-int-cold", [text("never reached")], [], {}, "{pool: 0}");
    const id = await runIdOf(live.cli);
    let ended = false;
    live.cli.child.status.then(() => ended = true);
    // The moment the engine has made something of it (its volume, then its container).
    while (!ended && (await labelled("volume", live.fixture.profile)).length === 0) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    Deno.kill(live.cli.pid, "SIGINT");
    await assertInterrupted(live.fixture, live.cli, id);
    const meta = await live.fixture.meta(id);
    assert.equal(
      meta.extra?.container,
      `sandbox-${live.fixture.profile}-${id}`,
      JSON.stringify(meta),
    );
    const left = [
      ...await labelled("container", live.fixture.profile),
      ...await labelled("volume", live.fixture.profile),
    ];
    assert.deepEqual(left, [], live.cli.explain());
  },
});

Deno.test({
  name:
    "a --repo run whose container is killed fails with 125, keeps that container, and says where the agent's commit is",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const repo = await Deno.makeTempDir({ prefix: "sandbox-e2e-int-killed-repo-" });
    try {
      for (
        const args of [
          ["init", "-q", "-b", "main"],
          [
            "-c",
            "user.name=O",
            "-c",
            "user.email=o@e.test",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "b",
          ],
        ]
      ) assert.equal((await run(["git", "-C", repo, ...args])).exitCode, 0);
      await using live = await start(
        "e2e-int-killed-repo",
        [
          toolCall("execute", {
            command:
              "echo kept > work.txt && git add work.txt && git commit -qm 'agent work' && sleep 600",
          }),
          text("never reached"),
        ],
        ["--repo", repo],
      );
      const id = await runIdOf(live.cli);
      await live.cli.lineWhere((line) => JSON.parse(line).type === "tool_call");
      const container = await live.fixture.liveContainer();
      // The agent's command has committed once it sleeps.
      while (!(await docker("top", container)).includes("sleep 600")) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await docker("kill", container);
      const code = await live.cli.finish();
      const context = live.cli.explain(code);
      assert.equal(code, 125, context);
      assert.match(
        live.cli.stderr,
        new RegExp(`^sandbox: the run's work is kept in its stopped container ${container}: `, "m"),
        context,
      );
      const meta = await listed(live.fixture, id);
      assert.equal(meta.status, "failed", context);
      assert.equal(meta.exitCode, 125, context);
      assert.equal(meta.extra?.kept, true, context);
      assert.equal(meta.extra?.recovery?.outcome, "kept", context);
      assert.equal(meta.extra?.recovery?.container, container, context);
      // As said: start it, then copy the run's checkout out; its branch holds the agent's commit.
      await docker("start", container);
      const copy = `${live.fixture.dir.path}/copy`;
      const copied = await live.fixture.cli(["cp", `${id}:.`, copy]);
      assert.equal(copied.exitCode, 0, explain(copied));
      assert.equal(await Deno.readTextFile(`${copy}/work.txt`), "kept\n");
      const commit = await run(["git", "-C", copy, "cat-file", "-p", meta.extra.recovery.branch]);
      assert.match(commit.stdout, /^agent work$/m, explain(commit));
    } finally {
      await Deno.remove(repo, { recursive: true });
    }
  },
});
