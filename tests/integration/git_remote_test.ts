/**
 * A remote repository: a real smart-HTTP server (git http-backend) on the host requires a token;
 * the host fetches it into its mirror and the sandbox checks it out from the repository's cache;
 * the sandbox pushes through the proxy without ever holding the token, and a push to any branch
 * but the run's own is refused.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { FAKE_LLM_KEY, FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { GitHttpServer } from "../_git_server.ts";
import type { RunMeta } from "../../lib/run/run_log.ts";
import { resolveRemoteRepo } from "../../lib/repo/remote.ts";
import { sandboxRepo } from "../../lib/sandbox/docker_provider.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";

console.error("integration: git remote tests starting");

/** The id a remote's cache volume is named by. */
async function repoId(url: string): Promise<string> {
  return (await sandboxRepo((await resolveRemoteRepo(url)).key)).id;
}

async function git(...args: string[]): Promise<string> {
  const result = await run(["git", ...args]);
  if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr}`);
  return result.stdout.trim();
}

Deno.test({
  name:
    "a remote repository is cloned and pushed through the git proxy; its token never enters; other refs are refused",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const token = `ghp_${crypto.randomUUID().replaceAll("-", "")}`;
    // The remote: a bare repository with one commit on main.
    await git("init", "-q", "--bare", `${dir.path}/remotes/proj.git`);
    await git("init", "-q", "-b", "main", `${dir.path}/seed`);
    await Deno.writeTextFile(`${dir.path}/seed/README.md`, "remote readme\n");
    await git("-C", `${dir.path}/seed`, "add", ".");
    await git(
      "-C",
      `${dir.path}/seed`,
      "-c",
      "user.name=u",
      "-c",
      "user.email=u@x",
      "commit",
      "-qm",
      "init",
    );
    await git("-C", `${dir.path}/seed`, "push", "-q", `${dir.path}/remotes/proj.git`, "main");
    await git("-C", `${dir.path}/remotes/proj.git`, "symbolic-ref", "HEAD", "refs/heads/main");
    const mainBefore = await git(
      "-C",
      `${dir.path}/remotes/proj.git`,
      "rev-parse",
      "refs/heads/main",
    );
    await using server = new GitHttpServer(`${dir.path}/remotes`, token);

    await using llm = new FakeLlm([
      toolCall("write_file", { file_path: "notes.txt", content: "from the agent\n" }),
      toolCall("execute", {
        // Commit, then try to push to main; then count processes whose environment or command line
        // holds a GitHub-style token (the pattern is spelled so it does not match itself).
        command: "git add -A && git commit -qm 'agent commit' && " +
          'git -c http.extraHeader="Authorization: Bearer $SANDBOX_LLM_TOKEN" push "$SANDBOX_GIT_URL" HEAD:refs/heads/main 2>&1; ' +
          "echo push-exit=$?; echo token-holders=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c 'gh[p]_')",
      }),
      text("Wrote notes.txt"),
    ]);
    const profile = uniqueProfile("it-remote");
    const config = await writeConfig(
      dir.path,
      `profiles:
  ${profile}:
    llm: {provider: custom, base_url: "${llm.baseUrl}", key: {env: SANDBOX_TEST_LLM_KEY}}
    git: {token: {env: SANDBOX_TEST_GIT_TOKEN}}
