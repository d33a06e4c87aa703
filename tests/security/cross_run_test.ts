/**
 * Attack: reach a later run from an earlier one (issue 23). Run 1's agent, on repository A, leaves
 * a note, listeners on every path it can bind (the old spare socket and the pool worker's socket
 * among them) that log whatever connects, a `setsid` spy that copies every `SANDBOX_LLM_TOKEN` it
 * can read from `/proc/*\/environ`, stops with SIGSTOP every process of its uid it can see (but
 * its own chain and the connector carrying its output), and leaves a survivor that stops
 * everything a moment after the run. Then run 2, on the same repository, looks for all of it.
 *
 * What must hold: each run is in a container no other run has touched, destroyed after it. Run 2's
 * result is genuine (the fake LLM's own answer, its own token on the requests), nothing of run 1
 * is in its view, and no process of run 1 exists anywhere afterwards. The twin: run 1's spy and
 * listeners work while run 1 lives (they caught run 1's own token).
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, CLI, docker, dockerTest, explain } from "../_helpers.ts";
import { RunFixture } from "../_run_fixture.ts";

console.error("security: cross-run tests starting");

const LISTEN =
  `perl -MIO::Socket::UNIX -e 'unlink $ARGV[0]; my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => $ARGV[0], Listen => 5) or exit 1; while (my $c = $s->accept) { open(my $f, ">>", "/workspace/caught.log"); print $f scalar <$c> }'`;
const SOCKETS = [
  "/tmp/.sandbox-spare.sock",
  "/tmp/.sandbox-worker.sock",
  "/tmp/.sandbox-exec/x.sock",
  "/workspace/.sandbox-worker.sock",
  // Where a pooled worker takes its job: only the host can make it (a read-only mount).
  "/run/sandbox-proxy/worker/job.sock",
];

const ATTACK = [
  "echo A-NOTES-SECRET >/workspace/a-notes.txt",
  ...SOCKETS.map((path) =>
    `mkdir -p "$(dirname ${path})"; setsid -f ${LISTEN} ${path} </dev/null >/dev/null 2>&1`
  ),
  `setsid -f sh -c 'while :; do for f in /proc/[0-9]*/environ; do tr "\\0" "\\n" <"$f" 2>/dev/null | grep "^SANDBOX_LLM_TOKEN=" >>/workspace/spy.log; done; sleep 0.2; done' </dev/null >/dev/null 2>&1`,
  `setsid -f sh -c 'sleep 3; kill -STOP -1' </dev/null >/dev/null 2>&1`,
  "sleep 1",
  // Every process of this uid but this command's chain (the worker carrying the output among it).
  `chain=" $$ $PPID "; p=$PPID; while [ "$p" -gt 1 ]; do p=$(awk '{print $4}' /proc/$p/stat); chain="$chain$p "; done`,
  `for d in /proc/[0-9]*; do pid=\${d#/proc/}; case "$chain" in *" $pid "*) continue;; esac; kill -STOP $pid 2>/dev/null && echo STOPPED $pid; done`,
  "sleep 1",
  "echo OWN=$SANDBOX_LLM_TOKEN",
  "echo HOST=$(hostname)",
  "echo SPY-LOG; sort -u /workspace/spy.log; echo SPY-LOG-END",
].join("\n");

const LOOK = [
  "echo OWN=$SANDBOX_LLM_TOKEN",
  "echo HOST=$(hostname)",
  "sleep 1",
  "echo FOUND; ls /workspace/a-notes.txt /workspace/spy.log /workspace/caught.log " +
  SOCKETS.join(" ") + " 2>/dev/null; echo FOUND-END",
  "echo PS; ps -eo args; echo PS-END",
].join("\n");

function between(output: string, start: string, end: string): string[] {
  const from = output.indexOf(`${start}\n`);
  const to = output.indexOf(end, from);
  assert.ok(from >= 0 && to > from, `no ${start}…${end} in:\n${output}`);
  return output.slice(from + start.length + 1, to).split("\n").filter(Boolean);
}

function field(output: string, name: string): string {
  const match = new RegExp(`^${name}=(\\S+)$`, "m").exec(output);
  assert.ok(match, `no ${name}= in:\n${output}`);
  return match[1];
}

async function gitRepo(path: string): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  const git = (...args: string[]) =>
    run(["git", "-C", path, "-c", "user.name=u", "-c", "user.email=u@x", ...args]);
  assert.equal((await git("init", "-q", "-b", "main")).exitCode, 0);
  await Deno.writeTextFile(`${path}/a.txt`, "a\n");
  await git("add", ".");
  assert.equal((await git("commit", "-qm", "init")).exitCode, 0);
  return path;
}

