/**
 * The work of a run whose process died (a SIGKILLed or crashed CLI) before it could bring its branch
 * back: found by the next command that reaps the dead process's containers (`up`, a run's pool
 * refill), and either brought back or kept — never removed with the container.
 *
 * How it works:
 * 1. Once a run's checkout is ready, its metadata records what the branch return needs
 *    (`extra.branchReturn`: repository, base, target branch, the checkout's path in the sandbox),
 *    written by the run's own process on the host.
 * 2. A reaper takes over each container whose holder is dead with one rename in the pool's book
 *    (lib/sandbox/pool.ts `recoverOrphan`: of reapers racing, one handles it), and finds the run
 *    whose metadata names that container and that dead process.
 * 3. A local repository's run: its branch comes back through `collectResult`, the very code of a
 *    finished run's return (quarantine, `index-pack --strict`, the `.gitmodules` check, only that
 *    branch fetched), into the branch the run would have created. Nothing but the container's name
 *    and the host-written metadata decides anything; what the sandbox sends is checked as always.
 * 4. When it cannot (the branch exists now, the repository moved, the container stopped, the checks
 *    refused it) or the run was on a remote repository (pushes need the run's own session), a
 *    container with changes is kept, and the metadata says where the work is and how to get it.
 *    A run that changed nothing, or never got its checkout, has its container removed.
 * The run is then recorded `crashed`, with `extra.recovery` saying which.
 */
import { cliName } from "../cli_name.ts";
import type { SandboxProvider } from "../sandbox/provider.ts";
import {
  checkRunBranch,
  collectResult,
  commitLeftovers,
  resolveLocalRepo,
  type RunWorktree,
  sandboxBranch,
} from "../repo/local.ts";
import { listRuns, recordCrashed, type RunMeta } from "./run_log.ts";
import type { Recovery } from "./recovery.ts";

/** What a dead run's branch return needs, recorded by the run itself once its checkout is ready. */
export interface BranchReturnNote {
  kind: "local" | "remote";
  /** The repository's path on the host (local) or its URL (remote). */
  repo: string;
  base: string;
  /** The branch the result becomes. */
  branch: string;
  /** The checkout inside the sandbox. */
  worktree: string;
}

/** The metadata a run records once its checkout is ready (see the module's comment). */
export function branchReturnNote(
  repo: { kind: "local"; local: { path: string } } | { kind: "remote"; remote: { url: string } },
  worktree: Pick<RunWorktree, "base" | "targetBranch" | "path">,
): { branchReturn: BranchReturnNote; workdir: string } {
  return {
    branchReturn: {
      kind: repo.kind,
      repo: repo.kind === "local" ? repo.local.path : repo.remote.url,
      base: worktree.base,
      branch: worktree.targetBranch,
      worktree: worktree.path,
    },
    workdir: worktree.path,
  };
}

/**
 * The sandbox of a dead holder, adopted by this process (lib/sandbox/pool.ts `recoverOrphan`: of
 * reapers racing, one has it).
 */
export interface OrphanedSandbox {
  /** Its name, as the run's metadata records it (`extra.container`). */
  readonly name: string;
  /** The dead process that held it. */
  readonly pid: number;
  readonly provider: SandboxProvider;
  isRunning(): Promise<boolean>;
  /** Keep it, with its work, until the user removes it (`sandbox down`). */
  keep(): Promise<void>;
}

/**
 * Before an adopted sandbox of a dead holder is removed: bring back or keep its run's work.
 * "remove" when the sandbox may go, "kept" when it stays with the work.
 */
export async function recoverRun(orphan: OrphanedSandbox): Promise<"remove" | "kept"> {
  const meta = await runOf(orphan);
  if (!meta) return "remove";
  const note = meta.extra?.branchReturn as BranchReturnNote | undefined;
  let recovery: Recovery;
  try {
    recovery = note
      ? await recoverWork(orphan, meta, note)
      : { outcome: "none", reason: "the run had no checkout yet" };
  } catch (error) {
    recovery = kept(orphan, meta, note, `it could not be brought back: ${describe(error)}`);
  }
  if (recovery.outcome === "kept") await orphan.keep();
  await recordCrashed(meta.id, {
    error: "The run's process ended before the run did (killed or crashed)",
    extra: {
      recovery,
      kept: recovery.outcome === "kept",
      ...(recovery.outcome === "recovered" ? { branch: recovery.branch } : {}),
    },
  });
  return recovery.outcome === "kept" ? "kept" : "remove";
}

/** The run recorded as held in `held.name` by the dead process `held.pid`. */
async function runOf(held: { name: string; pid: number }): Promise<RunMeta | undefined> {
  return (await listRuns()).find((meta) =>
    meta.status === "crashed" && meta.pid === held.pid && meta.extra?.container === held.name
  );
}

/** Bring the run's branch back (local) or keep the container when it holds changes. */
async function recoverWork(
  sandbox: OrphanedSandbox,
  meta: RunMeta,
  note: BranchReturnNote,
): Promise<Recovery> {
  if (!await sandbox.isRunning()) {
    return kept(sandbox, meta, note, "its container is not running");
  }
  const worktree: RunWorktree = {
    bare: note.worktree,
    path: note.worktree,
    branch: sandboxBranch(meta.id),
    targetBranch: note.branch,
    base: note.base,
    refsBefore: [],
    sentBytes: 0,
  };
  if (note.kind === "remote") {
    const { head } = await commitLeftovers(sandbox.provider, worktree, { runId: meta.id });
    if (head === note.base) return { outcome: "none", reason: "the agent changed nothing" };
    return kept(sandbox, meta, note, "a remote run's commits are pushed only by the run itself");
  }
  const local = await resolveLocalRepo(note.repo, note.base);
  try {
    await checkRunBranch(local, note.branch);
  } catch (error) {
    return kept(sandbox, meta, note, describe(error));
  }
  // (At most what any run may send back: the dead run's own limit is not this profile's.)
  const back = await collectResult(sandbox.provider, local, worktree, { runId: meta.id });
  if (!back.commit) return { outcome: "none", reason: "the agent changed nothing" };
  return { outcome: "recovered", branch: back.branch, commit: back.commit, commits: back.commits };
}

function kept(
  sandbox: OrphanedSandbox,
  meta: RunMeta,
  note: BranchReturnNote | undefined,
  reason: string,
): Recovery {
  const worktree = note?.worktree ?? "/workspace";
  return {
    outcome: "kept",
    container: sandbox.name,
    worktree,
    branch: sandboxBranch(meta.id),
    reason,
    how:
      `${cliName()} cp ${meta.id}:. DIR copies its files; ${cliName()} down -p ${meta.profile} removes it`,
  };
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
