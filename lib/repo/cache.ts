/**
 * A repository's object cache: a volume per repository that only the host writes, mounted
 * read-only into every run's container on that repository. A run's checkout borrows its objects
 * (git alternates, lib/repo/local.ts) and keeps its own objects and refs in its own workspace, so
 * a run can neither change the cache nor meet another run's refs or config there.
 *
 * The host adds a base commit's objects (only what the cache lacks) through a short-lived
 * container that mounts the cache writable and runs nothing but git on what the host sends: a
 * pack of the user's own commits. Nothing that comes out of a sandbox ever goes into a cache.
 */
import type { DockerSandboxProvider, SandboxRepo } from "../sandbox/docker_provider.ts";
import { LABEL, labelArgs, OWNER } from "../sandbox/docker.ts";
import { CommandExitError } from "../errors.ts";
import { readLines } from "../lines.ts";
import { withHostLock } from "../lock.ts";
import { type LocalRepo, sendBase } from "./local.ts";
import { CACHE_DIR, CACHE_REPO } from "./cache_layout.ts";

/** The cache volume of a repository. */
export function cacheVolumeName(repo: SandboxRepo): string {
  return `sandbox-cache-${repo.id}`;
}

export const REFS_END = "sandbox: refs listed";
export const HAS_BASE = "sandbox: base present";
/**
 * In the updating container (as root, no capabilities): make the bare repository if missing,
 * list its refs, then index the pack the host sends (unless it has the base already), and keep
 * the base reachable with a ref of its own.
 */
export const UPDATE = '[ -d "$4" ] || git init -q --bare "$4"; ' +
  'git -C "$4" for-each-ref --format="%(objectname) %(refname)" || exit 1; ' +
  'if git -C "$4" cat-file -e "$1^{commit}" 2>/dev/null; then echo "$3"; ' +
  'else echo "$2" && git -C "$4" index-pack --stdin --fix-thin >/dev/null || exit 1; fi; ' +
  'git -C "$4" update-ref "refs/cache/$1" "$1"';

/**
 * Add `repo`'s base commit to the cache that `provider`'s container mounts (`provider` names the
 * volume and the image, which has git). Returns the bytes of the pack sent. One update of a cache
 * at a time on this host: two at once on a new volume would both make its repository.
 */
export async function updateCache(
  provider: DockerSandboxProvider,
  volume: string,
  repo: LocalRepo,
  signal?: AbortSignal,
): Promise<number> {
  return await withHostLock(
    `cache-${volume}`,
    () => updateUnlocked(provider, volume, repo, signal),
  );
}

async function updateUnlocked(
  provider: DockerSandboxProvider,
  volume: string,
  repo: LocalRepo,
  signal?: AbortSignal,
): Promise<number> {
  const labels = {
    [LABEL.owner]: OWNER,
    [LABEL.profile]: provider.profile.name,
    [LABEL.kind]: "cache-update",
  };
  const input = new TransformStream<Uint8Array, Uint8Array>();
  const child = provider.docker.spawn([
    "run",
    "--rm",
    "--interactive",
    ...labelArgs(labels),
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--read-only",
    "--user",
    "0:0",
    "--mount",
    `type=volume,src=${volume},dst=${CACHE_DIR}`,
    await provider.imageTag(),
    "sh",
    "-c",
    UPDATE,
    "sh",
    repo.base,
    REFS_END,
    HAS_BASE,
    CACHE_REPO,
  ], { stdin: input.readable, signal });
  const sent = await sendBase(readLines(child.stdout, 4096), input.writable, repo, {
    refsEnd: REFS_END,
    hasBase: HAS_BASE,
    signal,
  });
  const outcome = await child.finished;
  if (outcome.exitCode !== 0) {
    throw new CommandExitError(
      "exec_failed",
      `Cannot update the repository cache "${volume}"`,
      outcome,
    );
  }
  return sent;
}