`,
    );
    await Deno.writeTextFile(`${dir.path}/prompt.txt`, "Add notes.txt");
    try {
      const result = await runCli(
        [
          "run",
          "agentic",
          "--profile",
          profile,
          "--prompt-file",
          `${dir.path}/prompt.txt`,
          "--repo",
          server.url("proj.git"),
          "--push",
          "--keep-worktree",
        ],
        {
          config,
          env: {
            SANDBOX_TEST_LLM_KEY: FAKE_LLM_KEY,
            SANDBOX_TEST_GIT_TOKEN: token,
            XDG_STATE_HOME: `${dir.path}/state`,
          },
        },
      );
      assert.equal(result.exitCode, 0, explain(result));
      const runId = /run (\S+) \(/.exec(result.stderr)?.[1];
      assert.ok(runId, result.stderr);
      const branch = `sandbox/${runId}`;

      // The run branch reached the remote; main did not move.
      assert.equal(
        await git("-C", `${dir.path}/remotes/proj.git`, "show", `${branch}:notes.txt`),
        "from the agent",
      );
      assert.equal(
        await git("-C", `${dir.path}/remotes/proj.git`, "rev-parse", "refs/heads/main"),
        mainBefore,
      );
      assert.match(result.stderr, /pushed to/);

      // The agent's own push to main was refused by the proxy, and no process in the sandbox held the token.
      const messages = result.stdout.trim().split("\n").map((line, i) =>
        decodeMessage(line, i + 1)
      );
      const pushOutput = messages.find((m) =>
        m.type === "tool_result" && m.tool_name === "execute"
      )?.tool_output ?? "";
      assert.match(pushOutput, /push refused|403/);
      assert.match(pushOutput, /push-exit=[1-9]/);
      assert.match(pushOutput, /^token-holders=0$/m);

      // The remote saw the real token, sent by the host proxy.
      const expected = `Basic ${btoa(`x-access-token:${token}`)}`;
      assert.ok(server.authorizations.includes(expected), "the remote never saw the token");

      // Nothing in the run's sandbox (kept by --keep-worktree) holds the token: not its config,
      // not a file, not the kept repository.
      const meta: RunMeta = JSON.parse(
        await Deno.readTextFile(`${dir.path}/state/sandbox/runs/${runId}/meta.json`),
      );
      const container = meta.extra?.container;
      assert.ok(
        typeof container === "string" && meta.extra?.kept === true,
        JSON.stringify(meta.extra),
      );
      assert.ok(!(await docker("container", "inspect", container)).includes(token));
      const grep = await run(
        [
          "docker",
          "exec",
          "-i",
          "-u",
          "0",
          container,
          "grep",
          "-rlsF",
          "-D",
          "skip",
          "--exclude-dir=proc",
          "--exclude-dir=sys",
          "--exclude-dir=dev",
          "-f",
          "/dev/stdin",
          "/",
        ],
        { stdin: token },
      );
      assert.equal(grep.stdout, "", `files holding the token:\n${grep.stdout}`);

      const log = (await Deno.readTextFile(`${dir.path}/state/sandbox/access.ndjson`)).trim().split(
        "\n",
      ).map((l) => JSON.parse(l));
      const gitEntries = log.filter((e) => e.kind === "git");
      assert.ok(
        gitEntries.some((e) => e.decision === "deny" && e.status === 403),
        JSON.stringify(gitEntries),
      );
      assert.ok(gitEntries.some((e) => e.decision === "allow"));
      assert.ok(!JSON.stringify(log).includes(token));
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "a remote is fetched on the host and reaches its runs through the repository's cache: a second run copies nothing again",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const token = `ghp_${crypto.randomUUID().replaceAll("-", "")}`;
    await git("init", "-q", "--bare", `${dir.path}/remotes/proj.git`);
    await git("init", "-q", "-b", "main", `${dir.path}/seed`);
    await Deno.writeTextFile(`${dir.path}/seed/data.bin`, crypto.randomUUID().repeat(20_000));
    await git("-C", `${dir.path}/seed`, "add", ".");
    await git(
      "-C",
      `${dir.path}/seed`,
      "-c",
      "user.name=u",
      "-c",
      "user.email=u@x",
      "commit",
      "-qm",
      "i",
    );
    await git("-C", `${dir.path}/seed`, "push", "-q", `${dir.path}/remotes/proj.git`, "main");
    await git("-C", `${dir.path}/remotes/proj.git`, "symbolic-ref", "HEAD", "refs/heads/main");
    const base = await git("-C", `${dir.path}/seed`, "rev-parse", "HEAD");
    await using server = new GitHttpServer(`${dir.path}/remotes`, token);
    await using llm = new FakeLlm([
      toolCall("execute", { command: "cat data.bin | wc -c; ls /workspace/repos 2>&1 | head -1" }),
      text("first"),
      text("second"),
    ]);
    const profile = uniqueProfile("it-remote-cache");
    const config = await writeConfig(
      dir.path,
      `profiles:
  ${profile}:
    llm: {provider: custom, base_url: "${llm.baseUrl}", key: {env: SANDBOX_TEST_LLM_KEY}}
    git: {token: {env: SANDBOX_TEST_GIT_TOKEN}}
    sandbox: {pool: 0}
`,
    );
    await Deno.writeTextFile(`${dir.path}/prompt.txt`, "Look");
    const runOnRemote = () =>
      runCli(
        [
          "run",
          "agentic",
          "--profile",
          profile,
          "--prompt-file",
          `${dir.path}/prompt.txt`,
          "--repo",
          server.url("proj.git"),
        ],
        {
          config,
          env: {
            SANDBOX_TEST_LLM_KEY: FAKE_LLM_KEY,
            SANDBOX_TEST_GIT_TOKEN: token,
            XDG_STATE_HOME: `${dir.path}/state`,
          },
        },
      );
    try {
      const first = await runOnRemote();
      assert.equal(first.exitCode, 0, explain(first));
      const short = base.slice(0, 12);
      assert.match(
        first.stderr,
        new RegExp(
          `fetched \\S+ on the host; checked out HEAD \\(${short}\\); \\d+ bytes of objects added to its cache`,
        ),
      );
      // The agent saw the checkout; the sandbox has no repository fetched by itself.
      const output = first.stdout.trim().split("\n").map((l, i) => decodeMessage(l, i + 1))
        .find((m) => m.type === "tool_result")?.tool_output ?? "";
      assert.match(output, /^720000$/m);
      assert.match(output, /No such file or directory/);

      const second = await runOnRemote();
      assert.equal(second.exitCode, 0, explain(second));
      assert.match(second.stderr, new RegExp(`checked out HEAD \\(${short}\\)\\n`));
      assert.doesNotMatch(second.stderr, /bytes of objects added/);
    } finally {
      await removeProfile(profile);
      await docker("volume", "rm", "-f", `sandbox-cache-${await repoId(server.url("proj.git"))}`)
        .catch(() => {}); // absent when the run failed before making it
    }
  },
});
