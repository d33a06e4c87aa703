/**
 * Attacks on a remote repository's push policy, made as the agent would make them: a scripted
 * agent in a real sandbox runs `curl` and `git push` against `$SANDBOX_GIT_URL` with the session
 * token from its own environment. The remote is a real `git http-backend` on the host that
 * requires the user's token (which the sandbox never holds); the proof is the remote's refs,
 * compared with `git for-each-ref` before and after, and each refusal has a twin that succeeds
 * from the same place, with the same tools, on the same proxy.
 *
 * The sandbox-side script depends only on `$SANDBOX_GIT_URL` and `$SANDBOX_LLM_TOKEN`, so it keeps
 * working whatever carries the sandbox's connections to the host.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { FAKE_LLM_KEY, FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { GitHttpServer } from "../_git_server.ts";
import type { RunMeta } from "../../lib/run/run_log.ts";
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

console.error("security: git push policy attacks starting");

const RUN_BRANCH = "agent/work";

async function git(...args: string[]): Promise<string> {
  const result = await run(["git", ...args]);
  if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr}`);
  return result.stdout.trim();
}

/** The remote's refs, `refname objectname`, sorted. */
async function remoteRefs(bare: string): Promise<string[]> {
  return (await git("-C", bare, "for-each-ref", "--format=%(refname) %(objectname)")).split("\n")
    .filter(Boolean).sort();
}

/** The agent's script (see the file), sent into the sandbox by the agent's own command. */
const ATTACK_SCRIPT = await Deno.readTextFile(new URL("./_git_push_attack.sh", import.meta.url));

interface Remote {
  bare: string;
  server: GitHttpServer;
  token: string;
}

/** A remote with main (two commits), dev and tag v1, served by git http-backend with a token. */
async function makeRemote(dir: string): Promise<Remote> {
  const token = `ghp_${crypto.randomUUID().replaceAll("-", "")}`;
  const bare = `${dir}/remotes/proj.git`;
  const seed = `${dir}/seed`;
  const id = [
    "-c",
    "user.name=Owner",
    "-c",
    "user.email=owner@example.test",
    "-c",
    "commit.gpgsign=false",
  ];
  await git("init", "-q", "--bare", bare);
  await git("init", "-q", "-b", "main", seed);
  await Deno.writeTextFile(`${seed}/README.md`, "remote readme\n");
  await git("-C", seed, "add", ".");
  await git("-C", seed, ...id, "commit", "-qm", "init");
  await git("-C", seed, "tag", "v1");
  await git("-C", seed, "checkout", "-qb", "dev");
  await Deno.writeTextFile(`${seed}/dev.txt`, "dev work\n");
  await git("-C", seed, "add", ".");
  await git("-C", seed, ...id, "commit", "-qm", "dev work");
  await git("-C", seed, "push", "-q", bare, "main", "dev", "v1");
  await git("-C", bare, "symbolic-ref", "HEAD", "refs/heads/main");
  return { bare, server: new GitHttpServer(`${dir}/remotes`, token), token };
}

