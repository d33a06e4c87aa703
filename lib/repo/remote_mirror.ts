/**
 * The host's mirror of a remote repository: a bare repository under the state directory that git
 * on the host fetches into, with the user's credentials, before a run on the remote. From there a
 * run's base reaches the repository's object cache exactly as a local repository's commits do
 * (lib/repo/cache.ts): only what the cache lacks, so a second run on the same remote copies
 * nothing into its sandbox, and no sandbox fetches the repository itself.
 *
 * The credential goes to git in its environment (`GIT_CONFIG_*`), never on its command line, which
 * other users of the host can read. Pushes still leave from the sandbox, through the git proxy and
 * its grant (lib/repo/remote.ts).
 */
import { SandboxError } from "../errors.ts";
import { withHostLock } from "../lock.ts";
import { joinPath, userStateDir } from "../paths.ts";
import { run } from "../process.ts";
import type { LocalRepo } from "./local.ts";
import type { RemoteRepo } from "./remote.ts";

/** Where the mirror of `repo` lives on the host. */
export function mirrorPath(repo: RemoteRepo): string {
  return joinPath(userStateDir(), "remotes", `${repo.key}.git`);
}

/**
 * Fetch `repo` into its mirror (one fetch at a time per remote on this host) and resolve the base:
 * the mirror, shaped as the local repository the cache and the checkout take.
 */
export async function fetchRemote(
  repo: RemoteRepo,
  options: { authorization: () => Promise<string | undefined>; signal?: AbortSignal },
): Promise<LocalRepo> {
  const path = mirrorPath(repo);
  const env = gitEnv(await options.authorization());
  const base = await withHostLock(`remote-${repo.key}`, async () => {
    await Deno.mkdir(path, { recursive: true, mode: 0o700 });
    await git(["init", "-q", "--bare", path], env, `Cannot make the mirror of ${repo.url}`);
    const fetched = await run([
      "git",
      "-C",
      path,
      "fetch",
      "-q",
      "--prune",
      "--no-tags",
      repo.url,
      "+refs/heads/*:refs/remotes/origin/*",
      "+HEAD:refs/remotes/origin/HEAD",
    ], { env, signal: options.signal, timeoutMs: 600_000 });
    if (fetched.exitCode !== 0) throw fetchError(repo, fetched.stderr);
    const ref = repo.baseName === "HEAD"
      ? "refs/remotes/origin/HEAD"
      : `refs/remotes/origin/${repo.baseName}`;
    const resolved = await run(
      ["git", "-C", path, "rev-parse", "--verify", "-q", `${ref}^{commit}`],
      { env },
    );
    if (resolved.exitCode !== 0) {
      throw new SandboxError("usage", `Base "${repo.baseName}" not found in ${repo.url}`, {
        detail: "Name a branch of the remote (default: its default branch)",
      });
    }
    return resolved.stdout.trim();
  });
  return {
    path,
    commonDir: path,
    base,
    baseName: repo.baseName,
    key: repo.key,
    uncommitted: 0,
  };
}

/**
 * git's environment on the host: never prompting, the credential (when there is one) as an extra
 * header given through the environment, and no configuration of the user's that runs programs on
 * a fetch (the mirror is ours; its hooks directory is empty).
 */
function gitEnv(authorization: string | undefined): Record<string, string> {
  const config = [
    ["core.hooksPath", "/dev/null"],
    // The extra header goes with every request git makes: a redirect would carry the credential
    // to another host, so none is followed.
    ["http.followRedirects", "false"],
    ...(authorization ? [["http.extraHeader", `Authorization: ${authorization}`]] : []),
  ];
  const env: Record<string, string> = {
    GIT_TERMINAL_PROMPT: "0",
    GIT_ASKPASS: "",
    SSH_ASKPASS: "",
    GIT_CONFIG_COUNT: String(config.length),
  };
  config.forEach(([key, value], i) => {
    env[`GIT_CONFIG_KEY_${i}`] = key;
    env[`GIT_CONFIG_VALUE_${i}`] = value;
  });
  return env;
}

async function git(args: string[], env: Record<string, string>, message: string): Promise<void> {
  const result = await run(["git", ...args], { env });
  if (result.exitCode !== 0) {
    throw new SandboxError("exec_failed", message, { detail: result.stderr.trim() });
  }
}

function fetchError(repo: RemoteRepo, stderr: string): SandboxError {
  const auth = /401|403|Authentication|could not read Username/i.test(stderr);
  return new SandboxError(
    "exec_failed",
    auth ? `The remote refused access: ${repo.url}` : `Cannot fetch ${repo.url}`,
    {
      detail: auth
        ? "Give the host credentials: git credential store, `gh auth login`, or the profile's git.token"
        : stderr.trim().split("\n").slice(-5).join("\n"),
    },
  );
}
