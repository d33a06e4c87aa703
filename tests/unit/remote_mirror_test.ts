/**
 * The host's mirror of a remote (lib/repo/remote_mirror.ts), against a real smart-HTTP server on
 * loopback: the base is fetched with the user's credential, which reaches the server but never
 * any git command line on the host; a refused credential and a missing base are clear errors.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { SandboxError } from "../../lib/errors.ts";
import { fetchRemote, mirrorPath } from "../../lib/repo/remote_mirror.ts";
import { resolveRemoteRepo } from "../../lib/repo/remote.ts";
import { GitHttpServer } from "../_git_server.ts";
import { tempDir } from "../_helpers.ts";

async function git(...args: string[]): Promise<string> {
  const result = await run(["git", ...args]);
  if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr}`);
  return result.stdout.trim();
}

/** A remote with one commit on main, served with `token`; and a `git` first on PATH that logs argv. */
async function setUp(dir: string) {
  await git("init", "-q", "--bare", `${dir}/remotes/proj.git`);
  await git("init", "-q", "-b", "main", `${dir}/seed`);
  await Deno.writeTextFile(`${dir}/seed/README.md`, "remote readme\n");
  await git("-C", `${dir}/seed`, "add", ".");
  await git("-C", `${dir}/seed`, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "i");
  await git("-C", `${dir}/seed`, "push", "-q", `${dir}/remotes/proj.git`, "main");
  await git("-C", `${dir}/remotes/proj.git`, "symbolic-ref", "HEAD", "refs/heads/main");
  const realGit = (await run(["sh", "-c", "command -v git"])).stdout.trim();
  await Deno.mkdir(`${dir}/bin`);
  await Deno.writeTextFile(
    `${dir}/bin/git`,
    `#!/bin/sh\nprintf '%s\\n' "$*" >>"${dir}/git-argv.log"\nexec ${realGit} "$@"\n`,
    { mode: 0o755 },
  );
  return { base: await git("-C", `${dir}/seed`, "rev-parse", "HEAD") };
}

async function withHostEnv<T>(dir: string, fn: () => Promise<T>): Promise<T> {
  const saved = { PATH: Deno.env.get("PATH")!, XDG_STATE_HOME: Deno.env.get("XDG_STATE_HOME") };
  Deno.env.set("PATH", `${dir}/bin:${saved.PATH}`);
  Deno.env.set("XDG_STATE_HOME", `${dir}/state`);
  try {
    return await fn();
  } finally {
    Deno.env.set("PATH", saved.PATH);
    if (saved.XDG_STATE_HOME === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", saved.XDG_STATE_HOME);
  }
}

Deno.test("a remote is fetched into the host's mirror with the credential in git's environment, never on a command line", async () => {
  await using dir = await tempDir();
  const { base } = await setUp(dir.path);
  const token = `ghp_${crypto.randomUUID().replaceAll("-", "")}`;
  await using server = new GitHttpServer(`${dir.path}/remotes`, token);
  const authorization = `Basic ${btoa(`x-access-token:${token}`)}`;
  const repo = await resolveRemoteRepo(server.url("proj.git"));
  const mirror = await withHostEnv(
    dir.path,
    () => fetchRemote(repo, { authorization: () => Promise.resolve(authorization) }),
  );

  assert.equal(mirror.base, base);
  assert.equal(mirror.path, `${dir.path}/state/sandbox/remotes/${repo.key}.git`);
  assert.equal(await withHostEnv(dir.path, () => Promise.resolve(mirrorPath(repo))), mirror.path);
  assert.equal(await git("-C", mirror.path, "cat-file", "-t", base), "commit");
  // The twin: the credential reached the remote...
  assert.ok(server.authorizations.includes(authorization));
  // ...and no git process on the host had it in its arguments (which other users can read).
  const argv = await Deno.readTextFile(`${dir.path}/git-argv.log`);
  assert.match(argv, /fetch/);
  assert.ok(!argv.includes(token) && !argv.includes(btoa(`x-access-token:${token}`)), argv);
});

Deno.test("a remote that refuses the credential, or lacks the base, is a clear error", async () => {
  await using dir = await tempDir();
  await setUp(dir.path);
  await using server = new GitHttpServer(`${dir.path}/remotes`, "the-right-token");
  const wrong = () => Promise.resolve(`Basic ${btoa("x-access-token:wrong")}`);
  const right = () => Promise.resolve(`Basic ${btoa("x-access-token:the-right-token")}`);
  await withHostEnv(dir.path, async () => {
    const repo = await resolveRemoteRepo(server.url("proj.git"));
    await assert.rejects(fetchRemote(repo, { authorization: wrong }), (e: unknown) => {
      assert.ok(e instanceof SandboxError);
      assert.match(e.message, /The remote refused access: http:\/\/127\.0\.0\.1:\d+\/proj\.git/);
      return true;
    });
    const missing = await resolveRemoteRepo(server.url("proj.git"), "no-such-branch");
    await assert.rejects(fetchRemote(missing, { authorization: right }), (e: unknown) => {
      assert.ok(e instanceof SandboxError && e.code === "usage");
      assert.match(e.message, /Base "no-such-branch" not found in http:/);
      return true;
    });
  });
});