/** Containers of `profile`, once every one not in `keep` is gone (removal is detached). */
async function containersSettled(profile: string, gone: string[]): Promise<string[]> {
  for (let i = 0; i < 100; i++) {
    const names = (await docker(
      "ps",
      "-a",
      "--filter",
      `label=dev.sandbox.profile=${profile}`,
      "--format",
      "{{.Names}}",
    )).split("\n").filter(Boolean);
    if (!names.some((name) => gone.includes(name))) return names;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`containers ${gone.join(", ")} of ${profile} were not removed`);
}

/** Every process in every container of `profile` (`docker top`), as command lines. */
async function processesOf(names: string[]): Promise<string[]> {
  const all: string[] = [];
  for (const name of names) {
    all.push(...(await docker("top", name, "-eo", "pid,args")).split("\n").slice(1));
  }
  return all;
}

Deno.test({
  name:
    "a run's agent that stops, squats and spies leaves nothing the next run on the same repository meets: that run's result is genuine and no process of the first exists afterwards",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-xrun",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_XRUN_KEY",
      prompt: "Work\n",
    });
    const repo = await gitRepo(`${fixture.dir.path}/repo-a`);
    const runOn = async (command: string, answer: string) => {
      llm.script.push(toolCall("execute", { command }), text(answer));
      const result = await fixture.cli([
        "run",
        "agentic",
        "--prompt-file",
        fixture.promptFile,
        "--profile",
        fixture.profile,
        "--repo",
        repo,
      ]);
      assert.equal(result.exitCode, 0, explain(result));
      const messages = result.stdout.trim().split("\n").map((line, i) =>
        decodeMessage(line, i + 1)
      );
      return { output: llm.lastToolOutput(), result: messages.find((m) => m.type === "result") };
    };

    const first = await runOn(ATTACK, "Done 1");
    const token1 = field(first.output, "OWN");
    await t.step(
      "twin: the spy and the stops work while run 1 lives (the spy caught run 1's own token)",
      () => {
        assert.match(token1, /^sbx_/);
        assert.deepEqual(between(first.output, "SPY-LOG", "SPY-LOG-END"), [
          `SANDBOX_LLM_TOKEN=${token1}`,
        ]);
        assert.match(first.output, /^STOPPED \d+$/m);
      },
    );

    const requestsBefore = llm.requests.length;
    const second = await runOn(LOOK, "Genuine answer 2");
    const token2 = field(second.output, "OWN");
    await t.step(
      "run 2's result is genuine: the fake LLM's answer, run 2's own token on its requests",
      () => {
        assert.equal(second.result?.content, "Genuine answer 2");
        assert.notEqual(token2, token1);
        assert.equal(
          llm.requests.length - requestsBefore,
          2,
          "run 2's own two turns reached the LLM",
        );
      },
    );
    await t.step(
      "run 2 is in another container, with nothing of run 1: no note, no spy, no listener",
      () => {
        assert.notEqual(field(second.output, "HOST"), field(first.output, "HOST"));
        assert.deepEqual(between(second.output, "FOUND", "FOUND-END"), []);
        const processes = between(second.output, "PS", "PS-END");
        assert.deepEqual(
          processes.filter((p) => /while|IO::Socket|kill -STOP/.test(p)),
          [],
          processes.join("\n"),
        );
      },
    );
    await t.step(
      "no process of run 1 exists anywhere afterwards (docker top of every container of the profile)",
      async () => {
        const left = await containersSettled(fixture.profile, [
          field(first.output, "HOST"),
          field(second.output, "HOST"),
        ]);
        const processes = await processesOf(left);
        assert.deepEqual(
          processes.filter((p) => /while|IO::Socket|kill -STOP|sleep 3/.test(p)),
          [],
          processes.join("\n"),
        );
      },
    );
  },
});

Deno.test({
  name:
    "what a `sandbox exec` command leaves in the development sandbox never meets the run after it, while it keeps working there",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-xexec",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_XEXEC_KEY",
      prompt: "Work\n",
    });
    const spy =
      `setsid -f sh -c 'while :; do for f in /proc/[0-9]*/environ; do tr "\\0" "\\n" <"$f" 2>/dev/null | grep "^SANDBOX_LLM_TOKEN=" >>/workspace/spy.log; done; sleep 0.2; done' </dev/null >/dev/null 2>&1; ` +
      SOCKETS.map((path) =>
        `mkdir -p "$(dirname ${path})"; setsid -f ${LISTEN} ${path} </dev/null >/dev/null 2>&1`
      ).join("; ") + "; sleep 1; hostname; echo OWN=$SANDBOX_LLM_TOKEN; sort -u /workspace/spy.log";
    const planted = await fixture.cli(["exec", "-p", fixture.profile, "--", "sh", "-c", spy]);
    assert.equal(planted.exitCode, 0, explain(planted));
    const devHost = planted.stdout.split("\n")[0];
    await t.step(
      "twin: the spy works in the development sandbox while its command runs (it caught the exec's own token)",
      () => {
        assert.match(
          planted.stdout,
          new RegExp(`^SANDBOX_LLM_TOKEN=${field(planted.stdout, "OWN")}$`, "m"),
        );
      },
    );

    llm.script.push(
      toolCall("execute", {
        command: "echo OWN=$SANDBOX_LLM_TOKEN; echo HOST=$(hostname); ls /workspace",
      }),
      text("Genuine answer"),
    );
    const result = await fixture.cli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
    ]);
    assert.equal(result.exitCode, 0, explain(result));
    const output = llm.lastToolOutput();
    await t.step("the run is genuine, in a container of its own", () => {
      assert.match(result.stdout, /"content":"Genuine answer"/);
      assert.notEqual(field(output, "HOST"), devHost);
      assert.doesNotMatch(output, /spy\.log/);
    });
    await t.step("nothing in the development sandbox ever saw the run's token", async () => {
      const seen = await fixture.cli([
        "exec",
        "-p",
        fixture.profile,
        "--",
        "sh",
        "-c",
        "sort -u /workspace/spy.log",
      ]);
      assert.equal(seen.exitCode, 0, explain(seen));
      assert.doesNotMatch(seen.stdout, new RegExp(field(output, "OWN")));
    });
  },
});

