/**
 * What the tool creates on a cluster, as manifests: a sandbox pod with the Docker provider's
 * hardening in Kubernetes' terms, and the NetworkPolicy that cuts every sandbox pod off the
 * network (docs/kubernetes.md).
 *
 * A pod has two containers, in one network namespace (loopback only, by the policy) but with
 * separate process namespaces: `sandbox` (uid 10001, where the agent and the worker run) and
 * `relay` (uid 10002, where the relay runs on its exec stream). The agent can reach the relay's
 * loopback ports and nothing of its processes: it cannot see, signal, ptrace or read them.
 */
import type { V1NetworkPolicy, V1Pod, V1ResourceRequirements } from "@kubernetes/client-node";
import type { Profile } from "../../config.ts";
import { RELAY_UID, SANDBOX_UID } from "../users.ts";

/** Label keys on everything the tool creates (teardown, the pool and the policy select by them). */
export const LABELS = {
  owner: "sandbox.dev/owner",
  profile: "sandbox.dev/profile",
  /** `ready` (pooled, unclaimed) or `claimed` (one run's). */
  state: "sandbox.dev/state",
  /** The kind of run a pooled pod serves (agent), so that a claim takes a matching one. */
  pool: "sandbox.dev/pool",
} as const;
export const OWNER = "sandbox";
/** Annotations of a claimed pod: who claimed it (`HOST:PID`), for reaping orphans. */
export const CLAIMED_BY = "sandbox.dev/claimed-by";

/** The pod's containers. */
export const SANDBOX_CONTAINER = "sandbox";
export const RELAY_CONTAINER = "relay";
/** The NetworkPolicy the tool keeps in its namespace. */
export const POLICY_NAME = "sandbox-deny-all";

export const WORKSPACE_DIR = "/workspace";
const HOME_DIR = "/home/sandbox";
/** Each pod's own repository object cache (lib/repo/cache_layout.ts CACHE_DIR). */
const CACHE_DIR = "/cache";

export interface PodShape {
  name: string;
  image: string;
  /**
   * `ready` for a pooled pod, `claimed` for one a run starts for itself; none in an
   * agent-sandbox template (a claim adds `claimed` to the pod it binds).
   */
  state?: "ready" | "claimed";
  /** The pool key (see LABELS.pool). */
  pool: string;
  claimedBy?: string;
}

/** Kubernetes' quantity for a byte count. */
function bytes(value: number): string {
  return String(Math.max(1, Math.floor(value)));
}

/** The hardened security context of a container running as `uid`. */
function hardened(uid: number) {
  return {
    runAsUser: uid,
    runAsGroup: uid,
    runAsNonRoot: true,
    allowPrivilegeEscalation: false,
    privileged: false,
    readOnlyRootFilesystem: true,
    capabilities: { drop: ["ALL"] },
    seccompProfile: { type: "RuntimeDefault" },
  };
}

/** The sandbox pod of `profile` named `shape.name`. */
export function podManifest(profile: Profile, shape: PodShape): V1Pod {
  const { resources } = profile;
  // As in the Docker provider: memory-backed /tmp and home stay within half of the memory limit.
  const tmpfs = bytes(resources.memoryBytes / 4);
  const limits = { memory: bytes(resources.memoryBytes), cpu: String(resources.cpus) };
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      name: shape.name,
      labels: {
        [LABELS.owner]: OWNER,
        [LABELS.profile]: profile.name,
        ...(shape.state ? { [LABELS.state]: shape.state } : {}),
        [LABELS.pool]: shape.pool,
      },
      annotations: shape.claimedBy ? { [CLAIMED_BY]: shape.claimedBy } : {},
    },
    spec: {
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      hostNetwork: false,
      hostPID: false,
      hostIPC: false,
      shareProcessNamespace: false,
      restartPolicy: "Never",
      terminationGracePeriodSeconds: 2,
      ...(profile.sandbox.kubernetes.runtime_class_name
        ? { runtimeClassName: profile.sandbox.kubernetes.runtime_class_name }
        : {}),
      securityContext: {
        runAsNonRoot: true,
        fsGroup: SANDBOX_UID,
        seccompProfile: { type: "RuntimeDefault" },
      },
      containers: [
        {
          name: SANDBOX_CONTAINER,
          image: shape.image,
          // The image's own command: `sandbox-exec --init` as pid 1 (scripts/sandbox-exec).
          securityContext: hardened(SANDBOX_UID),
          resources: { requests: limits, limits: { ...limits } },
          volumeMounts: [
            { name: "workspace", mountPath: WORKSPACE_DIR },
            { name: "tmp", mountPath: "/tmp" },
            { name: "home", mountPath: HOME_DIR },
            { name: "cache", mountPath: CACHE_DIR },
          ],
        },
        {
          name: RELAY_CONTAINER,
          image: shape.image,
          // Only a parent for the relay's execs; each relay's wrapper reaps its own tree.
          command: ["sleep", "infinity"],
          securityContext: hardened(RELAY_UID),
          resources: {
            requests: { memory: "64Mi", cpu: "50m" },
            limits: { memory: "256Mi", cpu: "500m" },
          },
        },
      ],
      volumes: [
        // The kubelet evicts the pod when the workspace passes its size limit.
        { name: "workspace", emptyDir: { sizeLimit: bytes(resources.diskBytes) } },
        { name: "tmp", emptyDir: { medium: "Memory", sizeLimit: tmpfs } },
        { name: "home", emptyDir: { medium: "Memory", sizeLimit: tmpfs } },
        { name: "cache", emptyDir: { sizeLimit: bytes(resources.diskBytes) } },
      ],
    },
  };
}

