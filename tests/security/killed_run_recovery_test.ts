/**
 * The work of a `--repo` run whose process was SIGKILLed comes back through the next `up`, through the
 * same quarantine and checks as a finished run's branch: the agent commits, plants another ref and
 * an object of its own in its checkout (and, in the attack, a `.gitmodules` the checks refuse), the
 * run's supervisor is killed while the agent's next LLM call is held, then `sandbox up` reaps. The real CLI, a
 * real engine, a real repository, the scripted fake LLM on 127.0.0.1.
 */
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { HeldLlm } from "../_held_llm.ts";
import { LiveCli } from "../_live_cli.ts";
import { text, toolCall } from "../_fake_llm.ts";
import { run } from "../../lib/process.ts";
import { assertDocker, docker, dockerTest, explain } from "../_helpers.ts";

console.error("security: killed run recovery tests starting");

const KEY_ENV = "SANDBOX_SEC_RECOVER_KEY";
const USER_GIT = ["-c", "user.name=Owner", "-c", "user.email=o@example.test"];

async function git(cwd: string, ...args: string[]): Promise<string> {
  const result = await run(["git", "-C", cwd, ...args]);
  assert.equal(result.exitCode, 0, `git ${args.join(" ")}: ${result.stderr}`);
  return result.stdout.trim();
}

/** A blob only the agent writes: the host repository must never get it unless a branch needs it. */
function plantedContent(tag: string): string {
  return `PLANTED-${tag}\n`;
}

/**
 * The agent's command: a commit of its work; a ref and a tag of its own on a commit holding the
 * planted blob; with `hostileGitmodules`, a last commit whose `.gitmodules` path ends in a CR.
 */
function agentScript(planted: string, hostileGitmodules: boolean): string {
  return [
    "set -e",
    "echo work > work.txt && git add work.txt && git commit -qm 'agent work'",
    `blob=$(printf '%s\\n' '${planted.trimEnd()}' | git hash-object -w --stdin)`,
    `tree=$(printf '100644 blob %s\\tplanted.txt\\n' "$blob" | git mktree)`,
    'c=$(git commit-tree "$tree" -m planted)',
    'git update-ref refs/heads/planted "$c" && git tag planted-tag "$c"',
    ...(hostileGitmodules
      ? [
        `printf '[submodule "x"]\\n\\tpath = "x\\r"\\n\\turl = ./x\\n' > .gitmodules`,
        "git add .gitmodules && git commit -qm 'submodule'",
      ]
      : []),
    "echo PLANTED-OK",
  ].join("\n");
}

interface Killed {
  fixture: RunFixture;
  repo: string;
  id: string;
  container: string;
  held: HeldLlm;
}

/** A `--repo` run whose agent ran `script`, its supervisor SIGKILLed while its second LLM call is held. */
async function killedRun(prefix: string, script: string): Promise<Killed & AsyncDisposable> {
  const held = new HeldLlm([toolCall("execute", { command: script }), text("done")]);
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
  const cli = new LiveCli([
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
  ], { config: fixture.config, env: fixture.env });
  const body = await arrived;
  assert.match(body, /PLANTED-OK/, `the agent's command did not finish\n${cli.explain()}`);
  const id = /run (\S+) \(profile/.exec(cli.stderr)?.[1];
  assert.ok(id, cli.explain());
  const container = await fixture.liveContainer();
  // The run's own process (its supervisor) dies; the CLI that follows it ends with it.
  await fixture.killSupervisor();
  await cli.finish();
  return {
    fixture,
    repo,
    id,
    container,
    held,
    async [Symbol.asyncDispose]() {
      await held[Symbol.asyncDispose]();
      await fixture[Symbol.asyncDispose]();
    },
  };
}

async function up(killed: Killed): Promise<void> {
  const result = await killed.fixture.cli([
    "up",
    "-p",
    killed.fixture.profile,
    "--repo",
    killed.repo,
    "--json",
  ]);
  assert.equal(result.exitCode, 0, explain(result));
}

// deno-lint-ignore no-explicit-any
async function runsJson(killed: Killed): Promise<Record<string, any>> {
  const result = await killed.fixture.cli(["runs", "--json"]);
  assert.equal(result.exitCode, 0, explain(result));
  // deno-lint-ignore no-explicit-any
  const found = JSON.parse(result.stdout).find((meta: any) => meta.id === killed.id);
  assert.ok(found, result.stdout);
  return found;
}

async function hasObject(repo: string, content: string): Promise<boolean> {
  const hash = (await run(["git", "hash-object", "--stdin"], { stdin: content })).stdout.trim();
  return (await run(["git", "-C", repo, "cat-file", "-e", hash])).exitCode === 0;
}

async function containerExists(name: string): Promise<boolean> {
  return (await docker("ps", "-a", "--format", "{{.Names}}")).split("\n").includes(name);
}

Deno.test({
  name:
    "a killed run's commits come back with the next up as the branch it would have made; its planted ref and object do not",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const planted = plantedContent(crypto.randomUUID());
    await using killed = await killedRun("sec-recover-ok", agentScript(planted, false));
    await up(killed);
    const branch = `sandbox/${killed.id}`;
    const log = await git(killed.repo, "log", "--format=%s", `main..${branch}`);
    assert.equal(log, "agent work");
    assert.equal(await git(killed.repo, "show", `${branch}:work.txt`), "work");
    assert.equal(
      await git(killed.repo, "for-each-ref", "--format=%(refname)"),
      [
        "refs/heads/main",
        `refs/heads/${branch}`,
      ].sort().join("\n"),
    );
    assert.ok(!await hasObject(killed.repo, planted), "the planted blob reached the repository");
    const meta = await runsJson(killed);
    assert.equal(meta.status, "crashed");
    assert.equal(meta.extra.recovery.outcome, "recovered", JSON.stringify(meta));
    assert.equal(meta.extra.recovery.branch, branch);
    assert.equal(meta.extra.branch, branch);
    assert.ok(!await containerExists(killed.container), "the container stays after recovery");
    const table = await killed.fixture.cli(["runs"]);
    assert.match(table.stdout, new RegExp(`crashed \\(recovered: branch ${branch}\\)`));
  },
});

