/**
 * A shell's repository (`sandbox shell --repo`): checked out in the session's sandbox as a run's
 * is, and brought back as a run's branch is when the shell ends (lib/repo/local.ts: leftovers
 * committed by the tool, only the session's branch imported through the quarantine). When it
 * cannot come back, the sandbox is kept with the work and where it is is said.
 */
import { cliName } from "../cli_name.ts";
import {
  collectResult,
  describeResult,
  type LocalRepo,
  prepareWorktree,
  type RunWorktree,
} from "../repo/local.ts";
import type { RunSandbox } from "../sandbox/provider.ts";

/** The repository of a shell: resolved (and its branch checked) by the CLI that starts it. */
export interface ShellRepo {
  local: LocalRepo;
  /** The branch the work becomes in the user's repository. */
  branch: string;
}

/** What came back: lines for the person, whether the sandbox stays, what the record keeps. */
export interface ShellRepoOutcome {
  lines: string[];
  keep: boolean;
  extra: Record<string, unknown>;
}

/** The shell's checkout in its sandbox: where the shell starts. */
export function checkOutForShell(
  sandbox: RunSandbox,
  repo: ShellRepo,
  runId: string,
): Promise<RunWorktree> {
  return prepareWorktree(sandbox.provider, repo.local, {
    runId,
    branch: repo.branch,
    updateCache: () => sandbox.updateCache(repo.local),
  });
}

/**
 * The shell's commits (and what it left uncommitted, committed by the tool) brought back as its
 * branch. Never raises: a failure keeps the work in the sandbox and says where.
 */
export async function bringShellBack(
  sandbox: RunSandbox,
  repo: ShellRepo,
  worktree: RunWorktree,
  options: { runId: string; profile: string; maxBytes?: number },
): Promise<ShellRepoOutcome> {
  const warnings: string[] = [];
  try {
    const back = await collectResult(sandbox.provider, repo.local, worktree, {
      runId: options.runId,
      maxBytes: options.maxBytes,
      onProgress: (line) => warnings.push(line),
    });
    return {
      lines: [
        ...warnings,
        ...describeResult(back, repo.local.path, { who: "the shell", commits: true }),
      ],
      keep: false,
      extra: {
        repo: repo.local.path,
        branch: back.commit ? back.branch : null,
        base: back.base,
        commit: back.commit,
        diffstat: back.diffstat,
        commits: back.commits,
      },
    };
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    return {
      lines: [
        ...warnings,
        `the shell's work could not come back: ${why}`,
        `it is kept in ${sandbox.name}: ${worktree.path} (branch ${worktree.branch}); remove it with: ${cliName()} down -p ${options.profile}`,
      ],
      keep: true,
      extra: { repo: repo.local.path, branch: null, kept: sandbox.name, workdir: worktree.path },
    };
  }
}