/** The policy that denies every sandbox pod all ingress and all egress. */
export function networkPolicyManifest(): V1NetworkPolicy {
  return {
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: { name: POLICY_NAME, labels: { [LABELS.owner]: OWNER } },
    spec: {
      podSelector: { matchLabels: { [LABELS.owner]: OWNER } },
      policyTypes: ["Ingress", "Egress"],
      ingress: [],
      egress: [],
    },
  };
}

/**
 * Whether `policy` denies all ingress and egress to every pod the tool creates: it selects them
 * by our owner label alone (or selects every pod), names both directions, and allows nothing.
 */
export function deniesAll(policy: V1NetworkPolicy): boolean {
  const spec = policy.spec;
  if (!spec) return false;
  const selector = spec.podSelector ?? {};
  const match = selector.matchLabels ?? {};
  const selectsOurs = (selector.matchExpressions ?? []).length === 0 &&
    Object.entries(match).every(([key, value]) => key === LABELS.owner && value === OWNER);
  const types = spec.policyTypes ?? [];
  return selectsOurs && types.includes("Ingress") && types.includes("Egress") &&
    (spec.ingress ?? []).length === 0 && (spec.egress ?? []).length === 0;
}

/** A quantity as a number (plain, binary Ki/Mi/Gi/Ti, decimal k/M/G/T, or milli `m`). */
function quantityValue(text: string | undefined): number | undefined {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?$/.exec(String(text ?? ""));
  if (!m) return undefined;
  const scale: Record<string, number> = {
    Ki: 2 ** 10,
    Mi: 2 ** 20,
    Gi: 2 ** 30,
    Ti: 2 ** 40,
    k: 1e3,
    M: 1e6,
    G: 1e9,
    T: 1e12,
    m: 1e-3,
  };
  return Number(m[1]) * (scale[m[2] ?? ""] ?? 1);
}

/** JSON with sorted keys: two objects the API server returns in another key order compare equal. */
function canonical(value: unknown): string {
  return JSON.stringify(
    value ?? null,
    (_key, item) =>
      item && typeof item === "object" && !Array.isArray(item)
        ? Object.fromEntries(Object.entries(item).sort(([a], [b]) => a.localeCompare(b)))
        : item,
  );
}

function limitsOf(resources: V1ResourceRequirements | undefined): string {
  return canonical(
    Object.fromEntries(
      Object.entries(resources?.limits ?? {}).map(([key, value]) => [key, quantityValue(value)]),
    ),
  );
}

/**
 * What in `pod` differs from the hardening of `expected` (our manifest), or undefined when
 * nothing does: the pod-level isolation fields, each container's image, command, security
 * context and limits, no other container, and volumes that are exactly our emptyDirs. A pod a
 * controller built from a template (agent-sandbox) is checked so before a run uses it: anyone who
 * can edit the template in the cluster would otherwise choose what the agent runs in.
 */
export function hardeningMismatch(pod: V1Pod, expected: V1Pod): string | undefined {
  const have = pod.spec;
  const want = expected.spec!;
  if (!have) return "the pod has no spec";
  const flags = (spec: typeof want) =>
    canonical({
      automountServiceAccountToken: spec.automountServiceAccountToken ?? true,
      enableServiceLinks: spec.enableServiceLinks ?? true,
      hostNetwork: spec.hostNetwork ?? false,
      hostPID: spec.hostPID ?? false,
      hostIPC: spec.hostIPC ?? false,
      hostUsers: spec.hostUsers ?? true,
      shareProcessNamespace: spec.shareProcessNamespace ?? false,
      runtimeClassName: spec.runtimeClassName ?? null,
      securityContext: spec.securityContext ?? {},
    });
  if (flags(have) !== flags(want)) return "its pod-level isolation fields differ";
  if ((have.initContainers ?? []).length || (have.ephemeralContainers ?? []).length) {
    return "it has init or ephemeral containers";
  }
  const names = (list: { name: string }[]) => list.map((c) => c.name).sort().join(",");
  if (names(have.containers) !== names(want.containers)) return "its containers differ";
  for (const ours of want.containers) {
    const theirs = have.containers.find((c) => c.name === ours.name)!;
    const shape = (c: typeof ours) =>
      canonical({
        image: c.image,
        command: c.command ?? null,
        args: c.args ?? null,
        securityContext: c.securityContext ?? {},
        mounts: (c.volumeMounts ?? []).map((m) => [m.name, m.mountPath, m.readOnly ?? false]),
      });
    if (shape(theirs) !== shape(ours) || limitsOf(theirs.resources) !== limitsOf(ours.resources)) {
      return `its container "${ours.name}" differs (image, command, security context or limits)`;
    }
  }
  const volumes = (list: typeof want.volumes) =>
    canonical(
      (list ?? []).map((v) => ({
        name: v.name,
        keys: Object.keys(v).filter((key) => key !== "name" && v[key as keyof typeof v] != null)
          .sort(),
        medium: v.emptyDir?.medium ?? "",
        size: quantityValue(v.emptyDir?.sizeLimit),
      })).sort((a, b) => a.name.localeCompare(b.name)),
    );
  if (volumes(have.volumes) !== volumes(want.volumes)) return "its volumes differ";
  if (pod.metadata?.labels?.[LABELS.owner] !== OWNER) {
    return `it lacks the label ${LABELS.owner}=${OWNER} the deny-all NetworkPolicy selects`;
  }
  return undefined;
}
