/**
 * `sandbox up`: the warm pool a run of the profile would claim from, filled now (and the
 * containers of runs whose process is gone removed first). A run on a local repository claims
 * from that repository's pool, whose containers mount its object cache.
 */
import type { Profile } from "../config.ts";
import type { AgentCliName } from "../agents/packages.ts";
import { sandboxLifecycle } from "../sandbox/providers.ts";

export interface PoolReport {
  /** Containers removed because the process that held them is gone. */
  reaped: string[];
  /** The pool's ready containers, after filling. */
  ready: string[];
}

export async function poolFor(
  profile: Profile,
  options: {
    repo?: string;
    agent?: AgentCliName;
    onProgress?: (line: string) => void;
    signal?: AbortSignal;
  },
): Promise<PoolReport> {
  let runProfile = profile;
  let repoKey: string | undefined;
  let local = false;
  // Mode devcontainer runs on a repository always: the current directory's by default.
  const repo = options.repo ?? (profile.sandbox.mode === "devcontainer" ? Deno.cwd() : undefined);
  if (repo !== undefined) {
    const [{ resolveLocalRepo }, { isRemoteUrl, resolveRemoteRepo }] = await Promise.all([
      import("../repo/local.ts"),
      import("../repo/remote.ts"),
    ]);
    local = !isRemoteUrl(repo);
    repoKey = local ? (await resolveLocalRepo(repo)).key : (await resolveRemoteRepo(repo)).key;
  }
  if (profile.sandbox.mode === "devcontainer") {
    const { openDevcontainer } = await import("../sandbox/devcontainer/provider.ts");
    runProfile = (await openDevcontainer(profile, {
      repo: repo!,
      onProgress: options.onProgress,
      signal: options.signal,
    })).profile;
  }
  const sandboxes = await sandboxLifecycle(runProfile);
  const kind = {
    agent: options.agent,
    repo: repoKey === undefined ? undefined : { key: repoKey, local },
    onProgress: options.onProgress,
  };
  const reaped = await sandboxes.reapOrphans();
  await sandboxes.fill({ ...kind, signal: options.signal, wait: true });
  return { reaped, ready: await sandboxes.ready(kind) };
}
