/**
 * A local repository in and out of a sandbox, as git objects only.
 *
 * In: the committed state of the base commit is sent as a pack (`git pack-objects`, thin, against
 * what the repository's cache already has) into the cache (lib/repo/cache.ts), and the run gets a
 * checkout of its own that borrows the cache's objects. Nothing of the user's working tree, index,
 * hooks or config goes in, and no host path is mounted.
 *
 * Out: the sandbox's pack for `base..result` lands in a quarantine repository on the host (which
 * borrows the user's objects read-only as alternates), is checked object by object (`--strict`),
 * its `.gitmodules` files are refused if they hold control characters (lib/repo/gitmodules.ts),
 * and only then is the one run branch fetched from it into the user's repository — so only objects
 * reachable from that branch arrive, and no other ref, tag, hook or config can be written.
 */
import { CommandExitError, SandboxError } from "../errors.ts";
import { sha256Hex } from "../hash.ts";
import { formatBytes } from "../units.ts";
import { assertPlainGitmodules } from "./gitmodules.ts";
import { type ProcessOutcome, run, spawn } from "../process.ts";
import type { SandboxProvider } from "../sandbox/provider.ts";
import { CACHE_OBJECTS } from "./cache_layout.ts";

export const WORKTREES_DIR = "/workspace/worktrees";
/** A sandbox may send back at most this much (a hostile one could try to fill the host's disk). */
export const MAX_RESULT_PACK_BYTES = 2 * 1024 ** 3;
/**
 * Prefix for every git command the tool runs in the sandbox: the agent may have planted hooks, a
 * hooks path or an fsmonitor command in the shared repository, and none of them may run for us.
 */
export const SAFE_GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false";
/** Identity of the commit the tool makes of changes the agent left uncommitted. */
export const TOOL_IDENTITY = { name: "sandbox", email: "sandbox@localhost" } as const;
/** What work in a checkout commits as (a run's agent, a shell, an MCP environment's commands). */
export const AGENT_GIT_IDENTITY = {
  GIT_AUTHOR_NAME: "sandbox agent",
  GIT_AUTHOR_EMAIL: "agent@sandbox.localhost",
  GIT_COMMITTER_NAME: "sandbox agent",
  GIT_COMMITTER_EMAIL: "agent@sandbox.localhost",
} as const;

export interface LocalRepo {
  /** The repository's top-level directory on the host. */
  path: string;
  /** Its git directory (where objects live). */
  commonDir: string;
  /** The base commit, resolved. */
  base: string;
  /** The base as the user named it. */
  baseName: string;
  /** Name of the bare repository in the sandbox: stable per host repository. */
  key: string;
  /** `git status --porcelain` lines: changes that are not sent. */
  uncommitted: number;
}

export interface RunWorktree {
  bare: string;
  path: string;
  /** The branch inside the sandbox: always `sandbox/<run-id>`, so nothing left there collides. */
  branch: string;
  /** The branch the result becomes in the user's repository (or on the remote). */
  targetBranch: string;
  base: string;
  /** The sandbox repository's refs when the run began ("sha refname" lines), to tell what it added. */
  refsBefore: string[];
  /** Bytes of the pack sent into the sandbox (0 objects when it already had everything). */
  sentBytes: number;
}

export interface RepoResult {
  branch: string;
  base: string;
  /** The run branch's commit, or null when the agent changed nothing. */
  commit: string | null;
  /** `git log --oneline base..commit`, newest first. */
  commits: string[];
  diffstat: string;
  /** Bytes of the pack received from the sandbox. */
  receivedBytes: number;
  /** Refs the sandbox has besides its own branch and bases: never imported, reported. */
  ignoredRefs: string[];
  /** Whether the tool committed changes the agent had left uncommitted. */
  committedLeftovers: boolean;
}

async function git(
  args: string[],
  what: string,
  options: { stdin?: string } = {},
): Promise<string> {
  const result = await run(["git", ...args], { ...options, env: { GIT_TERMINAL_PROMPT: "0" } });
  if (result.exitCode !== 0) throw new CommandExitError("exec_failed", `Cannot ${what}`, result);
  return result.stdout;
}

