/**
 * `sandbox run agentic --repo PATH` as a user runs it: the real CLI as a subprocess, a real sandbox
 * container, the scripted fake LLM on 127.0.0.1, and a real git repository in a temporary
 * directory. The committed base goes in as git objects; the agent's work comes back as one branch;
 * nothing else of the user's repository (HEAD, index, working tree, other refs, config, hooks) may
 * change, whatever the agent does in the sandbox. Every test has its own profile (removed
 * afterwards), its own repository and its own `$XDG_STATE_HOME`.
 */
import { git } from "../_git.ts";
import { RunFixture } from "../_run_fixture.ts";
import { localRepoKey } from "../../lib/repo/local.ts";
import assert from "node:assert/strict";
import { run, type RunResult } from "../../lib/process.ts";
import { FakeLlm, type FakeStep, text, toolCall } from "../_fake_llm.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  tempDir,
  unexpectedBinds,
} from "../_helpers.ts";

console.error("e2e: sandbox run --repo tests starting");

const KEY_ENV = "SANDBOX_E2E_REPO_KEY";
/** Identity for the test's own commits in the user's repository. */
const USER_GIT = [
  "-c",
  "user.name=Repo Owner",
  "-c",
  "user.email=owner@example.test",
  "-c",
  "commit.gpgsign=false",
];

// deno-lint-ignore no-explicit-any
type Wire = Record<string, any>;

/** `git ARGS` in `cwd`; stdout, or a failure with stderr. */

/** A new repository at `path` (branch main) with `files` in its first commit. */
async function createRepo(
  path: string,
  files: Record<string, string | Uint8Array>,
): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  await git(path, "init", "-q", "-b", "main");
  await commitFiles(path, files, "initial commit");
  return await Deno.realPath(path);
}

/** Write `files` and commit them all. */
async function commitFiles(
  repo: string,
  files: Record<string, string | Uint8Array>,
  message: string,
): Promise<string> {
  for (const [name, content] of Object.entries(files)) {
    const file = `${repo}/${name}`;
    await Deno.mkdir(file.slice(0, file.lastIndexOf("/")), { recursive: true });
    if (typeof content === "string") await Deno.writeTextFile(file, content);
    else await Deno.writeFile(file, content);
  }
  await git(repo, "add", "-A");
  await git(repo, ...USER_GIT, "commit", "-q", "-m", message);
  return await git(repo, "rev-parse", "HEAD");
}

/** Every byte of a directory's regular files, by relative name (for hooks). */
async function dirBytes(dir: string): Promise<Record<string, Uint8Array>> {
  const out: Record<string, Uint8Array> = {};
  for await (const entry of Deno.readDir(dir)) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) {
      for (const [name, bytes] of Object.entries(await dirBytes(path))) {
        out[`${entry.name}/${name}`] = bytes;
      }
    } else {
      out[entry.name] = await Deno.readFile(path);
    }
  }
  return out;
}

/** What the user sees of their repository, minus the objects database. */
interface RepoState {
  head: string;
  symbolicHead: string;
  status: string;
  index: string;
  /** `refname objectname`, sorted. */
  refs: string[];
  config: Uint8Array;
  hooks: Record<string, Uint8Array>;
  /** Top-level entries of `.git`. */
  gitDirEntries: string[];
  /** Bytes of the named working-tree files. */
  files: Record<string, Uint8Array>;
}

async function repoState(repo: string, files: string[] = []): Promise<RepoState> {
  const gitDirEntries: string[] = [];
  for await (const entry of Deno.readDir(`${repo}/.git`)) gitDirEntries.push(entry.name);
  const contents: Record<string, Uint8Array> = {};
  for (const name of files) contents[name] = await Deno.readFile(`${repo}/${name}`);
  return {
    head: await git(repo, "rev-parse", "HEAD"),
    symbolicHead: await git(repo, "symbolic-ref", "HEAD"),
    status: await git(repo, "status", "--porcelain", "--untracked-files=all"),
    index: await git(repo, "ls-files", "--stage"),
    refs: (await git(repo, "for-each-ref", "--format=%(refname) %(objectname)")).split("\n").filter(
      Boolean,
    ).sort(),
    config: await Deno.readFile(`${repo}/.git/config`),
    hooks: await dirBytes(`${repo}/.git/hooks`),
    gitDirEntries: gitDirEntries.sort(),
    files: contents,
  };
}

/**
 * The user's repository after a run is the one before, plus exactly `refs/heads/<branch>`: same
 * HEAD, index, working tree, other refs, config, hooks and `.git` entries.
 */
function assertOnlyBranchAdded(
  before: RepoState,
  after: RepoState,
  branch: string,
  context: string,
): void {
  assert.equal(after.head, before.head, `HEAD moved\n${context}`);
  assert.equal(after.symbolicHead, before.symbolicHead, `HEAD switched branch\n${context}`);
  assert.equal(after.status, before.status, `git status changed\n${context}`);
  assert.equal(after.index, before.index, `the index changed\n${context}`);
  const added = after.refs.filter((r) => !before.refs.includes(r));
  const removed = before.refs.filter((r) => !after.refs.includes(r));
  assert.deepEqual(removed, [], `refs changed or removed\n${context}`);
  assert.equal(added.length, 1, `refs added: ${added.join(", ")}\n${context}`);
  assert.match(
    added[0],
    new RegExp(`^refs/heads/${branch.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")} [0-9a-f]{40}$`),
    context,
  );
  assert.deepEqual(after.config, before.config, `.git/config changed\n${context}`);
  assert.deepEqual(
    Object.keys(after.hooks).sort(),
    Object.keys(before.hooks).sort(),
    `hook files added or removed\n${context}`,
  );
  assert.deepEqual(after.hooks, before.hooks, `a hook's content changed\n${context}`);
  assert.deepEqual(
    after.gitDirEntries,
    before.gitDirEntries,
    `.git gained or lost entries\n${context}`,
  );
  assert.deepEqual(after.files, before.files, `working-tree files changed\n${context}`);
}