Deno.test({
  name:
    "a killed run whose branch fails the quarantine's checks brings nothing into the repository: its container is kept and the run says where",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const planted = plantedContent(crypto.randomUUID());
    await using killed = await killedRun("sec-recover-bad", agentScript(planted, true));
    await up(killed);
    assert.equal(
      await git(killed.repo, "for-each-ref", "--format=%(refname)"),
      "refs/heads/main",
      "a ref reached the repository",
    );
    assert.ok(!await hasObject(killed.repo, planted), "the planted blob reached the repository");
    assert.ok(
      !await hasObject(killed.repo, "work\n"),
      "the refused branch's objects reached the repository",
    );
    const meta = await runsJson(killed);
    assert.equal(meta.status, "crashed");
    assert.equal(meta.extra.recovery.outcome, "kept", JSON.stringify(meta));
    assert.equal(meta.extra.recovery.container, killed.container);
    assert.match(meta.extra.recovery.reason, /gitmodules/i, JSON.stringify(meta));
    assert.match(meta.extra.recovery.how, new RegExp(`cp ${killed.id}:\\. DIR`));
    assert.equal(meta.extra.kept, true);
    assert.ok(await containerExists(killed.container), "the work's container was removed");
  },
});

Deno.test({
  name:
    "a killed run never moves a branch the user made meanwhile under its name: its container is kept",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using killed = await killedRun("sec-recover-taken", agentScript("x\n", false));
    // The user creates the run's branch (at the base, an ancestor of the run's work) after it began.
    const branch = `sandbox/${killed.id}`;
    await git(killed.repo, "branch", branch, "main");
    const before = await git(killed.repo, "rev-parse", branch);
    await up(killed);
    assert.equal(await git(killed.repo, "rev-parse", branch), before, "the user's branch moved");
    const meta = await runsJson(killed);
    assert.equal(meta.extra.recovery.outcome, "kept", JSON.stringify(meta));
    assert.match(meta.extra.recovery.reason, /already exists/);
    assert.ok(await containerExists(killed.container));
  },
});

Deno.test({
  name:
    "before anything reaps it, a killed run's record says which container holds its work and that up brings it back",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const planted = plantedContent(crypto.randomUUID());
    await using killed = await killedRun("sec-recover-unreaped", agentScript(planted, false));
    const says =
      `crashed (work in container ${killed.container}: sandbox up -p ${killed.fixture.profile} brings it back)`;
    const table = await killed.fixture.cli(["runs"]);
    assert.equal(table.exitCode, 0, explain(table));
    assert.ok(table.stdout.includes(says), explain(table));
    const attach = await killed.fixture.cli(["attach", killed.id]);
    assert.equal(attach.exitCode, 1, explain(attach));
    assert.ok(
      attach.stderr.includes(
        `; work in container ${killed.container}: sandbox up -p ${killed.fixture.profile} brings it back`,
      ),
      explain(attach),
    );
    // As said: `up -p P` brings the branch back.
    const upped = await killed.fixture.cli(["up", "-p", killed.fixture.profile, "--json"]);
    assert.equal(upped.exitCode, 0, explain(upped));
    const branch = `sandbox/${killed.id}`;
    assert.equal(await git(killed.repo, "log", "--format=%s", `main..${branch}`), "agent work");
    const after = await killed.fixture.cli(["runs"]);
    assert.ok(after.stdout.includes(`crashed (recovered: branch ${branch})`), explain(after));
  },
});