/** Check and describe a local repository and its base; user mistakes are `usage` errors. */
export async function resolveLocalRepo(path: string, baseName = "HEAD"): Promise<LocalRepo> {
  const top = await run(["git", "-C", path, "rev-parse", "--show-toplevel"]);
  if (top.exitCode !== 0) {
    throw new SandboxError("usage", `Not a git repository: "${path}"`, {
      detail: "Pass --repo a directory inside a git checkout, or a repository URL",
    });
  }
  const repoPath = top.stdout.trim();
  // Independent questions, asked at once (each a git process).
  const [base, commonDirText, status] = await Promise.all([
    run(["git", "-C", repoPath, "rev-parse", "--verify", "--quiet", `${baseName}^{commit}`]),
    git(
      ["-C", repoPath, "rev-parse", "--path-format=absolute", "--git-common-dir"],
      "find the git directory",
    ),
    git(["-C", repoPath, "status", "--porcelain"], "read the repository's status"),
  ]);
  if (base.exitCode !== 0) {
    throw new SandboxError("usage", `Base "${baseName}" not found in "${repoPath}"`, {
      detail:
        "Name a branch, tag or commit that exists (default: the current HEAD, which needs at least one commit)",
    });
  }
  const commonDir = commonDirText.trim();
  return {
    path: repoPath,
    commonDir,
    base: base.stdout.trim(),
    baseName,
    key: await localRepoKey(repoPath),
    uncommitted: status.split("\n").filter(Boolean).length,
  };
}

/** The key of the repository at top-level directory `repoPath`: its name and a hash of the path. */
export async function localRepoKey(repoPath: string): Promise<string> {
  const name = repoPath.replace(/\/+$/, "").split("/").pop()!.replace(/[^A-Za-z0-9._-]/g, "_");
  return `${name}-${(await sha256Hex(repoPath)).slice(0, 12)}`;
}

/** A branch name the user's repository accepts and does not have yet. */
export async function checkRunBranch(repo: LocalRepo, branch: string): Promise<void> {
  const [valid, listed] = await Promise.all([
    run(["git", "check-ref-format", "--branch", branch]),
    git(["-C", repo.path, "for-each-ref", "--format=%(refname)", "refs/heads/"], "list branches"),
  ]);
  if (valid.exitCode !== 0) throw new SandboxError("usage", `Invalid branch name "${branch}"`);
  // A ref can be neither an existing branch nor a prefix or extension of one ("a" vs "a/b").
  const target = `refs/heads/${branch}`;
  const refs = listed.split("\n");
  const clash = refs.find((ref) =>
    ref === target || ref.startsWith(`${target}/`) || target.startsWith(`${ref}/`)
  );
  if (clash) {
    const message = clash === target
      ? `Branch "${branch}" already exists in "${repo.path}"`
      : `Branch "${branch}" cannot be created in "${repo.path}": branch "${
        clash.slice("refs/heads/".length)
      }" is in its way`;
    throw new SandboxError("usage", message, {
      detail: "Choose another with --branch, or delete the existing branch first",
    });
  }
}

/** Run a script in the sandbox (as the sandbox user), failing with its stderr. */
export async function inSandbox(
  provider: SandboxProvider,
  what: string,
  script: string,
  args: string[],
  signal?: AbortSignal,
) {
  const result = await provider.exec(["sh", "-c", script, "sh", ...args], {
    signal,
    timeoutMs: 600_000,
  });
  if (result.exitCode !== 0) {
    throw new CommandExitError("exec_failed", `Cannot ${what} in the sandbox`, {
      argv: ["sh", "-c", script],
      exitCode: result.exitCode,
      stderrTail: result.stderr.trim(),
    });
  }
  return result.stdout;
}

/** Counts bytes flowing through, for reporting transfer sizes. */
function byteCounter(): { stream: TransformStream<Uint8Array, Uint8Array>; bytes: () => number } {
  let count = 0;
  return {
    stream: new TransformStream({
      transform(chunk, controller) {
        count += chunk.byteLength;
        controller.enqueue(chunk);
      },
    }),
    bytes: () => count,
  };
}

/** The run's checkout: its own repository, which borrows the cache's objects and has its own refs. */
const CHECKOUT = 'git init -q "$1" && printf "%s\\n" "$4" >"$1/.git/objects/info/alternates" && ' +
  `if ! ${SAFE_GIT} -C "$1" cat-file -e "$2^{commit}" 2>/dev/null; then rm -rf "$1"; echo "$5"; exit 0; fi && ` +
  `${SAFE_GIT} -C "$1" checkout -q -b "$3" "$2"`;