/** Every stdout line as JSON. */
function parseLines(stdout: string, context: string): Wire[] {
  assert.ok(stdout.endsWith("\n"), `stdout does not end with a newline\n${context}`);
  return stdout.slice(0, -1).split("\n").map((line, i) => {
    try {
      return JSON.parse(line);
    } catch {
      assert.fail(`stdout line ${i + 1} is not JSON: ${line}\n${context}`);
    }
  });
}

/** The run id from stderr's `sandbox: run <id> (...)` line. */
function runIdFrom(stderr: string): string {
  const match = stderr.match(/^sandbox: run (\S+) \(/m);
  assert.ok(match, `stderr names no run:\n${stderr}`);
  return match[1];
}

/** The output of the execute tool calls, in order. */
function executeOutputs(messages: Wire[]): string[] {
  return messages.filter((m) => m.type === "tool_result" && m.tool_name === "execute").map((m) =>
    m.tool_output
  );
}

/** `sent <base> (<commit>): N bytes of objects` from stderr. */
/** Bytes of objects the run added to its repository's cache (0 when it had the base already). */
function sentBytes(stderr: string): number {
  const match = stderr.match(
    /^sandbox: checked out \S+ \([0-9a-f]{12}\)(?:; (\d+) bytes of objects added to its cache)?$/m,
  );
  assert.ok(match, `stderr reports no checkout:\n${stderr}`);
  return Number(match[1] ?? 0);
}

/** The run's container (as its metadata records it) is removed: moments after the run, behind it. */
async function assertRunContainerRemoved(fixture: RunFixture, id: string): Promise<string> {
  const container = (await fixture.meta(id)).extra?.container;
  assert.equal(typeof container, "string", "the run's metadata names its container");
  for (let i = 0; i < 100; i++) {
    if ((await run(["docker", "container", "inspect", container as string])).exitCode !== 0) {
      return container as string;
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.fail(`${container} is still there after its run`);
}

/** A container of the repository's warm pool, made as the run's was (refilled behind the run). */
async function poolContainerOf(fixture: RunFixture, repo: string): Promise<string> {
  const key = await localRepoKey(repo);
  for (let i = 0; i < 150; i++) {
    const names = (await docker(
      "ps",
      "--filter",
      `label=dev.sandbox.profile=${fixture.profile}`,
      "--filter",
      `label=dev.sandbox.repo=${key}`,
      "--filter",
      "label=dev.sandbox.kind=pool",
      "--format",
      "{{.Names}}",
    )).split("\n").filter(Boolean);
    if (names.length > 0) return names[0];
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`no pooled container of ${repo}`);
}

/** A profile, its config, a prompt, an isolated state directory; removed on dispose. */
class RepoFixture extends RunFixture {
  static create(prefix: string, llmUrl: string): Promise<RepoFixture> {
    return RepoFixture.make({
      prefix,
      llmUrl,
      keyEnv: KEY_ENV,
      prompt: "Work on the repository.\n",
    });
  }

  async prompt(name: string, content: string): Promise<string> {
    const path = `${this.dir.path}/${name}`;
    await Deno.writeTextFile(path, content);
    return path;
  }

  /** `sandbox run agentic --prompt-file P --profile X --format ndjson ARGS`. */
  run(
    args: string[],
    options: { promptFile?: string; env?: Record<string, string> } = {},
  ): Promise<RunResult> {
    return this.cli(
      [
        "run",
        "agentic",
        "--prompt-file",
        options.promptFile ?? this.promptFile,
        "--profile",
        this.profile,
        "--format",
        "ndjson",
        ...args,
      ],
      options.env,
    );
  }
}

Deno.test({
  name:
    "run --repo: the agent's uncommitted file comes back as branch sandbox/<run-id>, and nothing else of the user's repository changes",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", {
        command: "echo MARKER-START; cat README.md; ls -a; git status --porcelain; echo MARKER-END",
      }),
      toolCall("write_file", { file_path: "agent.txt", content: "written by the agent\n" }),
      text("Done: wrote agent.txt"),
    ]);
    await using fixture = await RepoFixture.create("e2e-repo", llm.baseUrl);
    const repo = await createRepo(`${fixture.dir.path}/user-repo`, {
      "README.md": "committed content\n",
      "src/lib.txt": "library\n",
    });
    // Dirty: a modified tracked file and an untracked one, neither of which may be sent.
    await Deno.writeTextFile(`${repo}/README.md`, "DIRTY uncommitted content\n");
    await Deno.writeTextFile(`${repo}/untracked-secret.txt`, "never leaves the host\n");
    const before = await repoState(repo, ["README.md", "untracked-secret.txt", "src/lib.txt"]);

    const result = await fixture.run(["--repo", repo]);
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const id = runIdFrom(result.stderr);
    const branch = `sandbox/${id}`;
    const messages = parseLines(result.stdout, context);
    const after = await repoState(repo, ["README.md", "untracked-secret.txt", "src/lib.txt"]);

    await t.step("the sandbox saw the committed base only, not the dirty working tree", () => {
      const [listing] = executeOutputs(messages);
      assert.ok(listing?.includes("MARKER-END"), `the agent's command never ran\n${context}`);
      const seen = listing.slice(listing.indexOf("MARKER-START"), listing.indexOf("MARKER-END"));
      assert.match(seen, /committed content/, context);
      assert.doesNotMatch(seen, /DIRTY/, context);
      assert.doesNotMatch(seen, /untracked-secret/, context);
      assert.ok(!result.stdout.includes("never leaves the host"), context);
    });

    await t.step(
      "stderr warns that the uncommitted changes are NOT sent, and reports the transfer and the branch",
      () => {
        assert.match(
          result.stderr,
          /^sandbox: warning: 2 uncommitted change\(s\) in .* are NOT sent/m,
          context,
        );
        assert.ok(sentBytes(result.stderr) > 0, context);
        assert.match(
          result.stderr,
          new RegExp(
            `^sandbox: branch ${branch} in ${repo}: 1 commit\\(s\\) on ${before.head.slice(0, 12)}`,
            "m",
          ),
          context,
        );
        assert.match(result.stderr, /^sandbox: {3}agent\.txt \| 1 \+$/m, context);
      },
    );

    await t.step(
      "the branch holds the agent's file, committed by the tool on the base",
      async () => {
        assert.equal(
          await git(repo, "show", `refs/heads/${branch}:agent.txt`),
          "written by the agent",
        );
        assert.equal(
          await git(repo, "show", `refs/heads/${branch}:README.md`),
          "committed content",
        );
        assert.equal(
          await git(repo, "log", "-1", "--format=%an <%ae>", `refs/heads/${branch}`),
          "sandbox <sandbox@localhost>",
        );
        assert.equal(await git(repo, "rev-parse", `refs/heads/${branch}^`), before.head);
        assert.equal(
          await git(repo, "rev-list", "--count", `${before.head}..refs/heads/${branch}`),
          "1",
        );
        assert.ok(
          !(await git(repo, "ls-tree", "-r", "--name-only", `refs/heads/${branch}`)).includes(
            "untracked-secret",
          ),
        );
      },
    );

    await t.step("HEAD, index, working tree, other refs, config and hooks are unchanged", () => {
      assertOnlyBranchAdded(before, after, branch, context);
      assert.equal(
        new TextDecoder().decode(after.files["README.md"]),
        "DIRTY uncommitted content\n",
      );
    });

    await t.step("run metadata records the branch", async () => {
      const meta = await fixture.meta(id);
      assert.equal(meta.status, "succeeded");
      assert.equal(meta.extra?.repo, repo);
      assert.equal(meta.extra?.branch, branch);
      assert.equal(meta.extra?.base, before.head);
      assert.equal(meta.extra?.commit, await git(repo, "rev-parse", `refs/heads/${branch}`));
    });

    await t.step(
      "a run's container has no bind mounts (but its proxy sockets, read-only) and never heard of the host path",
      async () => {
        const inspect =
          JSON.parse(await docker("container", "inspect", await poolContainerOf(fixture, repo)))[0];
        assert.deepEqual(unexpectedBinds(inspect.Mounts), [], JSON.stringify(inspect.Mounts));
        assert.ok(!inspect.HostConfig.Binds?.length, JSON.stringify(inspect.HostConfig.Binds));
        assert.ok(
          !JSON.stringify(inspect).includes(repo),
          "the host repository's path is in docker inspect",
        );
      },
    );

    await t.step("the run's container, with its checkout and branch, is gone", async () => {
      await assertRunContainerRemoved(fixture, id);
    });
  },
});

