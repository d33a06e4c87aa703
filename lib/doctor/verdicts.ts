/**
 * What `sandbox doctor` concludes from what its attacks and their twins observed. Pure functions:
 * every observation is gathered first (lib/doctor/doctor.ts), then judged here, so the judgement is
 * tested on its own (tests/unit/doctor_verdicts_test.ts).
 *
 * The rule of every verdict: an attack that succeeded is BROKEN, whatever else was seen; an attack
 * that failed is HELD only when its positive twin (the same action, allowed, on the same path)
 * succeeded; otherwise the refusal proves nothing here and the check is NOT APPLICABLE, saying why.
 */

export type DefenceStatus = "held" | "broken" | "not_applicable";

export interface DefenceCheck {
  /** Stable identifier (`key`, `host_service`, `egress_allowlist`, …). */
  id: string;
  /** The defence, in words. */
  defence: string;
  status: DefenceStatus;
  /** Why, in one sentence. */
  reason: string;
  /** What was seen: the attack's outcome, then the twin's. */
  evidence: string[];
}

/** The defences, by id, as the table names them. */
export const DEFENCES = {
  key: "the agent cannot read the API key",
  host_service: "a service on the host is unreachable",
  egress_allowlist: "a name outside the allowlist is unreachable",
  address_guard: "an allowed name cannot lead to an internal address",
  escalation: "no capabilities, setuid or user namespaces",
  survivor: "nothing the agent starts survives the sandbox",
  disk: "the workspace cannot grow past resources.disk",
  git_grant: "a push cannot go beyond the git grant",
  pod_network: "the pod reaches no address (the deny-all NetworkPolicy holds)",
} as const;

export type DefenceId = keyof typeof DEFENCES;

function check(
  id: DefenceId,
  status: DefenceStatus,
  reason: string,
  evidence: string[],
): DefenceCheck {
  return { id, defence: DEFENCES[id], status, reason, evidence };
}

export interface KeyObservation {
  /** Where the canary key was found (a process, a file, the container's configuration). */
  canaryFound: string[];
  /** The same search found the session token in the probe's own environment. */
  tokenFound: boolean;
  /** Where the search looked (default: the container's processes, files and configuration). */
  searched?: string;
}

export function judgeKey(seen: KeyObservation): DefenceCheck {
  const twin = seen.tokenFound
    ? "twin: the same search found the session token in its own environment"
    : "twin: the same search did not find the session token either";
  if (seen.canaryFound.length > 0) {
    return check("key", "broken", "the canary key was found in the sandbox", [
      `attack: found in ${seen.canaryFound.join(", ")}`,
      twin,
    ]);
  }
  if (!seen.tokenFound) {
    return check("key", "not_applicable", "the search finds nothing here: it proves nothing", [
      "attack: not found",
      twin,
    ]);
  }
  return check("key", "held", "the canary key is in no process, command line or file", [
    `attack: not found in ${
      seen.searched ??
        "any readable environment, command line or file, nor in the container's configuration"
    }`,
    twin,
  ]);
}

/** An attack over the network: what it reached, and whether its twin reached the same service. */
export interface ReachObservation {
  /** Targets where the attack got the service's answer. */
  reached: string[];
  /** What the attack saw at each target it did not reach (status or error). */
  refused: string[];
  /** The twin got the service's answer. */
  twinReached: boolean;
  twinDetail: string;
  /** Why the defence does not exist at all here (network mode full: no egress proxy). */
  absent?: string;
}

export function judgeReach(id: DefenceId, seen: ReachObservation): DefenceCheck {
  const twin = `twin: ${seen.twinReached ? "reached" : "not reached"} (${seen.twinDetail})`;
  const attack = [
    ...seen.reached.map((target) => `${target}: reached`),
    ...seen.refused,
  ].join("; ");
  if (seen.reached.length > 0) {
    return check(id, "broken", `the attack reached ${seen.reached.join(", ")}`, [
      `attack: ${attack}`,
      twin,
    ]);
  }
  if (seen.absent !== undefined) {
    return check(id, "broken", seen.absent, [`attack: ${attack || "not attempted"}`, twin]);
  }
  if (!seen.twinReached) {
    return check(id, "not_applicable", "the twin failed too: the refusal proves nothing here", [
      `attack: ${attack}`,
      twin,
    ]);
  }
  return check(id, "held", "refused, while the twin on the same path got through", [
    `attack: ${attack}`,
    twin,
  ]);
}

export interface EscalationObservation {
  /** `/proc/self/status` was read (the twin: the probe sees its own credentials). */
  statusRead: boolean;
  capEff: string;
  capPrm: string;
  noNewPrivs: boolean;
  /** Setuid or setgid files the sandbox user may execute. */
  setuidFiles: string[];
  /** `unshare -r` (a user namespace mapping the user to root): what happened. */
  unshare: "refused" | "succeeded" | "missing";
  unshareDetail: string;
}