/** What the checkout prints when the cache lacks the base commit (the host then updates it). */
const BASE_MISSING = "sandbox: base missing";

/**
 * The run's checkout of `repo`'s base commit on a new branch, in one `docker exec`: a repository of
 * the run's own in its workspace, whose objects come from the repository's cache (mounted
 * read-only, lib/repo/cache.ts). When the cache lacks the base (the first run on the repository,
 * or new commits since), the host adds what is missing to the cache, then checks out again: the
 * sandbox receives no repository objects of its own, and a later run copies nothing again.
 */
export async function prepareWorktree(
  provider: SandboxProvider,
  repo: LocalRepo,
  options: {
    runId: string;
    branch: string;
    signal?: AbortSignal;
    updateCache: () => Promise<number>;
  },
): Promise<RunWorktree> {
  const path = `${WORKTREES_DIR}/${options.runId}`;
  const branch = sandboxBranch(options.runId);
  let sentBytes = 0;
  for (let attempt = 0;; attempt++) {
    const out = await inSandbox(provider, "check out the repository", CHECKOUT, [
      path,
      repo.base,
      branch,
      CACHE_OBJECTS,
      BASE_MISSING,
    ], options.signal);
    if (!out.includes(BASE_MISSING)) break;
    if (attempt === 1) {
      throw new SandboxError(
        "exec_failed",
        `The repository cache has no commit ${repo.base.slice(0, 12)} after it was updated`,
      );
    }
    sentBytes = await options.updateCache();
  }
  return {
    bare: path,
    path,
    branch,
    targetBranch: options.branch,
    base: repo.base,
    refsBefore: [],
    sentBytes,
  };
}

/**
 * Send what a repository of the sandbox's lacks of `repo`'s base commit into `steps`, a command
 * that first lists its refs ("sha refname" lines, then `refsEnd`) and then reads a pack on
 * `input` — or says `hasBase` instead of `refsEnd` when it needs none. Returns the bytes sent.
 */
export async function sendBase(
  steps: AsyncIterable<string>,
  input: WritableStream<Uint8Array>,
  repo: LocalRepo,
  marks: { refsEnd: string; hasBase: string; signal?: AbortSignal },
): Promise<number> {
  const counter = byteCounter();
  const refs: string[] = [];
  let packed: Promise<ProcessOutcome> | undefined;
  let done = false;
  try {
    for await (const line of steps) {
      if (packed || done) continue;
      if (line === marks.hasBase) {
        done = true;
        await input.close();
        continue;
      }
      if (line !== marks.refsEnd) {
        if (line) refs.push(line.split(" ")[0]);
        continue;
      }
      const haves = await commitsKnownToHost(repo, refs);
      const pack = spawn(
        [
          "git",
          "-C",
          repo.path,
          "pack-objects",
          "--stdout",
          "--revs",
          "--thin",
          "--delta-base-offset",
          "-q",
        ],
        {
          stdin: [repo.base, ...haves.map((h) => `^${h}`)].join("\n") + "\n",
          signal: marks.signal,
        },
      );
      // A failed pipe shows in the pack's or the receiver's outcome, checked by the caller.
      pack.stdout.pipeThrough(counter.stream).pipeTo(input).catch(() => {});
      packed = pack.finished;
    }
  } finally {
    // Ended before asking for anything: nothing will be sent (the caller reads why from its outcome).
    if (!packed && !done) await input.close().catch(() => {});
  }
  const outcome = await packed;
  if (outcome && outcome.exitCode !== 0) {
    throw new CommandExitError("exec_failed", "Cannot pack the repository", outcome);
  }
  return counter.bytes();
}

/** The run's branch inside the sandbox. */
export function sandboxBranch(runId: string): string {
  return `sandbox/${runId}`;
}

/** Refs the sandbox's repository has now that it did not have (or had elsewhere) when the run began. */
export function refsAddedBy(worktree: RunWorktree, refsNow: string[]): string[] {
  const before = new Set(worktree.refsBefore);
  return refsNow
    .filter((line) => line && !before.has(line))
    .map((line) => line.slice(line.indexOf(" ") + 1))
    .filter((ref) =>
      ref !== `refs/heads/${worktree.branch}` && !ref.startsWith("refs/sandbox/bases/")
    );
}