/** What the hostile step does from the agent's worktree: everything but its own branch. */
const HOSTILE_COMMAND = [
  "set -e",
  'evil=$(git commit-tree "HEAD^{tree}" -p HEAD -m "evil commit")',
  'echo "EVIL=$evil"',
  'git update-ref refs/heads/main "$evil"',
  'git tag evil-tag "$evil"',
  'git branch evil "$evil"',
  "common=$(git rev-parse --git-common-dir)",
  'mkdir -p "$common/hooks"',
  `printf '#!/bin/sh\\necho pwned >/tmp/pwned\\n' >"$common/hooks/post-checkout"`,
  'chmod +x "$common/hooks/post-checkout"',
  'git config core.hooksPath "$common/hooks"',
  'echo "HOOKS=$(git config --get core.hooksPath)"',
  "git for-each-ref --format='%(refname)'",
  "echo HOSTILE-DONE",
].join("\n");

Deno.test({
  name:
    "run --repo: refs, tags, hooks and config the agent creates in the sandbox never reach the user's repository, and stderr warns about them",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: HOSTILE_COMMAND }),
      toolCall("write_file", { file_path: "feature.txt", content: "the real work\n" }),
      text("Done"),
    ]);
    await using fixture = await RepoFixture.create("e2e-hostile", llm.baseUrl);
    const repo = await createRepo(`${fixture.dir.path}/user-repo`, { "README.md": "hello\n" });
    const before = await repoState(repo, ["README.md"]);

    const result = await fixture.run(["--repo", repo]);
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const id = runIdFrom(result.stderr);
    const messages = parseLines(result.stdout, context);
    const [hostile] = executeOutputs(messages);
    assert.ok(hostile?.includes("HOSTILE-DONE"), `the hostile step did not complete\n${context}`);
    const evil = hostile.match(/^EVIL=([0-9a-f]{40})$/m)?.[1];
    assert.ok(evil, context);
    // (The checkout is a repository of its own: its git directory is `.git`, relative.)
    assert.match(hostile, /^HOOKS=(\/workspace\/worktrees\/[^\n]*\/)?\.git\/hooks$/m, context);
    assert.match(
      hostile,
      /^refs\/heads\/main$/m,
      `the sandbox did not get refs/heads/main\n${context}`,
    );
    const after = await repoState(repo, ["README.md"]);

    await t.step("only the run branch arrived, with the agent's real work", async () => {
      assertOnlyBranchAdded(before, after, `sandbox/${id}`, context);
      assert.equal(
        await git(repo, "show", `refs/heads/sandbox/${id}:feature.txt`),
        "the real work",
      );
      assert.equal(await git(repo, "rev-parse", "refs/heads/main"), before.head);
    });

    await t.step("the evil commit, tag and branch are not in the user's repository", async () => {
      const has = await run(["git", "-C", repo, "cat-file", "-e", `${evil}^{commit}`]);
      assert.notEqual(has.exitCode, 0, "the evil commit's object was imported");
      assert.equal(await git(repo, "tag", "--list"), "");
      assert.equal(
        (await run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", "refs/heads/evil"]))
          .exitCode,
        1,
      );
      assert.equal(
        (await run(["git", "-C", repo, "config", "--get", "core.hooksPath"])).stdout,
        "",
      );
    });

    await t.step(
      "stderr warns about each ref the sandbox created and that was not imported",
      () => {
        for (const ref of ["refs/heads/main", "refs/heads/evil", "refs/tags/evil-tag"]) {
          assert.match(
            result.stderr,
            new RegExp(`^sandbox: warning: the sandbox created ${ref}: not imported`, "m"),
            context,
          );
        }
      },
    );
  },
});

