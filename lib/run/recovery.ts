/**
 * What became of a dead run's work (`extra.recovery` in its metadata, written by
 * lib/run/recover.ts), and how `sandbox runs` says it.
 */
import { cliName } from "../cli_name.ts";

export type Recovery =
  /** Its branch came back through the normal branch return. */
  | { outcome: "recovered"; branch: string; commit: string; commits: string[] }
  /** Its container stays, with the work in `worktree` (branch `branch` in the sandbox). */
  | {
    outcome: "kept";
    container: string;
    worktree: string;
    branch: string;
    reason: string;
    how: string;
  }
  /** Nothing to bring back: its container was removed. */
  | { outcome: "none"; reason: string };

/** `recovered: branch X`, `kept: container Y`, `nothing to recover`, or undefined for other runs. */
export function describeRecovery(recovery: unknown): string | undefined {
  const known = recovery as Recovery | undefined;
  switch (known?.outcome) {
    case "recovered":
      return `recovered: branch ${known.branch}`;
    case "kept":
      return `kept: container ${known.container}`;
    case "none":
      return "nothing to recover";
    default:
      return undefined;
  }
}

/**
 * Where a crashed run's work waits before anything reaped its container (no `extra.recovery` yet):
 * `work in container X: sandbox up -p P brings it back`, or undefined when the run is not crashed,
 * already handled, or never had a checkout (nothing of it to bring back).
 */
export function describeUnreaped(
  meta: { status: string; profile: string; extra?: Record<string, unknown> | null },
): string | undefined {
  const extra = meta.extra ?? {};
  if (meta.status !== "crashed" || extra.recovery !== undefined || !extra.branchReturn) {
    return undefined;
  }
  if (typeof extra.container !== "string") return undefined;
  return `work in container ${extra.container}: ${cliName()} up -p ${meta.profile} brings it back`;
}