/** Of `commits`, those the host repository has (so they can be excluded from the pack). */
async function commitsKnownToHost(repo: LocalRepo, commits: string[]): Promise<string[]> {
  const wellFormed = [...new Set(commits)].filter((c) => /^[0-9a-f]{40}$/.test(c));
  if (wellFormed.length === 0) return [];
  const out = await git(
    ["-C", repo.path, "cat-file", "--batch-check"],
    "check the sandbox's commits",
    { stdin: wellFormed.join("\n") + "\n" },
  );
  return out.split("\n").filter((line) => / commit \d+$/.test(line)).map((line) =>
    line.split(" ")[0]
  );
}

export interface CollectResultOptions {
  runId: string;
  signal?: AbortSignal;
  maxBytes?: number;
  /** Warnings (a temporary repository that could not be removed). */
  onProgress?: (line: string) => void;
}

/**
 * What came back into the repository at `path`, in lines for a person; `who` changed nothing
 * when there is no commit. With `commits`, the commits are listed too.
 */
export function describeResult(
  back: RepoResult,
  path: string,
  options: { who: string; commits?: boolean },
): string[] {
  const lines = back.ignoredRefs.map((ref) =>
    `warning: the sandbox created ${ref}: not imported (only the run branch is)`
  );
  if (!back.commit) return [...lines, `${options.who} changed nothing: no branch created`];
  lines.push(
    `branch ${back.branch} in ${path}: ${back.commits.length} commit(s) on ${
      back.base.slice(0, 12)
    }${back.committedLeftovers ? " (uncommitted changes committed by sandbox)" : ""}`,
  );
  for (const commit of options.commits ? back.commits : []) lines.push(`  ${commit}`);
  for (const line of back.diffstat.split("\n")) if (line) lines.push(`  ${line.trim()}`);
  return lines;
}

/**
 * Commit what the agent left uncommitted, then bring the run branch back into the user's
 * repository as `refs/heads/<branch>` — that one ref, and only objects reachable from it.
 */
export async function collectResult(
  provider: SandboxProvider,
  repo: LocalRepo,
  worktree: RunWorktree,
  options: CollectResultOptions,
): Promise<RepoResult> {
  const { committed, head, refs } = await commitLeftovers(provider, worktree, options);
  const ignoredRefs = refsAddedBy(worktree, refs);
  const empty: RepoResult = {
    branch: worktree.targetBranch,
    base: worktree.base,
    commit: null,
    commits: [],
    diffstat: "",
    receivedBytes: 0,
    ignoredRefs,
    committedLeftovers: committed,
  };
  if (!/^[0-9a-f]{40}$/.test(head ?? "") || head === worktree.base) return empty;

  const quarantine = await Deno.makeTempDir({ prefix: "sandbox-quarantine-" });
  try {
    await git(["init", "-q", "--bare", quarantine], "make the quarantine repository");
    // The user's objects, read-only: the sandbox's thin pack may refer to them.
    await Deno.writeTextFile(
      `${quarantine}/objects/info/alternates`,
      `${repo.commonDir}/objects\n`,
    );
    const receivedBytes = await importPack(provider, worktree, head, quarantine, {
      maxBytes: Math.min(options.maxBytes ?? MAX_RESULT_PACK_BYTES, MAX_RESULT_PACK_BYTES),
      signal: options.signal,
    });
    const type = await run(["git", "-C", quarantine, "cat-file", "-t", head]);
    if (type.stdout.trim() !== "commit") {
      throw new SandboxError("exec_failed", `The sandbox's result ${head} is not a commit it sent`);
    }
    await assertPlainGitmodules(quarantine, head, worktree.base, options.signal);
    await git(["-C", quarantine, "update-ref", "refs/heads/result", head], "stage the result");
    await git([
      "-C",
      repo.path,
      "-c",
      "transfer.fsckObjects=true",
      "fetch",
      "--quiet",
      "--no-tags",
      "--no-write-fetch-head",
      "--no-recurse-submodules",
      quarantine,
      `refs/heads/result:refs/heads/${worktree.targetBranch}`,
    ], `bring branch "${worktree.targetBranch}" into ${repo.path}`);
    return {
      ...empty,
      commit: head,
      ...await changesSince(repo, worktree.base, head),
      receivedBytes,
    };
  } finally {
    // It holds every object the sandbox sent: one left behind is named, not kept quietly.
    await Deno.remove(quarantine, { recursive: true }).catch((error) =>
      options.onProgress?.(
        `warning: cannot remove the quarantine repository "${quarantine}": ${error.message}`,
      )
    );
  }
}

