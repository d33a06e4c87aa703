/**
 * `sandbox up`: the warm pool a run of the profile would claim from, filled now (and the
 * containers of runs whose process is gone removed first). A run on a local repository claims
 * from that repository's pool, whose containers mount its object cache.
 */
import type { Profile } from "../config.ts";
import type { AgentCliName } from "../agents/packages.ts";
import { fillPool, reapOrphans } from "../sandbox/pool.ts";
import { listReady, poolKey } from "../sandbox/pool_records.ts";
import { sandboxRepo } from "../sandbox/docker_provider.ts";
import { cacheVolumeName } from "../repo/cache.ts";

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
  const repository = repoKey ? await sandboxRepo(repoKey) : undefined;
  const reaped = await reapOrphans(runProfile);
  await fillPool(runProfile, {
    agent: options.agent,
    repository,
    cacheVolume: local && repository ? cacheVolumeName(repository) : undefined,
    onProgress: options.onProgress,
    signal: options.signal,
    wait: true,
  });
  const key = poolKey(runProfile.name, options.agent, repository?.key);
  return {
    reaped,
    ready: (await listReady()).filter((record) => record.key === key).map((record) => record.name),
  };
}
