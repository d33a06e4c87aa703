/**
 * A repository run's checkout (`/workspace/worktrees/<run-id>`) goes with the run's container
 * however the run ends — the agent failing (an `is_error` result), `--timeout`, Ctrl-C (SIGINT):
 * the container, a fresh one of the run's own, is removed moments after the run. With
 * `--keep-worktree` it is kept: each ending is run twice, once without the flag (the container is
 * gone afterwards) and once with it (the twin: the container is there, its checkout holding the
 * file the agent left, and stderr says how to remove it). The container is the one the run's
 * meta.json names (`extra.container`), not a name assumed here. Live runs are watched on their
 * stdout and in their container, so each step waits on the event it needs.
 */
import { createRepo } from "../_git.ts";
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { FakeLlm, type FakeStep, httpError, text, toolCall } from "../_fake_llm.ts";
import { LiveCli } from "../_live_cli.ts";
import { RunFixture } from "../_run_fixture.ts";
import { assertDocker, dockerTest } from "../_helpers.ts";

console.error("e2e: worktree cleanup tests starting");

const KEY_ENV = "SANDBOX_E2E_WORKTREE_KEY";
const WORKTREES = "/workspace/worktrees";
/** What the agent leaves in its worktree before the run ends. */
const LEAVE = "pwd; echo 'left by the agent' > left-behind.txt";
/** How long the test waits for the agent's file to appear in a live run. */
const FILE_DEADLINE_MS = 120_000;

type Ending = "failure" | "timeout" | "interrupt";

const ENDINGS: Record<
  Ending,
  { steps: FakeStep[]; args: string[]; exitCode: number; status: string; says: RegExp }
> = {
  failure: {
    // The agent's command runs, then its LLM refuses: the run ends with the agent's error result.
    steps: [
      toolCall("execute", { command: LEAVE }),
      httpError(400, "the fake LLM refuses to go on"),
    ],
    args: [],
    exitCode: 1,
    status: "failed",
    says: /the fake LLM refuses to go on/,
  },
  timeout: {
    steps: [toolCall("execute", { command: `${LEAVE}; sleep 600` }), text("never reached")],
    args: ["--timeout", "20s"],
    exitCode: 124,
    status: "timed_out",
    says: /^sandbox: error: The run timed out after 20s$/m,
  },
  interrupt: {
    steps: [toolCall("execute", { command: `${LEAVE}; sleep 600` }), text("never reached")],
    args: [],
    exitCode: 130,
    status: "interrupted",
    says: /^The run was interrupted$/m,
  },
};

/** A repository with one commit on main. */

/**
 * `docker exec CONTAINER ARGS`, as root (no capability: it reads what others may read): exit code
 * and stdout. Not as the sandbox user, whose processes outside the tool's wrapper the cleanup
 * behind a run kills.
 */
async function inSandbox(
  container: string,
  ...args: string[]
): Promise<{ exitCode: number; stdout: string }> {
  const result = await run(["docker", "exec", "--user", "0", container, ...args]);
  return { exitCode: result.exitCode, stdout: result.stdout };
}

