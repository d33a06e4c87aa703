/**
 * The exit codes the README promises, each provoked for real and checked with the message that names
 * its cause: 1 for an internal error (the tool's own state damaged), 125 when the worker dies, is
 * killed by the memory limit or breaks the protocol, and when a remote refuses the credentials or
 * rejects the push, and 130 when `exec` is interrupted (Ctrl-C). (`run`'s 124 at `--timeout` and
 * 130 on SIGINT and SIGTERM are in run_test.ts; 2 for user mistakes in user_mistakes_test.ts.)
 *
 * What the agent does is what an agent could do from inside: kill its own worker, make it buffer
 * more output than the sandbox's memory holds, write to the worker's stdout behind its back. The
 * worker is the parent of the shell its `execute` tool starts (`$PPID`).
 */
import assert from "node:assert/strict";
import { run, type RunResult } from "../../lib/process.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { GitHttpServer } from "../_git_server.ts";
import { LiveCli } from "../_live_cli.ts";
import { RunFixture } from "../_run_fixture.ts";
import { assertDocker, docker, dockerTest, explain, writeConfig } from "../_helpers.ts";

console.error("e2e: exit code tests starting");

const KEY_ENV = "SANDBOX_E2E_EXIT_KEY";
/** A stack frame: shown for internal errors (our bugs) only. */
const STACK = /^\s+at .+:\d+:\d+\)?$/m;

function fixture(prefix: string, llm: FakeLlm, sandboxYaml?: string): Promise<RunFixture> {
  return RunFixture.make({
    prefix,
    llmUrl: llm.baseUrl,
    keyEnv: KEY_ENV,
    prompt: "Do the thing.\n",
    sandboxYaml,
  });
}

function agentic(f: RunFixture, ...args: string[]): string[] {
  return [
    "run",
    "agentic",
    "--prompt-file",
    f.promptFile,
    "--profile",
    f.profile,
    "--format",
    "ndjson",
    ...args,
  ];
}

/** The run id from stderr's `sandbox: run <id> (...)` line. */
function runIdFrom(stderr: string): string {
  const match = stderr.match(/^sandbox: run (\S+) \(/m);
  assert.ok(match, `stderr names no run:\n${stderr}`);
  return match[1];
}

/**
 * stdout still ends as the protocol promises: one result, then usage. The result is an `is_error`
 * one unless the agent had already given its own (a failure after the agent finished).
 */
function assertClosingRecord(stdout: string, agentFinished: boolean, context: string): void {
  const messages = stdout.trim().split("\n").map((line) => JSON.parse(line));
  assert.equal(messages.filter((m) => m.type === "result").length, 1, context);
  assert.deepEqual(messages.slice(-2).map((m) => m.type), ["result", "usage"], context);
  assert.equal(messages.at(-2).is_error, !agentFinished, context);
}

/** A run that ends in an infrastructure failure: exit 125, an error line saying `says`, no stack. */
async function assertInfrastructureFailure(
  f: RunFixture,
  result: RunResult,
  says: RegExp,
  options: { agentFinished?: boolean } = {},
): Promise<void> {
  const context = explain(result);
  assert.equal(result.exitCode, 125, context);
  assert.match(result.stderr, says, context);
  assert.doesNotMatch(
    result.stderr,
    STACK,
    `a stack trace for an infrastructure failure\n${context}`,
  );
  assertClosingRecord(result.stdout, options.agentFinished ?? false, context);
  const meta = await f.meta(runIdFrom(result.stderr));
  assert.equal(meta.exitCode, 125, context);
  assert.equal(meta.status, "failed", context);
}

Deno.test({
  name:
    "exit 1: an internal error (a run whose event log is gone) is reported as one, with the file it could not open",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([text("all done")]);
    await using f = await fixture("e2e-exit1", llm);
    const ran = await f.cli(agentic(f));
    assert.equal(ran.exitCode, 0, explain(ran));
    const id = runIdFrom(ran.stderr);
    const events = `${f.stateDir}/sandbox/runs/${id}/events.ndjson`;
    // The twin: the intact run's log replays.
    const intact = await f.cli(["logs", id, "--format", "ndjson"]);
    assert.equal(intact.exitCode, 0, explain(intact));
    assert.equal(intact.stdout, ran.stdout);

    await Deno.remove(events);
    const damaged = await f.cli(["logs", id, "--format", "ndjson"]);
    const context = explain(damaged);
    assert.equal(damaged.exitCode, 1, context);
    assert.match(damaged.stderr, /^sandbox: internal error: NotFound: .*events\.ndjson/m, context);
    assert.ok(damaged.stderr.includes(events), `the message does not name the file\n${context}`);
    assert.equal(damaged.stdout, "", context);
  },
});