export function judgeEscalation(seen: EscalationObservation): DefenceCheck {
  const evidence = [
    `attack: CapEff ${seen.capEff}, CapPrm ${seen.capPrm}, NoNewPrivs ${
      seen.noNewPrivs ? 1 : 0
    }, ${seen.setuidFiles.length} setuid files, unshare -r ${seen.unshare} (${seen.unshareDetail})`,
    `twin: ${
      seen.statusRead
        ? "the probe read its own credentials"
        : "the probe could not read its credentials"
    }`,
  ];
  const gained: string[] = [];
  if (!/^0+$/.test(seen.capEff) || !/^0+$/.test(seen.capPrm)) gained.push("capabilities");
  if (seen.setuidFiles.length > 0 && !seen.noNewPrivs) {
    gained.push(`setuid programs (${seen.setuidFiles.slice(0, 3).join(", ")})`);
  }
  if (seen.unshare === "succeeded") gained.push("a user namespace (unshare -r)");
  if (gained.length > 0) {
    return check(
      "escalation",
      "broken",
      `the sandbox user can gain ${gained.join(", ")}`,
      evidence,
    );
  }
  if (!seen.statusRead) {
    return check(
      "escalation",
      "not_applicable",
      "the probe could not read its credentials",
      evidence,
    );
  }
  return check(
    "escalation",
    "held",
    "no capability, no effective setuid, no user namespace",
    evidence,
  );
}

export interface SurvivorObservation {
  /** The `setsid` child ran while its command did (the twin). */
  seenDuring: boolean;
  /** It was still there after its command ended. */
  aliveAfterCommand: boolean;
  /** It, or the container, was still there after the sandbox was destroyed. */
  aliveAfterDestroy: boolean;
  detail: string;
  /**
   * Why a child alive after its command is no breach here, when it is not (mode local keeps what a
   * command leaves until the sandbox is released, docs/local.md): then only the release counts.
   */
  leftoversUntilRelease?: string;
}

export function judgeSurvivor(seen: SurvivorObservation): DefenceCheck {
  const evidence = [
    `attack: after its command ${seen.aliveAfterCommand ? "alive" : "gone"}, after the sandbox ${
      seen.aliveAfterDestroy ? "alive" : "gone"
    } (${seen.detail})`,
    `twin: ${seen.seenDuring ? "running while its command ran" : "never seen running"}`,
  ];
  if (seen.aliveAfterDestroy) {
    return check("survivor", "broken", "a setsid child outlived the sandbox", evidence);
  }
  const excused = seen.leftoversUntilRelease;
  if (seen.aliveAfterCommand && excused === undefined) {
    return check("survivor", "broken", "a setsid child outlived its command", evidence);
  }
  if (!seen.seenDuring) {
    return check("survivor", "not_applicable", "the setsid child never started", evidence);
  }
  if (seen.aliveAfterCommand) {
    return check(
      "survivor",
      "held",
      `the setsid child ended with the sandbox (${excused})`,
      evidence,
    );
  }
  return check("survivor", "held", "the setsid child ended with its command", evidence);
}

export interface DiskObservation {
  limitBytes: number;
  /** The write under the limit ran to its end (the twin). */
  twinCompleted: boolean;
  /** The write past the limit ran to its end. */
  attackCompleted: boolean;
  /** What stopped it (the disk watch's message, or the write's own error). */
  stoppedBy: string;
  /** Bytes of the attack's file when it ended, when known. */
  writtenBytes?: number;
}

export function judgeDisk(seen: DiskObservation): DefenceCheck {
  const written = seen.writtenBytes === undefined ? "" : `, ${seen.writtenBytes} bytes written`;
  const evidence = [
    `attack: ${seen.attackCompleted ? "ran to its end" : `stopped: ${seen.stoppedBy}`}${written}`,
    `twin: ${
      seen.twinCompleted
        ? "a write under the limit ran to its end"
        : "a write under the limit failed"
    }`,
  ];
  if (seen.attackCompleted) {
    return check(
      "disk",
      "broken",
      `a write of three times the ${seen.limitBytes}-byte limit ran to its end`,
      evidence,
    );
  }
  if (!seen.twinCompleted) {
    return check("disk", "not_applicable", "a write under the limit failed too", evidence);
  }
  return check("disk", "held", "the write past the limit was stopped", evidence);
}

/**
 * Every defence BROKEN (git's NOT APPLICABLE): the sandbox mode isolates nothing. The pod network's
 * row is mode kubernetes's alone.
 */
export function nothingIsolated(mode: string): DefenceCheck[] {
  const reason = `sandbox mode "${mode}" runs the agent on the host as your user: nothing is ` +
    "isolated (it can read this process's memory, reach the host, write your disk)";
  const ids = (Object.keys(DEFENCES) as DefenceId[]).filter((id) => id !== "pod_network");
  return ids.map((id) =>
    id === "git_grant"
      ? check(id, "not_applicable", "no git remote is given", [])
      : check(id, "broken", reason, [])
  );
}

/** The checks that should hold and do not. */
export function brokenChecks(checks: readonly DefenceCheck[]): DefenceCheck[] {
  return checks.filter((c) => c.status === "broken");
}
