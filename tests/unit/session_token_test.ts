/**
 * A session's token dies with the session. While the proxies of one session (`startHostProxies`)
 * are open, its token reaches the LLM upstream and the git remote; once the session is closed the
 * same token is served nowhere: its own proxies no longer answer, and a later session's proxies
 * (the ones a sandbox reaches next) refuse it with 401 while accepting their own token on the same
 * path. Fake upstreams on 127.0.0.1 count what reached them, so "refused" means "never forwarded".
 */
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { KeyStore } from "../../lib/keys.ts";
import type { GitRemote } from "../../lib/proxy/git_proxy.ts";
import { type HostProxies, startHostProxies } from "../../lib/proxy/session.ts";
import { tempDir } from "../_helpers.ts";
import { FakeUpstream } from "./_fake_upstream.ts";

const KEY_ENV = "SANDBOX_UNIT_TOKEN_KEY";
const DEADLINE_MS = 10_000;

/** A git remote that answers every request with an empty advertisement and counts them. */
class FakeGitRemote implements AsyncDisposable {
  readonly paths: string[] = [];
  readonly #server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (req) => {
      await req.body?.cancel();
      const url = new URL(req.url);
      this.paths.push(url.pathname + url.search);
      return new Response("001e# service=git-upload-pack\n0000", {
        headers: { "content-type": "application/x-git-upload-pack-advertisement" },
      });
    },
  );

  get url(): string {
    return `http://127.0.0.1:${this.#server.addr.port}/org/repo.git`;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }
}

async function openProxies(
  upstream: FakeUpstream,
  remote: FakeGitRemote,
  dir: string,
): Promise<HostProxies> {
  const result = parseConfig(
    `profiles:\n  work:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
    "test.yaml",
    () => undefined,
  );
  assert.equal(result.kind, "ok", JSON.stringify(result));
  if (result.kind !== "ok") throw new Error("unreachable");
  const gitRemote: GitRemote = {
    url: remote.url,
    authorization: () => Promise.resolve(undefined),
    push: false,
  };
  return await startHostProxies(resolveProfile(result.config, "work"), ["127.0.0.1"], {
    keys: new KeyStore({ env: (name) => (name === KEY_ENV ? upstream.key : undefined) }),
    accessLogPath: `${dir}/access.ndjson`,
    gitRemote,
  });
}

/** An LLM call to `baseUrl` with `token`: the status, or "no answer" when nothing listens there. */
async function llmCall(baseUrl: string, token: string): Promise<number | "no answer"> {
  try {
    const response = await fetch(`${baseUrl}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
      signal: AbortSignal.timeout(DEADLINE_MS),
    });
    await response.body?.cancel();
    return response.status;
  } catch (error) {
    if (error instanceof DOMException && error.name === "TimeoutError") throw error;
    return "no answer";
  }
}

/** A fetch's first request through the git proxy at `gitUrl` with `token` (as git sends it: Basic). */
async function gitCall(gitUrl: string, token: string): Promise<number | "no answer"> {
  try {
    const response = await fetch(`${gitUrl}/info/refs?service=git-upload-pack`, {
      headers: { authorization: `Basic ${btoa(`x-access-token:${token}`)}` },
      signal: AbortSignal.timeout(DEADLINE_MS),
    });
    await response.body?.cancel();
    return response.status;
  } catch (error) {
    if (error instanceof DOMException && error.name === "TimeoutError") throw error;
    return "no answer";
  }
}

Deno.test("a session's token works while the session is open and nowhere once it is closed", async (t) => {
  await using dir = await tempDir();
  await using upstream = new FakeUpstream();
  await using remote = new FakeGitRemote();

  const first = await openProxies(upstream, remote, dir.path);
  const token = first.token;
  const llmUrl = first.llmUrl("127.0.0.1");
  const gitUrl = first.gitUrl("127.0.0.1")!;

  await t.step("while open: the token reaches the LLM upstream and the git remote", async () => {
    assert.equal(await llmCall(llmUrl, token), 200);
    assert.equal(await gitCall(gitUrl, token), 200);
    assert.equal(upstream.requests.length, 1);
    assert.equal(remote.paths.length, 1);
  });

  await first.close();

  await t.step(
    "once closed: the same requests to the same proxies are served no more",
    async () => {
      const llm = await llmCall(llmUrl, token);
      const git = await gitCall(gitUrl, token);
      // Either the proxy is gone or it refuses the token; it never forwards it.
      assert.ok(
        llm === "no answer" || llm === 401,
        `the closed session's credential proxy answered ${llm}`,
      );
      assert.ok(
        git === "no answer" || git === 401,
        `the closed session's git proxy answered ${git}`,
      );
      assert.equal(upstream.requests.length, 1, "the LLM upstream got a request with a dead token");
      assert.equal(remote.paths.length, 1, "the git remote got a request with a dead token");
    },
  );

  await using second = await openProxies(upstream, remote, dir.path);
  assert.notEqual(second.token, token, "a later session was given the same token");

  await t.step(
    "a later session's proxies refuse the old token with 401 and forward nothing",
    async () => {
      assert.equal(await llmCall(second.llmUrl("127.0.0.1"), token), 401);
      assert.equal(await gitCall(second.gitUrl("127.0.0.1")!, token), 401);
      assert.equal(upstream.requests.length, 1, "the LLM upstream got the old token's request");
      assert.equal(remote.paths.length, 1, "the git remote got the old token's request");
    },
  );

  await t.step("the twin: the later session's own token passes on the same paths", async () => {
    assert.equal(await llmCall(second.llmUrl("127.0.0.1"), second.token), 200);
    assert.equal(await gitCall(second.gitUrl("127.0.0.1")!, second.token), 200);
    assert.equal(upstream.requests.length, 2);
    assert.equal(remote.paths.length, 2);
  });
});