Deno.test({
  name:
    "exit 125: the agent kills its own worker; stderr says the worker ended without a result and how",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: "kill -KILL $PPID" }),
      text("never reached"),
    ]);
    await using f = await fixture("e2e-exit-kill", llm);
    const result = await f.cli(agentic(f));
    await assertInfrastructureFailure(
      f,
      result,
      /^sandbox: error: Worker did not emit a result message: it exited with code 137$/m,
    );
    assert.doesNotMatch(result.stderr, /memory limit/, explain(result));
    // The worker asked for the command and never got to ask again.
    assert.equal(llm.completions, 1, explain(result));
  },
});

Deno.test({
  name:
    "exit 125: the agent makes its worker hold more than the sandbox's memory; stderr says the memory limit killed it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    // deepagents' execute tool keeps a command's whole output in the worker's memory: 3 GB of
    // output cannot fit in 512 MiB, so the kernel kills the largest process, the worker.
    await using llm = new FakeLlm([
      toolCall("execute", { command: "head -c 3000000000 /dev/zero" }),
      text("never reached"),
    ]);
    await using f = await fixture("e2e-exit-oom", llm, "{resources: {memory: 512m}}");
    const result = await f.cli(agentic(f));
    await assertInfrastructureFailure(
      f,
      result,
      /^sandbox: error: Worker did not emit a result message: it was killed by the sandbox memory limit$/m,
    );
  },
});

Deno.test({
  name:
    "exit 125: a line on the worker's stdout that is not a protocol message ends the run, quoted in the error",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", {
        command: "printf 'this is not a protocol line\\n' > /proc/$PPID/fd/1",
      }),
      text("never reached"),
    ]);
    await using f = await fixture("e2e-exit-proto", llm);
    const result = await f.cli(agentic(f));
    await assertInfrastructureFailure(
      f,
      result,
      /^sandbox: error: Invalid worker message on line \d+: not valid JSON: this is not a protocol line$/m,
    );
  },
});

/** A bare remote `proj.git` with one commit on main, served with a token by `git http-backend`. */
async function makeRemote(
  dir: string,
  token: string,
): Promise<{ server: GitHttpServer; bare: string }> {
  const git = async (...args: string[]) => {
    const result = await run(["git", ...args]);
    assert.equal(result.exitCode, 0, `git ${args.join(" ")}: ${result.stderr}`);
    return result.stdout.trim();
  };
  const bare = `${dir}/remotes/proj.git`;
  await git("init", "-q", "--bare", bare);
  await git("init", "-q", "-b", "main", `${dir}/seed`);
  await Deno.writeTextFile(`${dir}/seed/README.md`, "remote readme\n");
  await git("-C", `${dir}/seed`, "add", ".");
  await git(
    "-C",
    `${dir}/seed`,
    "-c",
    "user.name=u",
    "-c",
    "user.email=u@x",
    "commit",
    "-qm",
    "init",
  );
  await git("-C", `${dir}/seed`, "push", "-q", bare, "main");
  await git("-C", bare, "symbolic-ref", "HEAD", "refs/heads/main");
  return { server: new GitHttpServer(`${dir}/remotes`, token), bare };
}

/** The fixture's profile with a git token from `SANDBOX_E2E_EXIT_GIT`. */
async function withGitToken(f: RunFixture, llm: FakeLlm): Promise<void> {
  f.config = await writeConfig(
    f.dir.path,
    `profiles:\n  ${f.profile}:\n` +
      `    llm: {provider: custom, base_url: "${llm.baseUrl}", key: {env: ${KEY_ENV}}}\n` +
      `    git: {token: {env: SANDBOX_E2E_EXIT_GIT}}\n`,
  );
}