/** What a hostile run leaves in the sandbox's shared repository for the runs after it. */
const PLANTING_COMMAND = [
  "set -e",
  'evil=$(git commit-tree "HEAD^{tree}" -p HEAD -m "evil commit")',
  'git branch evil "$evil"',
  'git branch sandbox/planted "$evil"',
  "common=$(git rev-parse --git-common-dir)",
  'mkdir -p "$common/hooks"',
  `printf '#!/bin/sh\\necho "$(pwd)" >>/tmp/pwned\\necho injected >injected.txt\\n' >"$common/hooks/post-checkout"`,
  'chmod +x "$common/hooks/post-checkout"',
  'git config core.hooksPath "$common/hooks"',
  "echo PLANTED",
].join("\n");

Deno.test({
  name:
    "run --repo: what one run's agent leaves in its repository (branches, hooks, config) does not reach or block the next runs",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([
      // Run 1: plant a branch, a branch in the tool's own namespace, and a hook.
      toolCall("execute", { command: PLANTING_COMMAND }),
      text("Done"),
      // Run 2: honest work.
      toolCall("write_file", { file_path: "honest.txt", content: "honest\n" }),
      text("Done"),
      // Run 3: honest work on a branch name the sandbox (not the user) already has.
      toolCall("write_file", { file_path: "third.txt", content: "third\n" }),
      text("Done"),
    ]);
    await using fixture = await RepoFixture.create("e2e-plant", llm.baseUrl);
    const repo = await createRepo(`${fixture.dir.path}/user-repo`, { "README.md": "hello\n" });

    const first = await fixture.run(["--repo", repo]);
    assert.equal(first.exitCode, 0, explain(first));
    assert.ok(
      executeOutputs(parseLines(first.stdout, explain(first)))[0]?.includes("PLANTED"),
      explain(first),
    );

    await t.step(
      "every ref the agent created is reported, including one under refs/heads/sandbox/",
      () => {
        // Regression test for a fixed bug (lib/repo.ts collectResult), which was: refs under refs/heads/sandbox/ are filtered out of
        // ignoredRefs, so an agent's own refs/heads/sandbox/planted goes unreported.
        assert.match(
          first.stderr,
          /^sandbox: warning: the sandbox created refs\/heads\/evil: not imported/m,
          explain(first),
        );
        assert.match(
          first.stderr,
          /^sandbox: warning: the sandbox created refs\/heads\/sandbox\/planted: not imported/m,
          explain(first),
        );
      },
    );

    await t.step(
      "the hook planted by run 1 does not run when run 2's worktree is made",
      async () => {
        // Regression test for a fixed bug (lib/repo.ts prepareWorktree), which was: `git worktree add` runs the bare repository's
        // post-checkout hook (and honours core.hooksPath) that an earlier run's agent wrote; the
        // hook's file is then committed by the tool as run 2's "uncommitted changes".
        const second = await fixture.run(["--repo", repo]);
        const context = explain(second);
        assert.equal(second.exitCode, 0, context);
        const branch = `refs/heads/sandbox/${runIdFrom(second.stderr)}`;
        const files = (await git(repo, "ls-tree", "-r", "--name-only", branch)).split("\n");
        assert.ok(files.includes("honest.txt"), context);
        assert.deepEqual(
          files.filter((f) => f === "injected.txt"),
          [],
          `run 1's hook wrote into run 2's branch\n${context}`,
        );
      },
    );

    await t.step(
      "a --branch name the user's repository lacks works even if the sandbox has it",
      async () => {
        // Regression test for a fixed bug (lib/repo.ts prepareWorktree), which was: `git worktree add -b <branch>` fails with "a branch
        // named 'evil' already exists" (exit 125) because run 1's agent made it in the sandbox.
        const third = await fixture.run(["--repo", repo, "--branch", "evil"]);
        const context = explain(third);
        assert.equal(third.exitCode, 0, context);
        assert.equal(await git(repo, "show", "refs/heads/evil:third.txt"), "third");
      },
    );
  },
});

/**
 * One loopback LLM endpoint for two concurrent runs of one profile: each request goes to the fake
 * whose marker is in it (each run's prompt carries one), and each run's `barrierAt`-th request is
 * held until every run has sent its own — so both agents are live, mid-run, at the same moment.
 */
class RoutedLlm implements AsyncDisposable {
  readonly #fakes: Map<string, FakeLlm>;
  readonly #counts = new Map<string, number>();
  readonly #arrived = new Set<string>();
  readonly #barrier = Promise.withResolvers<void>();
  readonly #server: Deno.HttpServer<Deno.NetAddr>;

