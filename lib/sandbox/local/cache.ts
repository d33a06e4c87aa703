/**
 * A repository's object cache for mode local: a bare repository per repository under the host's
 * cache directory, written only by the host (what it adds is a pack of the user's own commits),
 * bound read-only at /cache into every local sandbox of a run on that repository. A run's
 * checkout borrows its objects (git alternates, lib/repo/local.ts) as in a container.
 */
import { userCacheDir } from "../../paths.ts";
import { CommandExitError } from "../../errors.ts";
import { readLines } from "../../lines.ts";
import { spawn } from "../../process.ts";
import { type LocalRepo, sendBase } from "../../repo/local.ts";

const REFS_END = "sandbox: refs listed";
const HAS_BASE = "sandbox: base present";
/** On the host: the cache repository made if missing, its refs listed, the pack indexed (cache.ts's steps). */
const UPDATE = '[ -d "$4" ] || git init -q --bare "$4"; ' +
  'git -C "$4" for-each-ref --format="%(objectname) %(refname)" || exit 1; ' +
  'if git -C "$4" cat-file -e "$1^{commit}" 2>/dev/null; then echo "$3"; ' +
  'else echo "$2" && git -C "$4" index-pack --stdin --fix-thin >/dev/null || exit 1; fi; ' +
  'git -C "$4" update-ref "refs/cache/$1" "$1"';

function cacheRoot(): string {
  return `${userCacheDir()}/local-cache`;
}

/** The directory bound at /cache for repository `key` (made, empty, when missing). */
export async function localCacheDir(key: string): Promise<string> {
  if (!/^[A-Za-z0-9._-]+$/.test(key)) throw new TypeError(`Invalid repository key "${key}"`);
  const dir = `${cacheRoot()}/${key}`;
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  return dir;
}

/** Add `repo`'s base commit to the cache of `key`; the bytes of the pack sent. */
export async function updateLocalCache(
  key: string,
  repo: LocalRepo,
  signal?: AbortSignal,
): Promise<number> {
  const dir = await localCacheDir(key);
  const input = new TransformStream<Uint8Array, Uint8Array>();
  const child = spawn(
    ["sh", "-c", UPDATE, "sh", repo.base, REFS_END, HAS_BASE, `${dir}/repo.git`],
    { stdin: input.readable, signal, env: { GIT_TERMINAL_PROMPT: "0" } },
  );
  const sent = await sendBase(readLines(child.stdout, 4096), input.writable, repo, {
    refsEnd: REFS_END,
    hasBase: HAS_BASE,
    signal,
  });
  const outcome = await child.finished;
  if (outcome.exitCode !== 0) {
    throw new CommandExitError(
      "exec_failed",
      `Cannot update the repository cache "${dir}"`,
      outcome,
    );
  }
  return sent;
}
