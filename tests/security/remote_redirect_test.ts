/**
 * The host's fetch of a remote (lib/repo/remote_mirror.ts) follows no redirect: the credential
 * goes as an extra header on every request git makes, so a remote (or whoever answers for it)
 * that redirects could send it anywhere. The attack: the remote's URL answers every request with
 * a redirect to another server, which records what reaches it. The twin: the same fetch straight
 * from that server succeeds, with the credential. No Docker.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { SandboxError } from "../../lib/errors.ts";
import { fetchRemote } from "../../lib/repo/remote_mirror.ts";
import { resolveRemoteRepo } from "../../lib/repo/remote.ts";
import { GitHttpServer } from "../_git_server.ts";
import { tempDir } from "../_helpers.ts";

async function git(...args: string[]): Promise<void> {
  const result = await run(["git", ...args]);
  if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr}`);
}

/** A bare repository `proj.git` under `root` with one commit on main. */
async function seedRemote(root: string, scratch: string): Promise<void> {
  await git("init", "-q", "--bare", `${root}/proj.git`);
  await git("init", "-q", "-b", "main", scratch);
  await Deno.writeTextFile(`${scratch}/README.md`, "remote readme\n");
  await git("-C", scratch, "add", ".");
  await git("-C", scratch, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "i");
  await git("-C", scratch, "push", "-q", `${root}/proj.git`, "main");
  await git("-C", `${root}/proj.git`, "symbolic-ref", "HEAD", "refs/heads/main");
}

/** A server on loopback answering every request with a redirect to the same path on `target`. */
function redirector(target: string): Deno.HttpServer<Deno.NetAddr> {
  return Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    const url = new URL(req.url);
    const location = `${target}${url.pathname.replace(/^\/[^/]+/, "")}${url.search}`;
    return new Response(null, { status: 302, headers: { location } });
  });
}

Deno.test("a remote that redirects does not get the host's fetch to carry the credential elsewhere", async (t) => {
  await using dir = await tempDir();
  await seedRemote(`${dir.path}/remotes`, `${dir.path}/seed`);
  const token = `ghp_${crypto.randomUUID().replaceAll("-", "")}`;
  const authorization = `Basic ${btoa(`x-access-token:${token}`)}`;
  // Where the redirect points: a real git server that records every Authorization it receives.
  await using elsewhere = new GitHttpServer(`${dir.path}/remotes`, token);
  const redirecting = redirector(elsewhere.url("proj.git"));
  const state = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", `${dir.path}/state`);
  try {
    const credential = { authorization: () => Promise.resolve(authorization) };

    await t.step(
      "the redirect is refused with a clear error; nothing reaches its target",
      async () => {
        const repo = await resolveRemoteRepo(
          `http://127.0.0.1:${redirecting.addr.port}/r/proj.git`,
        );
        await assert.rejects(fetchRemote(repo, credential), (error: unknown) => {
          assert.ok(error instanceof SandboxError, String(error));
          assert.match(
            error.message,
            /^The remote answered with a redirect: http:\/\/127\.0\.0\.1:/,
          );
          assert.match(error.detail ?? "", /give the URL it redirects to/);
          return true;
        });
        assert.deepEqual(elsewhere.authorizations, []);
      },
    );

    await t.step(
      "the twin: fetched from the server itself, the credential reaches it",
      async () => {
        const repo = await resolveRemoteRepo(elsewhere.url("proj.git"));
        const mirror = await fetchRemote(repo, credential);
        assert.match(mirror.base, /^[0-9a-f]{40}$/);
        assert.ok(elsewhere.authorizations.includes(authorization));
      },
    );
  } finally {
    if (state === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", state);
    await redirecting.shutdown();
  }
});