  constructor(fakes: Record<string, FakeLlm>, readonly barrierAt: number) {
    this.#fakes = new Map(Object.entries(fakes));
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (req) => {
        const body = await req.text();
        const marker = [...this.#fakes.keys()].find((m) => body.includes(m));
        if (!marker) {
          return Response.json({ error: { message: "no run marker in the request" } }, {
            status: 400,
          });
        }
        const n = (this.#counts.get(marker) ?? 0) + 1;
        this.#counts.set(marker, n);
        if (n === this.barrierAt) {
          this.#arrived.add(marker);
          if (this.#arrived.size === this.#fakes.size) this.#barrier.resolve();
          await this.#barrier.promise;
        }
        const url = new URL(req.url);
        return await fetch(
          `http://127.0.0.1:${this.#fakes.get(marker)!.port}${url.pathname}${url.search}`,
          {
            method: req.method,
            headers: req.headers,
            body: body || undefined,
          },
        );
      },
    );
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.#server.addr.port}/v1`;
  }

  /** Let held requests through (when one run ended early, so the other does not wait forever). */
  release(): void {
    this.#barrier.resolve();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.release();
    await this.#server.shutdown();
  }
}

/** Steps of one concurrent run: write its file, then (after the barrier) look around. */
function concurrentScript(file: string): FakeStep[] {
  return [
    toolCall("write_file", { file_path: file, content: `${file}\n` }),
    toolCall("execute", {
      command: "echo LIST-START; hostname; ls -A /workspace/worktrees; ls -A; " +
        "find /workspace /tmp /home -name '*-only.txt' 2>/dev/null; echo LIST-END",
    }),
    text(`Done: ${file}`),
  ];
}

/**
 * Two runs of one profile on one repository, started at once. With `separateState`, run B keeps
 * its run log in its own `$XDG_STATE_HOME` (another shell, a CI job, sudo).
 */
async function concurrentRuns(t: Deno.TestContext, separateState: boolean): Promise<void> {
  await using fakeA = new FakeLlm(concurrentScript("a-only.txt"));
  await using fakeB = new FakeLlm(concurrentScript("b-only.txt"));
  // The barrier holds each run's second request (the one answered by `execute`) until both
  // agents have written their file.
  await using router = new RoutedLlm({ "RUN-MARKER-AAA": fakeA, "RUN-MARKER-BBB": fakeB }, 2);
  await using fixture = await RepoFixture.create("e2e-conc", router.baseUrl);
  const repo = await createRepo(`${fixture.dir.path}/user-repo`, { "README.md": "shared base\n" });
  const before = await repoState(repo, ["README.md"]);
  const promptA = await fixture.prompt("a.txt", "RUN-MARKER-AAA: write a-only.txt\n");
  const promptB = await fixture.prompt("b.txt", "RUN-MARKER-BBB: write b-only.txt\n");

  const finished = (result: RunResult) => {
    router.release();
    return result;
  };
  const [a, b] = await Promise.all([
    fixture.run(["--repo", repo], { promptFile: promptA }).then(finished),
    fixture.run(["--repo", repo], {
      promptFile: promptB,
      env: separateState ? { XDG_STATE_HOME: `${fixture.dir.path}/state-b` } : {},
    }).then(finished),
  ]);
  const context = `--- run A\n${explain(a)}\n--- run B\n${explain(b)}`;
  assert.equal(a.exitCode, 0, context);
  assert.equal(b.exitCode, 0, context);
  const runs = [
    { result: a, own: "a-only.txt", other: "b-only.txt", id: runIdFrom(a.stderr) },
    { result: b, own: "b-only.txt", other: "a-only.txt", id: runIdFrom(b.stderr) },
  ];
  const listings = runs.map(({ result }) => {
    const listing = executeOutputs(parseLines(result.stdout, context))[0] ?? "";
    assert.ok(listing.includes("LIST-END"), `a run's listing never ran\n${context}`);
    return listing.slice(listing.indexOf("LIST-START"), listing.indexOf("LIST-END"));
  });

  await t.step("each run had a container of its own", () => {
    const hostnames = listings.map((l) => l.split("\n")[1]);
    assert.notEqual(hostnames[0], hostnames[1], `both agents ran in ${hostnames[0]}\n${context}`);
  });

  await t.step("neither agent's listing shows the other's file or worktree", () => {
    runs.forEach(({ own, other, id }, i) => {
      const otherId = runs[1 - i].id;
      assert.ok(listings[i].includes(own), `run ${id} does not see its own file:\n${listings[i]}`);
      assert.ok(!listings[i].includes(other), `run ${id} sees ${other}:\n${listings[i]}`);
      assert.ok(
        !listings[i].includes(otherId),
        `run ${id} sees the other run's worktree:\n${listings[i]}`,
      );
    });
  });

  await t.step("each run has its own branch, holding its file only", async () => {
    assert.notEqual(runs[0].id, runs[1].id);
    for (const { own, other, id } of runs) {
      const files = (await git(repo, "ls-tree", "-r", "--name-only", `refs/heads/sandbox/${id}`))
        .split("\n");
      assert.ok(files.includes(own), `sandbox/${id}: ${files.join(", ")}`);
      assert.ok(!files.includes(other), `sandbox/${id}: ${files.join(", ")}`);
    }
    const refs = (await git(repo, "for-each-ref", "--format=%(refname)")).split("\n").sort();
    assert.deepEqual(
      refs,
      ["refs/heads/main", ...runs.map((r) => `refs/heads/sandbox/${r.id}`)].sort(),
    );
    const after = await repoState(repo, ["README.md"]);
    assert.equal(after.head, before.head);
    assert.equal(after.status, before.status);
  });

  await t.step(
    "each run's container is removed when its run ends (behind it: moments after)",
    async () => {
      if (!separateState) {
        for (const { id } of runs) await assertRunContainerRemoved(fixture, id);
      } else await assertRunContainerRemoved(fixture, runs[0].id);
    },
  );
}

Deno.test({
  name:
    "run --repo: two concurrent runs of one profile get separate containers and branches, and neither sees the other's files",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    // One state directory for both, as for one user in one environment.
    await concurrentRuns(t, false);
  },
});

Deno.test({
  name:
    "run --repo: two concurrent runs of one profile are kept apart even when their run logs are in different state directories",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    // Regression test for a fixed bug (lib/run.ts otherRunLive), which was: a live run is looked for only in this process's
    // $XDG_STATE_HOME, so a concurrent run logging elsewhere goes unnoticed: both share the
    // profile's container and each agent can list (and write) the other's worktree.
    await concurrentRuns(t, true);
  },
});

