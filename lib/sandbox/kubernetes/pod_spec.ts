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
import type { V1NetworkPolicy, V1Pod } from "@kubernetes/client-node";
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
  /** `ready` for a pooled pod, `claimed` for one a run starts for itself. */
  state: "ready" | "claimed";
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
        [LABELS.state]: shape.state,
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
