/**
 * A remote repository: fetched by the host into its mirror (lib/repo/remote_mirror.ts) and checked
 * out in the run's sandbox from the repository's cache, like a local one; pushed from inside the
 * sandbox through the host's git proxy.
 *
 * The sandbox's git talks only to `http://127.0.0.1:<port>/git` (the relay, see
 * lib/proxy/relay_host.ts) with its session token; the proxy attaches the user's credentials for
 * the real remote on the way out, and lets a push update only the run's branch, and only when the
 * run was started with `--push`.
 */
import { SandboxError } from "../errors.ts";
import type { GitRemote } from "../proxy/git_proxy.ts";
import { sha256Hex } from "../hash.ts";
import type { KeySource, KeyStore } from "../keys.ts";
import { run } from "../process.ts";
import type { SandboxProvider } from "../sandbox/provider.ts";
import type { Redactor } from "../redact.ts";
import { registerSecret } from "../secret_guard.ts";
import { commitLeftovers, inSandbox, refsAddedBy, type RunWorktree, SAFE_GIT } from "./local.ts";

export interface RemoteRepo {
  url: string;
  key: string;
  /** Branch to start from ("HEAD": the remote's default branch). */
  baseName: string;
}

export interface RemoteResult {
  branch: string;
  base: string;
  commit: string | null;
  commits: string[];
  diffstat: string;
  pushed: boolean;
  committedLeftovers: boolean;
  /** Refs the agent created in the sandbox's repository: never pushed, reported. */
  ignoredRefs: string[];
}

/** Is `text` a repository URL rather than a path? */
export function isRemoteUrl(text: string): boolean {
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(text) || /^[^/\s]+@[^/\s]+:/.test(text);
}

export async function resolveRemoteRepo(url: string, baseName = "HEAD"): Promise<RemoteRepo> {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new SandboxError(
      "usage",
      `Unsupported repository URL "${url}": use an https:// (or http://) URL`,
      {
        detail: "ssh remotes cannot go through the credential-attaching git proxy",
      },
    );
  }
  if (parsed.protocol !== "https:" && parsed.protocol !== "http:") {
    throw new SandboxError(
      "usage",
      `Unsupported repository URL "${url}": use an https:// (or http://) URL`,
    );
  }
  if (parsed.username || parsed.password) {
    throw new SandboxError(
      "usage",
      "Put credentials in git's credential store or the profile's git.token, not in the URL",
    );
  }
  const name = parsed.pathname.replace(/\/+$/, "").split("/").pop()!.replace(/\.git$/, "").replace(
    /[^A-Za-z0-9._-]/g,
    "_",
  ) ||
    "repo";
  return {
    url: parsed.href,
    key: `${name}-${(await sha256Hex(parsed.href)).slice(0, 12)}`,
    baseName,
  };
}

/**
 * The `Authorization` header for the remote: from the profile's `git.token` source, else from
 * `git credential fill` on the host (never prompting), else none (anonymous).
 */
export function remoteAuthorization(
  repo: RemoteRepo,
  options: { token?: KeySource; keys: KeyStore; redactor: Redactor },
): () => Promise<string | undefined> {
  let cached: Promise<string | undefined> | undefined;
  return () =>
    cached ??= (async () => {
      if (options.token) {
        const token = await options.keys.resolve(options.token);
        return basic("x-access-token", token, options.redactor);
      }
      const url = new URL(repo.url);
      const filled = await run(["git", "credential", "fill"], {
        stdin: `protocol=${url.protocol.replace(":", "")}\nhost=${url.host}\npath=${
          url.pathname.replace(/^\//, "")
        }\n\n`,
        env: { GIT_TERMINAL_PROMPT: "0", GIT_ASKPASS: "", SSH_ASKPASS: "" },
        timeoutMs: 30_000,
      });
      if (filled.exitCode !== 0) return undefined;
      const fields = Object.fromEntries(
        filled.stdout.split("\n").filter((l) => l.includes("=")).map((
          l,
        ) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]),
      );
      if (!fields.password) return undefined;
      return basic(fields.username ?? "x-access-token", fields.password, options.redactor);
    })();
}

function basic(user: string, secret: string, redactor: Redactor): string {
  redactor.add(secret);
  registerSecret(secret, "the git credential for the remote");
  const encoded = btoa(`${user}:${secret}`);
  redactor.add(encoded);
  return `Basic ${encoded}`;
}

export interface GitGrantOptions {
  /** The run's branch on the remote. */
  branch: string;
  /** Was the run started with `--push`? Without it the session may fetch and never push. */
  push: boolean;
  authorization: () => Promise<string | undefined>;
}

/**
 * The grant the git proxy holds for this run: fetch always; push only with `--push`, and then
 * only of the run's branch. (A push of the run branch alone can still start the remote's CI,
 * with its secrets, so a run without `--push` gets no receive-pack at all.)
 */
export function gitRemoteFor(repo: RemoteRepo, options: GitGrantOptions): GitRemote {
  return {
    url: repo.url,
    authorization: options.authorization,
    push: options.push ? `refs/heads/${options.branch}` : false,
  };
}

/** Commit leftovers, report, and with `push` push the run branch through the proxy. */
export async function finishRemoteRun(
  provider: SandboxProvider,
  worktree: RunWorktree,
  options: {
    runId: string;
    push: boolean;
    gitUrl: string;
    env: Record<string, string>;
    signal?: AbortSignal;
  },
): Promise<RemoteResult> {
  const { committed, head, refs } = await commitLeftovers(provider, worktree, options);
  const summary = await inSandbox(
    provider,
    "summarise the run's commits",
    `${SAFE_GIT} -C "$1" log --format="%h %s" "$2..HEAD"; echo "--"; ${SAFE_GIT} -C "$1" diff --stat "$2" HEAD`,
    [worktree.path, worktree.base],
    options.signal,
  );
  const [log, diffstat] = summary.split("--\n");
  const changed = head !== worktree.base;
  const result: RemoteResult = {
    branch: worktree.targetBranch,
    base: worktree.base,
    commit: changed ? head : null,
    commits: changed ? log.split("\n").filter(Boolean) : [],
    diffstat: (diffstat ?? "").trimEnd(),
    pushed: false,
    committedLeftovers: committed,
    ignoredRefs: refsAddedBy(worktree, refs),
  };
  if (!changed || !options.push) return result;
  const pushed = await provider.exec([
    "sh",
    "-c",
    `${SAFE_GIT} -C "$1" -c http.extraHeader="Authorization: Bearer $SANDBOX_LLM_TOKEN" push -q --no-verify "$2" "HEAD:refs/heads/$3"`,
    "sh",
    worktree.path,
    options.gitUrl,
    worktree.targetBranch,
  ], { env: options.env, signal: options.signal, timeoutMs: 600_000 });
  if (pushed.exitCode !== 0) {
    throw new SandboxError("exec_failed", `Push of ${worktree.targetBranch} was rejected`, {
      detail: pushed.stderr.trim().split("\n").slice(-5).join("\n"),
    });
  }
  return { ...result, pushed: true };
}