/** Random, incompressible bytes. */
function randomBytes(length: number): Uint8Array {
  const bytes = new Uint8Array(length);
  for (let i = 0; i < length; i += 65_536) crypto.getRandomValues(bytes.subarray(i, i + 65_536));
  return bytes;
}

Deno.test({
  name:
    "run --repo: a second run against the same repository adds only the objects its cache lacks, and nothing when it has the base",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      // Run 1: nothing to do.
      text("Nothing to change"),
      // Run 2: the worktree is at the new commit, with the big file from run 1's transfer.
      toolCall("execute", { command: "git log --format=%s; cat small.txt; wc -c <big.bin" }),
      text("Nothing to change either"),
      // Run 3, on the same commit: its worktree is at it, though nothing was sent.
      toolCall("execute", {
        command: "git log --format=%s; cat small.txt; git status --porcelain | wc -l",
      }),
      text("Still nothing to change"),
    ]);
    await using fixture = await RepoFixture.create("e2e-incr", llm.baseUrl);
    const repo = await createRepo(`${fixture.dir.path}/user-repo`, {
      "README.md": "big repository\n",
      "big.bin": randomBytes(200 * 1024),
    });

    const first = await fixture.run(["--repo", repo]);
    assert.equal(first.exitCode, 0, explain(first));
    const firstBytes = sentBytes(first.stderr);
    assert.ok(
      firstBytes >= 200 * 1024,
      `run 1 sent ${firstBytes} bytes for a 200 KiB random file\n${explain(first)}`,
    );
    assert.match(first.stderr, /the agent changed nothing: no branch created/, explain(first));

    const second = await commitFiles(repo, { "small.txt": "a small change\n" }, "small change");
    const next = await fixture.run(["--repo", repo]);
    const context = explain(next);
    assert.equal(next.exitCode, 0, context);
    const nextBytes = sentBytes(next.stderr);
    assert.match(next.stderr, new RegExp(`checked out HEAD \\(${second.slice(0, 12)}\\)`), context);
    // An empty pack is 32 bytes (header and checksum): run 2 must send the new commit's objects.
    assert.ok(nextBytes > 32, `run 2 sent no objects (${nextBytes} bytes)\n${context}`);
    assert.ok(
      nextBytes < firstBytes / 10,
      `run 2 sent ${nextBytes} bytes, run 1 ${firstBytes}\n${context}`,
    );
    const [seen] = executeOutputs(parseLines(next.stdout, context));
    assert.match(seen ?? "", /^small change\ninitial commit\na small change\n\s*204800\b/, context);

    const third = await fixture.run(["--repo", repo]);
    const thirdContext = explain(third);
    assert.equal(third.exitCode, 0, thirdContext);
    assert.match(
      third.stderr,
      new RegExp(`^sandbox: checked out HEAD \\(${second.slice(0, 12)}\\)$`, "m"),
      thirdContext,
    );
    const [again] = executeOutputs(parseLines(third.stdout, thirdContext));
    assert.match(
      again ?? "",
      /^small change\ninitial commit\na small change\n\s*0\n/,
      thirdContext,
    );
  },
});

/**
 * Programs the CLI might use to reach a repository or start a sandbox, each recording its argv:
 * `git` then runs the real git, the others fail. First on PATH for the user-error tests.
 */
class RecordingBin implements AsyncDisposable {
  readonly dir: { path: string } & AsyncDisposable;
  readonly record: string;

  private constructor(dir: { path: string } & AsyncDisposable) {
    this.dir = dir;
    this.record = `${dir.path}/argv.log`;
  }

  static async create(): Promise<RecordingBin> {
    const bin = new RecordingBin(await tempDir("sandbox-e2e-bin-"));
    const realGit = (await run(["sh", "-c", "command -v git"])).stdout.trim();
    assert.ok(realGit, "git not found on PATH");
    const write = (name: string, tail: string) =>
      Deno.writeTextFile(
        `${bin.dir.path}/${name}`,
        `#!/bin/sh\nprintf '%s\\n' "${name} $*" >>"${bin.record}"\n${tail}\n`,
        { mode: 0o755 },
      );
    await write("git", `exec "${realGit}" "$@"`);
    for (const name of ["docker", "ssh", "curl", "wget", "nc"]) await write(name, "exit 97");
    await Deno.writeTextFile(bin.record, "");
    return bin;
  }

  get path(): string {
    return `${this.dir.path}:${Deno.env.get("PATH") ?? "/usr/bin:/bin"}`;
  }

  async calls(): Promise<string[]> {
    return (await Deno.readTextFile(this.record)).split("\n").filter(Boolean);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.dir[Symbol.asyncDispose]();
  }
}