Deno.test({
  name:
    "a run cannot write its repository's object cache nor reach another run's refs, while its own commits come back as its branch",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-cache",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_CACHE_KEY",
      prompt: "Work\n",
    });
    const repo = await gitRepo(`${fixture.dir.path}/repo`);
    const attack = [
      "touch /cache/repo.git/planted 2>&1",
      "git -c safe.directory='*' -C /cache/repo.git update-ref refs/heads/evil refs/cache/$(git rev-parse HEAD) 2>&1 | head -1",
      "echo REFS; git -c safe.directory='*' -C /cache/repo.git for-each-ref --format='%(refname)'; echo REFS-END",
      "echo change >>a.txt && git -c user.name=a -c user.email=a@x commit -qam 'agent change' && echo COMMITTED",
    ].join("; ");
    llm.script.push(toolCall("execute", { command: attack }), text("Done"));
    const result = await fixture.cli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--repo",
      repo,
      "--branch",
      "agent-work",
    ]);
    assert.equal(result.exitCode, 0, explain(result));
    const output = llm.lastToolOutput();
    await t.step("writing the cache fails: read-only", () => {
      assert.match(output, /planted': Read-only file system/);
      assert.match(output, /refs\/heads\/evil.*Read-only file system/);
      assert.deepEqual(
        between(output, "REFS", "REFS-END").filter((ref) => !ref.startsWith("refs/cache/")),
        [],
      );
    });
    await t.step("twin: the run's own commit comes back as its branch", async () => {
      assert.match(output, /COMMITTED/);
      const log = await run(["git", "-C", repo, "log", "--format=%s", "-1", "agent-work"]);
      assert.equal(log.stdout.trim(), "agent change", log.stderr);
    });
  },
});

Deno.test({
  name:
    "a run killed mid-run (its supervisor, SIGKILL) leaves a labelled container that the next `up` removes, and the pool is full again",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-killed",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_KILLED_KEY",
      prompt: "Work\n",
    });
    llm.script.push(toolCall("execute", { command: "sleep 120" }), text("Done"));
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--quiet",
        CLI,
        "--config",
        fixture.config,
        "run",
        "agentic",
        "--prompt-file",
        fixture.promptFile,
        "--profile",
        fixture.profile,
      ],
      env: fixture.env,
      stdout: "null",
      stderr: "null",
    }).spawn();
    let running: string[] = [];
    for (let i = 0; i < 300 && llm.requests.length === 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    running = (await docker(
      "ps",
      "--filter",
      `label=dev.sandbox.profile=${fixture.profile}`,
      "--filter",
      "label=dev.sandbox.kind=run",
      "--format",
      "{{.Names}}",
    )).split("\n").filter(Boolean);
    assert.equal(running.length, 1, "the run's own container is up");
    // The run's own process (its supervisor) dies; the CLI that follows it ends with it.
    await fixture.killSupervisor();
    await child.status;
    assert.ok(
      (await docker("ps", "-a", "--format", "{{.Names}}")).split("\n").includes(running[0]),
      "a killed CLI cannot remove it",
    );
    const up = await fixture.cli(["up", "-p", fixture.profile, "--json"]);
    assert.equal(up.exitCode, 0, explain(up));
    const report = JSON.parse(up.stdout) as { reaped: string[]; ready: string[] };
    // (With it, the pooled container its run was starting behind it, which it held too.)
    assert.ok(report.reaped.includes(running[0]), up.stdout);
    assert.equal(report.ready.length, 1);
    assert.ok(
      !(await docker("ps", "-a", "--format", "{{.Names}}")).split("\n").includes(running[0]),
    );
  },
});
