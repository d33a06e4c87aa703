/**
 * `sandbox shell --repo`: a shell in a checkout of a local repository, in a sandbox of its own,
 * driven in a real terminal (tmux) against the real engine. What it commits (and what it leaves
 * uncommitted, committed by the tool) comes back as its branch when it ends; the user's working
 * tree and branch are untouched. Mistakes in --repo are refused before anything starts.
 */
import { git } from "../_git.ts";
import assert from "node:assert/strict";
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

const USER_GIT = ["-c", "user.name=Test User", "-c", "user.email=user@example.com"];

Deno.test({
  name:
    "sandbox shell --repo: the shell starts in a checkout; its commits and leftovers come back as its branch",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  assertDocker();
  await using dir = await tempDir();
  const profile = uniqueProfile("shellrepo");
  const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
  const env = { XDG_STATE_HOME: `${dir.path}/state` };
  const repo = `${dir.path}/repo`;
  await Deno.mkdir(repo);
  await git(repo, "init", "-q", "-b", "main");
  await Deno.writeTextFile(`${repo}/README`, "hello\n");
  await git(repo, "add", "-A");
  await git(repo, ...USER_GIT, "commit", "-q", "-m", "initial commit");
  await Deno.writeTextFile(`${repo}/README`, "edited, not committed\n");
  const head = await git(repo, "rev-parse", "HEAD");
  const cli = [Deno.execPath(), "run", "-A", "--quiet", CLI, "-c", config];
  await using tmux = new Tmux();
  try {
    await tmux.start([...cli, "shell", "-p", profile, "--repo", repo], env);
    await tmux.waitFor(/\/workspace\/worktrees\/\S+\$\s*$/m);
    await tmux.send("git log --format=LOG-%s | cat; echo README-$(cat README)", "Enter");
    await tmux.waitFor(/^README-hello$/m);
    await tmux.waitFor(/^LOG-initial commit$/m);
    await tmux.send("echo x > f && git add f && git commit -qm m && echo COMMITTED", "Enter");
    await tmux.waitFor(/^COMMITTED$/m);
    await tmux.send("echo y > left-over; exit", "Enter");
    const screen = await tmux.waitFor(/CLI-EXITED-0/);
    const said = screen.match(/branch (sandbox\/\S+) in \S+: 2 commit\(s\)/);
    assert.ok(said, screen);
    assert.match(screen, /uncommitted changes committed by sandbox/);
    const branch = said[1];
    assert.equal(
      await git(repo, "log", "--format=%s|%an", `main..${branch}`).then((log) =>
        log.split("\n").at(-1)
      ),
      "m|sandbox agent",
    );
    assert.equal(await git(repo, "show", `${branch}:f`), "x");
    assert.equal(await git(repo, "show", `${branch}:left-over`), "y");
    assert.equal(await git(repo, "show", `${branch}:README`), "hello");
    // The user's branch, commit and working tree are as they were.
    assert.equal(await git(repo, "symbolic-ref", "--short", "HEAD"), "main");
    assert.equal(await git(repo, "rev-parse", "HEAD"), head);
    assert.equal(await Deno.readTextFile(`${repo}/README`), "edited, not committed\n");
    assert.equal(await git(repo, "status", "--porcelain"), "M README");
    const runs = await runCli(["runs", "--json"], { env, config });
    const meta = JSON.parse(runs.stdout)[0];
    assert.equal(meta.mode, "shell", explain(runs));
    assert.equal(meta.extra.branch, branch, explain(runs));
  } finally {
    await removeProfile(profile);
  }
});

Deno.test("sandbox shell --repo refuses what is not a local repository, before anything starts", async () => {
  await using dir = await tempDir();
  const profile = uniqueProfile("shellrepo");
  const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
  const env = { XDG_STATE_HOME: `${dir.path}/state` };
  const shell = (...args: string[]) =>
    runCli(["shell", "--detach", "-p", profile, ...args], { env, config, stdin: "" });
  const notGit = await shell("--repo", dir.path);
  assert.equal(notGit.exitCode, 2, explain(notGit));
  assert.match(notGit.stderr, /^sandbox: error: Not a git repository: /m);
  const url = await shell("--repo", "https://example.com/some/repo.git");
  assert.equal(url.exitCode, 2, explain(url));
  assert.match(url.stderr, /--repo takes a local repository, not a URL/);
  const branchAlone = await shell("--branch", "mine");
  assert.equal(branchAlone.exitCode, 2, explain(branchAlone));
  assert.match(branchAlone.stderr, /--branch is for sandbox shell --repo/);
  assert.equal(notGit.stdout + url.stdout + branchAlone.stdout, "", "no session was started");
});