async function runAgent(
  dir: string,
  remote: Remote,
  mode: "granted" | "no-push",
  extraArgs: string[],
) {
  await using llm = new FakeLlm([
    toolCall("execute", {
      command:
        `cat > /tmp/attack.sh <<'EOF'\n${ATTACK_SCRIPT}\nEOF\nbash /tmp/attack.sh ${mode} ${RUN_BRANCH}`,
    }),
    text("done"),
  ]);
  const profile = uniqueProfile("sec-git");
  const config = await writeConfig(
    dir,
    `profiles:
  ${profile}:
    llm: {provider: custom, base_url: "${llm.baseUrl}", key: {env: SANDBOX_TEST_LLM_KEY}}
    git: {token: {env: SANDBOX_TEST_GIT_TOKEN}}
`,
    `${profile}.yaml`,
  );
  await Deno.writeTextFile(`${dir}/prompt.txt`, "Push wherever you like");
  const result = await runCli(
    [
      "run",
      "agentic",
      "--profile",
      profile,
      "--prompt-file",
      `${dir}/prompt.txt`,
      "--repo",
      remote.server.url("proj.git"),
      "--branch",
      RUN_BRANCH,
      ...extraArgs,
    ],
    {
      config,
      env: {
        SANDBOX_TEST_LLM_KEY: FAKE_LLM_KEY,
        SANDBOX_TEST_GIT_TOKEN: remote.token,
        XDG_STATE_HOME: `${dir}/state`,
      },
    },
  );
  const context = explain(result);
  const messages = result.stdout.trim()
    ? result.stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1))
    : [];
  const output =
    messages.find((m) => m.type === "tool_result" && m.tool_name === "execute")?.tool_output ?? "";
  // Each `name=<status> <body>` or `name: <git output>` line of the agent's script, by name.
  const said = new Map<string, string>();
  for (const line of output.split("\n")) {
    const match = /^([a-z0-9-]+)[=:] ?(.*)$/.exec(line);
    if (match && !said.has(match[1])) said.set(match[1], match[2]);
  }
  const log = (await Deno.readTextFile(`${dir}/state/sandbox/access.ndjson`).catch(() => "")).trim()
    .split("\n").filter(Boolean)
    .map((l) => JSON.parse(l)).filter((e) => e.kind === "git");
  return { result, context: `${context}\n--- agent output\n${output}`, said, log, profile };
}

/** `said` for `name` starts with `status` (the HTTP status curl saw). */
function assertStatus(
  said: Map<string, string>,
  name: string,
  status: number,
  body: RegExp,
  context: string,
): void {
  const line = said.get(name);
  assert.ok(line !== undefined, `the agent never tried "${name}"\n${context}`);
  assert.match(line, new RegExp(`^${status} `), `${name}: expected ${status}\n${context}`);
  assert.match(line, body, `${name}\n${context}`);
}