/** A loopback server that records every request (a git host, or a proxy for everything). */
function recordingServer(): { requests: string[]; url: string } & AsyncDisposable {
  const requests: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    requests.push(`${req.method} ${req.url}`);
    return new Response("no", { status: 403 });
  });
  return {
    requests,
    url: `http://127.0.0.1:${server.addr.port}`,
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

Deno.test({
  name: "run --repo: user mistakes fail with exit 2 and a clear message before any sandbox starts",
  async fn(t) {
    // The LLM is never reached: these fail before anything starts.
    await using llm = new FakeLlm([]);
    await using fixture = await RepoFixture.create("e2e-repoerr", llm.baseUrl);
    await using bin = await RecordingBin.create();
    const repo = await createRepo(`${fixture.dir.path}/user-repo`, { "README.md": "hello\n" });
    await git(repo, "branch", "taken");
    const env = { PATH: bin.path, GIT_CEILING_DIRECTORIES: fixture.dir.path };
    const before = await repoState(repo, ["README.md"]);

    const expectUsage = async (args: string[], message: RegExp) => {
      const result = await fixture.run(args, { env });
      const context = explain(result);
      assert.equal(result.exitCode, 2, context);
      assert.match(result.stderr, message, context);
      assert.equal(result.stdout, "", context);
      return result;
    };

    await t.step("a directory that is not a git repository", async () => {
      const plain = `${fixture.dir.path}/plain`;
      await Deno.mkdir(plain);
      await expectUsage(
        ["--repo", plain],
        new RegExp(`^sandbox: error: Not a git repository: "${plain}"$`, "m"),
      );
    });

    await t.step("a path that does not exist", async () => {
      await expectUsage(
        ["--repo", `${fixture.dir.path}/nowhere`],
        /^sandbox: error: Not a git repository: /m,
      );
    });

    await t.step("a repository without any commit", async () => {
      const empty = `${fixture.dir.path}/empty`;
      await Deno.mkdir(empty);
      await git(empty, "init", "-q");
      await expectUsage(["--repo", empty], /^sandbox: error: Base "HEAD" not found in /m);
    });

    await t.step("--base naming nothing", async () => {
      await expectUsage(
        ["--repo", repo, "--base", "nope"],
        new RegExp(`^sandbox: error: Base "nope" not found in "${repo}"$`, "m"),
      );
    });

    await t.step("--branch that already exists", async () => {
      await expectUsage(
        ["--repo", repo, "--branch", "taken"],
        new RegExp(`^sandbox: error: Branch "taken" already exists in "${repo}"$`, "m"),
      );
    });

    await t.step("--branch that git rejects", async () => {
      await expectUsage(
        ["--repo", repo, "--branch", "bad..name"],
        /^sandbox: error: Invalid branch name "bad\.\.name"$/m,
      );
    });

    await t.step("--base without --repo", async () => {
      await expectUsage(["--base", "main"], /^sandbox: error: --base, --branch, .* need --repo$/m);
    });

    await t.step("--push with a local repository", async () => {
      await expectUsage(
        ["--repo", repo, "--push"],
        /^sandbox: error: --push is for remote repositories/m,
      );
    });

    await t.step("no docker command ran, and the repository is unchanged", async () => {
      const calls = await bin.calls();
      assert.ok(
        calls.some((c) => c.startsWith("git ")),
        "the recording git never ran: the check would prove nothing",
      );
      assert.deepEqual(calls.filter((c) => !c.startsWith("git ")), []);
      assert.deepEqual(await repoState(repo, ["README.md"]), before);
      assert.equal(llm.requests.length, 0);
    });
  },
});

Deno.test({
  name:
    "run --repo: a run branch whose path collides with an existing branch is refused before the run (exit 2)",
  async fn(t) {
    // Regression test for a fixed bug (lib/repo.ts checkRunBranch), which was: only `refs/heads/<branch>` itself is looked up, so with a
    // branch "sandbox" every default branch sandbox/<run-id> passes the check, the agent runs,
    // and the import fails at the very end (exit 125, "git -c failed ... cannot lock ref"), after
    // which the worktree and its branch are removed from the sandbox: the agent's work is lost.
    await using llm = new FakeLlm([]);
    await using fixture = await RepoFixture.create("e2e-dfconf", llm.baseUrl);
    await using bin = await RecordingBin.create();
    const repo = await createRepo(`${fixture.dir.path}/user-repo`, { "README.md": "hello\n" });
    await git(repo, "branch", "sandbox");
    await git(repo, "branch", "feature");
    await git(repo, "branch", "topic/one");
    const env = { PATH: bin.path };

    const cases: [string, string[], string][] = [
      ['the default sandbox/<run-id> under an existing branch "sandbox"', [], "sandbox"],
      [
        '--branch feature/x under an existing branch "feature"',
        ["--branch", "feature/x"],
        "feature",
      ],
      ['--branch topic over an existing branch "topic/one"', ["--branch", "topic"], "topic"],
    ];
    for (const [what, args, name] of cases) {
      await t.step(what, async () => {
        const result = await fixture.run(["--repo", repo, ...args], { env });
        const context = explain(result);
        assert.equal(result.exitCode, 2, context);
        assert.match(result.stderr, new RegExp(`^sandbox: error: .*"${name}`, "m"), context);
      });
    }

    await t.step("no sandbox was started and the LLM was never asked", async () => {
      assert.deepEqual((await bin.calls()).filter((c) => !c.startsWith("git ")), []);
      assert.equal(llm.requests.length, 0);
    });
  },
});

Deno.test({
  name:
    "run --repo with a URL the git proxy cannot serve fails with exit 2 before any network access",
  async fn(t) {
    await using llm = new FakeLlm([]);
    await using fixture = await RepoFixture.create("e2e-remote", llm.baseUrl);
    await using bin = await RecordingBin.create();
    // A git host on loopback, and a proxy every HTTP client is told to use: both must stay silent.
    await using gitHost = recordingServer();
    await using proxy = recordingServer();
    const env = {
      PATH: bin.path,
      HTTP_PROXY: proxy.url,
      HTTPS_PROXY: proxy.url,
      ALL_PROXY: proxy.url,
      http_proxy: proxy.url,
      https_proxy: proxy.url,
      all_proxy: proxy.url,
      NO_PROXY: "",
      no_proxy: "",
      // Deno's own once-a-day update check is not the CLI's: it would go through that proxy.
      DENO_NO_UPDATE_CHECK: "1",
    };
    const host = gitHost.url.replace("http://", "");
    const cases: [string, RegExp][] = [
      [
        `git@${host.split(":")[0]}:x.git`,
        /^sandbox: error: Unsupported repository URL "git@.*": use an https:\/\/ \(or http:\/\/\) URL$/m,
      ],
      [
        `ssh://${host}/x.git`,
        /^sandbox: error: Unsupported repository URL "ssh:\/\/.*": use an https:\/\/ \(or http:\/\/\) URL$/m,
      ],
      [
        `file://${fixture.dir.path}/x.git`,
        /^sandbox: error: Unsupported repository URL "file:\/\/.*"/m,
      ],
      [
        `http://user:secret@${host}/x.git`,
        /^sandbox: error: Put credentials in git's credential store or the profile's git\.token, not in the URL$/m,
      ],
    ];
    for (const [url, message] of cases) {
      await t.step(`--repo ${url}`, async () => {
        const result = await fixture.run(["--repo", url], { env });
        const context = explain(result);
        assert.equal(result.exitCode, 2, context);
        assert.match(result.stderr, message, context);
        assert.equal(result.stdout, "", context);
      });
    }

    await t.step("no git host, proxy, docker or network program was contacted", async () => {
      const calls = await bin.calls();
      // Only local git plumbing (the branch name check) may run.
      assert.deepEqual(
        calls.filter((c) => !c.startsWith("git check-ref-format ")),
        [],
        calls.join("\n"),
      );
      assert.deepEqual(gitHost.requests, []);
      assert.deepEqual(proxy.requests, []);
      assert.equal(llm.requests.length, 0);
    });
  },
});

Deno.test({
  name:
    "run --repo --lifecycle-events: a sandbox.branch event precedes the usage line, and meta.json records the branch",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([
      toolCall("execute", { command: "cat README.md; git log --format=%s" }),
      toolCall("write_file", { file_path: "agent.txt", content: "from the agent\n" }),
      text("Done"),
    ]);
    await using fixture = await RepoFixture.create("e2e-life", llm.baseUrl);
    const repo = await createRepo(`${fixture.dir.path}/user-repo`, {
      "README.md": "version one\n",
    });
    const v1 = await git(repo, "rev-parse", "HEAD");
    await git(repo, "tag", "v1");
    await commitFiles(repo, { "README.md": "version two\n" }, "second commit");

    const result = await fixture.run([
      "--repo",
      repo,
      "--base",
      "v1",
      "--branch",
      "agent/work",
      "--lifecycle-events",
    ]);
    const context = explain(result);
    assert.equal(result.exitCode, 0, context);
    const id = runIdFrom(result.stderr);
    const lines = parseLines(result.stdout, context);
    const commit = await git(repo, "rev-parse", "refs/heads/agent/work");
    const diffstat = (await run(["git", "-C", repo, "diff", "--stat", v1, commit])).stdout
      .trimEnd();

    await t.step("the agent started from --base, not from HEAD", () => {
      assert.match(executeOutputs(lines)[0] ?? "", /^version one\ninitial commit\n/, context);
      assert.match(
        result.stderr,
        new RegExp(
          `^sandbox: checked out v1 \\(${
            v1.slice(0, 12)
          }\\); \\d+ bytes of objects added to its cache$`,
          "m",
        ),
        context,
      );
    });

    await t.step("stdout ends with result, sandbox.branch, usage", () => {
      const types = lines.map((l) => l.type);
      assert.equal(types.at(-1), "usage", context);
      assert.equal(types.at(-2), "sandbox.branch", context);
      assert.equal(types.filter((x) => x === "sandbox.branch").length, 1, context);
      assert.ok(types.indexOf("result") < types.indexOf("sandbox.branch"), context);
    });

    await t.step("the event names the branch, base, commit, commits and diffstat", async () => {
      const event = lines.at(-2)!;
      assert.equal(event.run_id, id);
      assert.equal(event.repository, repo);
      assert.equal(event.branch, "agent/work");
      assert.equal(event.base, v1);
      assert.equal(event.commit, commit);
      assert.deepEqual(event.commits, [await git(repo, "log", "-1", "--format=%h %s", commit)]);
      assert.equal(event.diffstat, diffstat);
      assert.match(event.diffstat, /agent\.txt \| 1 \+/);
      assert.equal(event.committed_leftovers, true);
      assert.deepEqual(event.ignored_refs, []);
      assert.equal(await git(repo, "rev-parse", `${commit}^`), v1);
    });

    await t.step(
      "meta.json extra records repo, branch, base, commit, diffstat and commits",
      async () => {
        const meta = await fixture.meta(id);
        assert.equal(meta.status, "succeeded");
        assert.match(
          String(meta.extra?.container),
          new RegExp(`^sandbox-${fixture.profile}-repo-`),
        );
        assert.deepEqual(meta.extra, {
          // Where the agent worked: its own container, removed at the end with the checkout.
          container: meta.extra?.container,
          workdir: `/workspace/worktrees/${id}`,
          kept: false,
          repo,
          branch: "agent/work",
          base: v1,
          commit,
          diffstat,
          commits: lines.at(-2)!.commits,
          // What the run spent, against no limit (lib/proxy/budget.ts).
          budget: meta.extra?.budget,
        });
        assert.deepEqual((meta.extra?.budget as { limits: unknown }).limits, {});
        assert.equal((meta.extra?.budget as { exceeded: unknown }).exceeded, null);
      },
    );

    await t.step("without --lifecycle-events, stdout has no sandbox.branch line", async () => {
      llm.script.push(
        toolCall("write_file", { file_path: "more.txt", content: "more\n" }),
        text("Done again"),
      );
      const plain = await fixture.run(["--repo", repo]);
      assert.equal(plain.exitCode, 0, explain(plain));
      assert.ok(!plain.stdout.includes("sandbox.branch"), explain(plain));
      assert.equal(parseLines(plain.stdout, explain(plain)).at(-1)!.type, "usage");
    });
  },
});