Deno.test({
  name: "exit 125: a remote that refuses the credentials (401) fails the run, naming the remote",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([text("never reached")]);
    await using f = await fixture("e2e-exit-401", llm);
    await withGitToken(f, llm);
    const { server } = await makeRemote(f.dir.path, "ghp_the-remote-wants-this-one");
    await using _server = server;
    const url = server.url("proj.git");
    const result = await f.cli(agentic(f, "--repo", url), {
      SANDBOX_E2E_EXIT_GIT: "ghp_but-the-profile-has-this-one",
    });
    await assertInfrastructureFailure(
      f,
      result,
      new RegExp(
        `^sandbox: error: The remote refused access: ${
          url.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")
        }$`,
        "m",
      ),
    );
    // It was the remote's answer: the proxy forwarded the request with the profile's token.
    assert.ok(server.authorizations.length > 0, "the remote was never asked");
    assert.equal(llm.completions, 0, "the agent started despite the refused fetch");
    // The twin: the right token gets the same run through.
    llm.script.push(text("fetched and done"));
    const twin = await f.cli(agentic(f, "--repo", url), {
      SANDBOX_E2E_EXIT_GIT: "ghp_the-remote-wants-this-one",
    });
    assert.equal(twin.exitCode, 0, explain(twin));
  },
});

Deno.test({
  name:
    "exit 125: a push the remote rejects (pre-receive hook) fails the run with the remote's answer",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const token = "ghp_push-rejection-test-token";
    await using llm = new FakeLlm([
      toolCall("write_file", { file_path: "work.txt", content: "the agent's work\n" }),
      text("wrote work.txt"),
    ]);
    await using f = await fixture("e2e-exit-push", llm);
    await withGitToken(f, llm);
    const { server, bare } = await makeRemote(f.dir.path, token);
    await using _server = server;
    await Deno.writeTextFile(
      `${bare}/hooks/pre-receive`,
      "#!/bin/sh\necho 'the test remote takes no pushes today' >&2\nexit 1\n",
    );
    await Deno.chmod(`${bare}/hooks/pre-receive`, 0o755);
    const result = await f.cli(
      agentic(f, "--repo", server.url("proj.git"), "--push", "--branch", "agent/work"),
      { SANDBOX_E2E_EXIT_GIT: token },
    );
    const context = explain(result);
    // The agent had finished (its own result stands); the push after it failed.
    await assertInfrastructureFailure(
      f,
      result,
      /^sandbox: error: Push of agent\/work was rejected$/m,
      { agentFinished: true },
    );
    assert.match(
      result.stderr,
      /the test remote takes no pushes today/,
      `the remote's answer is not shown\n${context}`,
    );
    assert.match(result.stderr, /pre-receive hook declined/, context);
    const refs = await run(["git", "-C", bare, "for-each-ref", "--format=%(refname)"]);
    assert.equal(refs.stdout.trim(), "refs/heads/main", "the rejected branch exists on the remote");
  },
});

/** The processes of a profile's sandboxes, one command line each. */
async function sandboxProcesses(profile: string): Promise<string[]> {
  const containers = (await docker("ps", "-q", "--filter", `label=dev.sandbox.profile=${profile}`))
    .split("\n").filter(Boolean);
  assert.ok(containers.length > 0, `no running sandbox for profile ${profile}`);
  const lines: string[] = [];
  for (const id of containers) {
    lines.push(...(await docker("exec", id, "ps", "-eo", "args")).split("\n").slice(1));
  }
  return lines;
}

Deno.test({
  name:
    "exit 130: Ctrl-C (SIGINT) during exec stops the command inside the sandbox, and says it was interrupted",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm();
    await using f = await fixture("e2e-exit-int", llm);
    await using cli = new LiveCli([
      "exec",
      "-p",
      f.profile,
      "--",
      "sh",
      "-c",
      "echo started; sleep 100; echo finished",
    ], { config: f.config, env: f.env });
    await cli.lineWhere((line) => line === "started");
    // The command really is running inside before the signal.
    assert.ok(
      (await sandboxProcesses(f.profile)).includes("sleep 100"),
      "sleep 100 is not running in the sandbox",
    );
    Deno.kill(cli.pid, "SIGINT");
    const code = await cli.finish();
    assert.equal(code, 130, cli.explain(code));
    assert.match(cli.stderr, /^sandbox: interrupted$/m, cli.explain(code));
    assert.ok(
      !cli.stdoutLines.includes("finished"),
      `the command ran to its end\n${cli.explain(code)}`,
    );
    const left = await sandboxProcesses(f.profile);
    assert.ok(left.length > 0, "ps printed nothing: the check would prove nothing");
    assert.ok(
      !left.includes("sleep 100"),
      `the command outlived the interrupt:\n${left.join("\n")}`,
    );
  },
});