/** The commits from `base` to `head` (`git log --oneline`, newest first) and their diffstat. */
async function changesSince(
  repo: LocalRepo,
  base: string,
  head: string,
): Promise<{ commits: string[]; diffstat: string }> {
  const log = await git(
    ["-C", repo.path, "log", "--format=%h %s", `${base}..${head}`],
    "list the run's commits",
  );
  const diffstat = await git(
    ["-C", repo.path, "diff", "--stat", base, head],
    "summarise the run's changes",
  );
  return { commits: log.split("\n").filter(Boolean), diffstat: diffstat.trimEnd() };
}

/**
 * In the sandbox: commit what the agent left uncommitted (as the tool), and report the run
 * branch's head and every ref of the bare repository.
 */
export async function commitLeftovers(
  provider: SandboxProvider,
  worktree: Pick<RunWorktree, "path" | "bare">,
  options: { runId: string; signal?: AbortSignal },
): Promise<{ committed: boolean; head: string; refs: string[] }> {
  const state = await inSandbox(
    provider,
    "read the run's result",
    'cd "$1" || exit 1; committed=no; ' +
      `if [ -n "$(${SAFE_GIT} status --porcelain)" ]; then ${SAFE_GIT} add -A && ` +
      `${SAFE_GIT} -c user.name="${TOOL_IDENTITY.name}" -c user.email="${TOOL_IDENTITY.email}" -c commit.gpgsign=false ` +
      'commit -q --no-verify -m "$2" && committed=yes; fi; ' +
      `echo "$committed"; ${SAFE_GIT} rev-parse HEAD; ${SAFE_GIT} -C "$3" for-each-ref --format="%(objectname) %(refname)"`,
    [worktree.path, `Uncommitted changes left by sandbox run ${options.runId}`, worktree.bare],
    options.signal,
  );
  const [committed, head, ...refs] = state.trim().split("\n");
  return { committed: committed === "yes", head: head ?? "", refs };
}

/**
 * The pack of `head ^base`, streamed from the sandbox's bare repository straight into the
 * quarantine's `git index-pack --strict`: the host holds a chunk at a time, never the pack, and
 * a pack larger than `maxBytes` is cut off and refused. Returns the bytes received.
 */
async function importPack(
  provider: SandboxProvider,
  worktree: RunWorktree,
  head: string,
  quarantine: string,
  options: { maxBytes: number; signal?: AbortSignal },
): Promise<number> {
  const pack = provider.execBytes(
    [
      "sh",
      "-c",
      `printf "%s\\n^%s\\n" "$2" "$3" | ${SAFE_GIT} -C "$1" pack-objects --stdout --revs --thin -q`,
      "sh",
      worktree.bare,
      head,
      worktree.base,
    ],
    { signal: options.signal, timeoutMs: 600_000 },
  );
  let received = 0;
  let tooBig = false;
  const capped = pack.stdout.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        received += chunk.byteLength;
        if (received > options.maxBytes) {
          tooBig = true;
          controller.error(new RangeError("pack too large"));
          return;
        }
        controller.enqueue(chunk);
      },
    }),
  );
  const indexed = await run([
    "git",
    "-C",
    quarantine,
    "index-pack",
    "--stdin",
    "--strict",
    "--fix-thin",
  ], {
    stdin: capped,
    signal: options.signal,
  });
  if (tooBig) {
    await pack.stop();
    throw new SandboxError(
      "exec_failed",
      `The sandbox sent back more than ${formatBytes(options.maxBytes)} of objects: refused`,
    );
  }
  if (indexed.exitCode !== 0) {
    await pack.stop();
    throw new CommandExitError(
      "exec_failed",
      "The sandbox's result failed git's object checks",
      indexed,
    );
  }
  const packed = await pack.outcome;
  if (packed.exitCode !== 0) {
    throw new CommandExitError("exec_failed", "Cannot pack the run's result in the sandbox", {
      argv: ["git", "pack-objects"],
      exitCode: packed.exitCode,
      stderrTail: packed.stderrTail.trim(),
    });
  }
  return received;
}