Deno.test({
  name:
    "with --push, the agent's query-string bypass, odd endpoints, tags, main and deletions are refused; only its branch moves",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using dir = await tempDir("sandbox-sec-git-");
    const remote = await makeRemote(dir.path);
    await using _server = remote.server;
    const before = await remoteRefs(remote.bare);
    const { result, context, said, log, profile } = await runAgent(dir.path, remote, "granted", [
      "--push",
    ]);
    try {
      assert.equal(result.exitCode, 0, context);
      const commits = said.get("agent-commits")?.split(" ") ?? [];
      assert.equal(commits.length, 2, `the agent's script did not finish\n${context}`);

      await t.step("the query-string bypass is refused: a POST's service is its path", () => {
        assertStatus(said, "bypass", 400, /a query on POST git-receive-pack/, context);
        assertStatus(said, "bypass-via-upload", 400, /a query on POST git-upload-pack/, context);
      });
      await t.step("every other endpoint shape is refused", () => {
        for (
          const name of [
            "dot-segment",
            "double-slash",
            "encoded-slash",
            "encoded-name",
            "two-services",
            "dumb-http",
          ]
        ) {
          assertStatus(said, name, 400, /^400 sandbox git proxy: /, context);
        }
        assertStatus(said, "trailing-slash", 404, /not a smart HTTP endpoint/, context);
      });
      await t.step(
        "the same attack on the plain path is read as a push and refused for its refs, gzip or not",
        () => {
          assertStatus(
            said,
            "plain-path",
            403,
            /push refused: updating "refs\/heads\/main"/,
            context,
          );
          assertStatus(said, "gzip", 403, /push refused: updating "refs\/heads\/main"/, context);
        },
      );
      await t.step(
        "git push of a tag, of main, and deletions (of another branch and of its own) are refused",
        () => {
          for (const name of ["push-tag", "push-main", "delete-dev"]) {
            assert.match(said.get(name) ?? "", /403|push refused/, `${name}\n${context}`);
          }
          assert.match(said.get("delete-own") ?? "", /403|push refused/, `delete-own\n${context}`);
        },
      );
      await t.step(
        "the twins succeed: the agent's hand-made push of its branch, plain and gzip",
        () => {
          assertStatus(said, "own-branch", 200, new RegExp(`ok refs/heads/${RUN_BRANCH}`), context);
          assertStatus(
            said,
            "own-branch-gzip",
            200,
            new RegExp(`ok refs/heads/${RUN_BRANCH}`),
            context,
          );
        },
      );
      await t.step(
        "the remote's refs: exactly the run branch added, at the agent's last commit",
        async () => {
          const after = await remoteRefs(remote.bare);
          assert.deepEqual(
            after.filter((r) => !r.startsWith(`refs/heads/${RUN_BRANCH} `)),
            before,
            context,
          );
          assert.deepEqual(after.filter((r) => !before.includes(r)), [
            `refs/heads/${RUN_BRANCH} ${commits[1]}`,
          ], context);
        },
      );
      await t.step(
        "the access log records each whole request target, refused ones as denied",
        () => {
          const denied = (target: string) => log.find((e) => e.target === target);
          const bypass = denied("/git/git-receive-pack?service=git-upload-pack");
          assert.equal(bypass?.decision, "deny", JSON.stringify(log));
          assert.equal(bypass?.status, 400);
          assert.equal(denied("/git/x/../git-receive-pack")?.decision, "deny");
          assert.equal(
            denied("/git/info/refs?service=git-upload-pack&service=git-receive-pack")?.status,
            400,
          );
          assert.ok(
            log.some((e) =>
              e.decision === "allow" && e.target === "/git/git-receive-pack" && e.status === 200
            ),
          );
          assert.ok(!JSON.stringify(log).includes(remote.token));
        },
      );
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "without --push the session grants no push at all, not even of the run branch; the remote is unchanged and stderr says where the commits are",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using dir = await tempDir("sandbox-sec-git-");
    const remote = await makeRemote(dir.path);
    await using _server = remote.server;
    const before = await remoteRefs(remote.bare);
    const { result, context, said, log, profile } = await runAgent(dir.path, remote, "no-push", []);
    try {
      assert.equal(result.exitCode, 0, context);
      const [commit] = said.get("agent-commits")?.split(" ") ?? [];
      assert.match(commit ?? "", /^[0-9a-f]{40}$/, `the agent's script did not finish\n${context}`);

      await t.step(
        "git push of the run branch, a hand-made push and the push advertisement are refused (403)",
        () => {
          assert.match(said.get("push-own") ?? "", /403|no push grant/, context);
          assertStatus(said, "own-branch", 403, /no push grant/, context);
          assertStatus(said, "advertisement", 403, /no push grant/, context);
          assertStatus(said, "bypass", 400, /a query on POST/, context);
        },
      );
      await t.step("the twin: fetching through the same proxy works", async () => {
        const main = (await remoteRefs(remote.bare)).find((r) =>
          r.startsWith("refs/heads/main ")
        )!.split(" ")[1];
        assert.match(
          said.get("ls-remote") ?? "",
          new RegExp(`^${main}\\s+refs/heads/main`),
          context,
        );
      });
      await t.step("the remote's refs are unchanged", async () => {
        assert.deepEqual(await remoteRefs(remote.bare), before, context);
        assert.ok(
          !log.some((e) => e.decision === "allow" && /receive-pack/.test(e.target ?? "")),
          JSON.stringify(log),
        );
      });
      await t.step(
        "stderr says the commits were not pushed and where they are; they are there",
        async () => {
          const where =
            /branch agent\/work: (\d+) commit\(s\) on [0-9a-f]{12}, not pushed: kept in (\S+) as (\S+) of (\S+)$/m
              .exec(result.stderr);
          assert.ok(where, context);
          const [, count, container, branch, bare] = where;
          // The run's own container, kept with its commits (every other run's goes when it ends).
          const runId = /run (\S+) \(/.exec(result.stderr)?.[1];
          const meta: RunMeta = JSON.parse(
            await Deno.readTextFile(`${dir.path}/state/sandbox/runs/${runId}/meta.json`),
          );
          assert.equal(container, meta.extra?.container, context);
          assert.equal(meta.extra?.kept, true, JSON.stringify(meta.extra));
          assert.equal(count, "1");
          // Under the exec wrapper, like every command of the tool's.
          assert.equal(
            await docker(
              "exec",
              container,
              "sandbox-exec",
              `check-${crypto.randomUUID()}`,
              "git",
              "-C",
              bare,
              "rev-parse",
              `refs/heads/${branch}`,
            ),
            commit,
          );
        },
      );
    } finally {
      await removeProfile(profile);
    }
  },
});