/** Wait until the agent's file is in its worktree in the live run's container (it appears while the command runs). */
async function waitForAgentFile(f: RunFixture, path: string, cli: LiveCli): Promise<void> {
  const container = await f.liveContainer();
  const deadline = Date.now() + FILE_DEADLINE_MS;
  while ((await inSandbox(container, "test", "-f", path)).exitCode !== 0) {
    assert.ok(
      Date.now() < deadline,
      `the agent's file never appeared at ${path} in ${container}\n${cli.explain()}`,
    );
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/** Whether `docker container inspect` finds `name` (the run's container is removed just after the run). */
async function exists(name: string): Promise<boolean> {
  return (await run(["docker", "container", "inspect", name])).exitCode === 0;
}

for (const ending of ["failure", "timeout", "interrupt"] as const) {
  for (const keep of [false, true]) {
    const expect = ENDINGS[ending];
    Deno.test({
      name: keep
        ? `run --repo --keep-worktree ending in ${ending}: the run's container stays, its worktree holding the agent's file`
        : `run --repo ending in ${ending}: the run's container, its worktree with it, is removed`,
      ...dockerTest(),
      async fn() {
        assertDocker();
        await using llm = new FakeLlm(expect.steps);
        await using f = await RunFixture.make({
          prefix: `e2e-wt-${ending.slice(0, 4)}`,
          llmUrl: llm.baseUrl,
          keyEnv: KEY_ENV,
          prompt: "Leave a file.\n",
        });
        const repo = await createRepo(`${f.dir.path}/repo`, "a repository\n");
        const args = [
          "run",
          "agentic",
          "--prompt-file",
          f.promptFile,
          "--profile",
          f.profile,
          "--format",
          "ndjson",
          "--repo",
          repo,
          ...expect.args,
          ...(keep ? ["--keep-worktree"] : []),
        ];
        await using cli = new LiveCli(args, { config: f.config, env: f.env });
        await cli.lineWhere((line) => JSON.parse(line).type === "tool_call");
        const id = /^sandbox: run (\S+) \(/m.exec(cli.stderr)?.[1];
        assert.ok(id, `stderr names no run\n${cli.explain()}`);
        const worktree = `${WORKTREES}/${id}`;
        if (ending !== "failure") {
          // The run is live, its agent's file in place: now end it.
          await waitForAgentFile(f, `${worktree}/left-behind.txt`, cli);
          if (ending === "interrupt") Deno.kill(cli.pid, "SIGINT");
        }
        const code = await cli.finish();
        const context = cli.explain(code);
        assert.equal(code, expect.exitCode, context);
        // The run says why it ended (the result's content, or stderr's error line).
        const result = cli.stdoutLines.map((line) => JSON.parse(line)).find((m) =>
          m.type === "result"
        );
        assert.match(`${result?.content}\n${cli.stderr}`, expect.says, context);

        const meta = await f.meta(id);
        assert.equal(meta.status, expect.status, context);
        const container = meta.extra?.container;
        assert.ok(
          typeof container === "string" && container,
          `meta.json names no container\n${JSON.stringify(meta)}`,
        );
        assert.equal(
          meta.extra?.workdir,
          worktree,
          `the run did not work in its worktree\n${JSON.stringify(meta)}`,
        );
        if (ending === "failure") {
          // The agent's command ran in the worktree: it existed during the run.
          const output = cli.stdoutLines.map((line) =>
            JSON.parse(line)
          ).find((m) => m.type === "tool_result")?.tool_output ?? "";
          assert.equal(output.split("\n")[0], worktree, context);
        }

        if (keep) {
          assert.equal(
            meta.extra?.kept,
            true,
            `meta.json does not say the container is kept\n${JSON.stringify(meta)}`,
          );
          const listed = await inSandbox(container, "ls", "-A", WORKTREES);
          assert.equal(listed.exitCode, 0, `cannot list ${WORKTREES} in ${container}\n${context}`);
          assert.ok(
            listed.stdout.split("\n").includes(id),
            `--keep-worktree: ${worktree} is gone\n${listed.stdout}\n${context}`,
          );
          const left = await inSandbox(container, "cat", `${worktree}/left-behind.txt`);
          assert.equal(left.stdout, "left by the agent\n", context);
          assert.match(
            cli.stderr,
            new RegExp(
              `^sandbox: the run's container ${container} is kept with its work; remove it with: \\S+ down -p ${f.profile}$`,
              "m",
            ),
            context,
          );
        } else {
          // Removed behind the run (the CLI does not wait for it): gone within moments of the exit.
          for (
            const deadline = Date.now() + FILE_DEADLINE_MS;
            await exists(container) && Date.now() < deadline;
          ) {
            await new Promise((resolve) => setTimeout(resolve, 100));
          }
          assert.ok(
            !await exists(container),
            `${container} (with ${worktree}) was left after the run\n${context}`,
          );
          assert.doesNotMatch(cli.stderr, /is kept with its work/, context);
        }
      },
    });
  }
}
