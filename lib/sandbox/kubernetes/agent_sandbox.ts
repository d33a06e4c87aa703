/**
 * agent-sandbox (kubernetes-sigs/agent-sandbox) as the warm pool of mode kubernetes: a
 * `SandboxTemplate` built from our pod manifest, a `SandboxWarmPool` of it, and per run a
 * `SandboxClaim` that its controller binds to a warm `Sandbox` (or to one it starts cold); the
 * run then uses that Sandbox's pod as it uses one of ours.
 *
 * The resources, as agent-sandbox v1beta1 defines them (extensions/api/v1beta1/*_types.go,
 * api/v1beta1/sandbox_types.go): the claim's `status.sandbox.name` names the bound Sandbox once its
 * `Ready` condition is `True` (the Sandbox's own, forwarded); the Sandbox's annotation
 * `agents.x-k8s.io/pod-name` names its pod. Deleting the claim deletes its Sandbox and pod (the
 * claim owns the Sandbox, which owns the pod).
 */
import type { V1Pod } from "@kubernetes/client-node";
import type { Profile } from "../../config.ts";
import { SandboxError } from "../../errors.ts";
import { type Cluster, clusterError, isConflict, isNotFound } from "./cluster.ts";
import { CLAIMED_BY, LABELS, OWNER } from "./pod_spec.ts";

/** The API groups and versions used (both must be served for `pool: agent-sandbox`). */
export const EXTENSIONS = { group: "extensions.agents.x-k8s.io", version: "v1beta1" } as const;
export const SANDBOXES = { group: "agents.x-k8s.io", version: "v1beta1" } as const;
export const PLURALS = {
  template: "sandboxtemplates",
  warmPool: "sandboxwarmpools",
  claim: "sandboxclaims",
  sandbox: "sandboxes",
} as const;
/** On a Sandbox: the pod it runs (`SandboxPodNameAnnotation`). */
export const POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name";
/** On a Sandbox: `warm` when a claim adopted it from a warm pool, `cold` when started for one. */
export const LAUNCH_TYPE_LABEL = "agents.x-k8s.io/launch-type";
/** On a claimed Sandbox's pod: the claim's uid (`SandboxIDLabel`). */
export const CLAIM_UID_LABEL = "agents.x-k8s.io/claim-uid";
/**
 * `Ready=False` reasons of a claim its controller does not recover from (the Python client's
 * TERMINAL_CLAIM_READY_REASONS, after `computeReadyCondition` in sandboxclaim_controller.go).
 */
const TERMINAL_REASONS = new Set([
  "InvalidMetadata",
  "EnvVarsInjectionRejected",
  "VolumeClaimTemplatesError",
  "ClaimExpired",
  "SandboxExpired",
]);
const POLL_MS = 250;

type Manifest = {
  apiVersion?: string;
  kind?: string;
  metadata?: {
    name?: string;
    uid?: string;
    resourceVersion?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
  };
  spec?: Record<string, unknown>;
  status?: {
    readyReplicas?: number;
    sandbox?: { name?: string };
    conditions?: { type: string; status: string; reason?: string; message?: string }[];
  };
};

/** Whether the cluster serves both agent-sandbox API groups at the version used here. */
export async function servesAgentSandbox(cluster: Cluster): Promise<boolean> {
  let groups;
  try {
    groups = (await cluster.apis.getAPIVersions()).groups;
  } catch (error) {
    throw clusterError(cluster, "list the API groups", error);
  }
  const serves = (want: { group: string; version: string }) =>
    groups.some((group) =>
      group.name === want.group && group.versions.some((v) => v.version === want.version)
    );
  return serves(EXTENSIONS) && serves(SANDBOXES);
}

/** Which warm pool `profile` uses on `cluster`; `agent-sandbox` on a cluster without it is refused. */
export async function poolStrategy(
  cluster: Cluster,
  profile: Profile,
): Promise<"agent-sandbox" | "own"> {
  const setting = profile.sandbox.kubernetes.pool;
  if (setting === "own") return "own";
  if (await servesAgentSandbox(cluster)) return "agent-sandbox";
  if (setting === "auto") return "own";
  throw new SandboxError(
    "config_invalid",
    `profiles.${profile.name}.sandbox.kubernetes.pool is "agent-sandbox", but ${cluster.server} (context "${cluster.context}") does not serve ${EXTENSIONS.group}/${EXTENSIONS.version} and ${SANDBOXES.group}/${SANDBOXES.version}`,
    {
      detail: "Install agent-sandbox with its extensions on the cluster, or set " +
        `profiles.${profile.name}.sandbox.kubernetes.pool to "own" (or "auto")`,
    },
  );
}

function ownerLabels(profile: string, pool: string): Record<string, string> {
  return { [LABELS.owner]: OWNER, [LABELS.profile]: profile, [LABELS.pool]: pool };
}

/**
 * The template of `pod` (our manifest, without a name or state). `networkPolicyManagement:
 * Unmanaged`: the controller's managed default allows egress to the public internet
 * (sandboxtemplate_types.go), and NetworkPolicies add up, so it would undo `sandbox-deny-all`.
 */
export function templateManifest(name: string, profile: string, pool: string, pod: V1Pod) {
  return {
    apiVersion: `${EXTENSIONS.group}/${EXTENSIONS.version}`,
    kind: "SandboxTemplate",
    metadata: { name, labels: ownerLabels(profile, pool) },
    spec: {
      podTemplate: { metadata: { labels: pod.metadata?.labels ?? {} }, spec: pod.spec },
      networkPolicyManagement: "Unmanaged",
    },
  };
}

/** A warm pool of `replicas` Sandboxes of template `name`; stale ones replaced at once. */
export function warmPoolManifest(name: string, profile: string, pool: string, replicas: number) {
  return {
    apiVersion: `${EXTENSIONS.group}/${EXTENSIONS.version}`,
    kind: "SandboxWarmPool",
    metadata: { name, labels: ownerLabels(profile, pool) },
    spec: { replicas, sandboxTemplateRef: { name }, updateStrategy: { type: "Recreate" } },
  };
}

/** One run's claim on warm pool `warmPool`; its pod is labelled claimed. */
export function claimManifest(
  name: string,
  shape: { profile: string; pool: string; warmPool: string; claimedBy: string },
) {
  return {
    apiVersion: `${EXTENSIONS.group}/${EXTENSIONS.version}`,
    kind: "SandboxClaim",
    metadata: {
      name,
      labels: { ...ownerLabels(shape.profile, shape.pool), [LABELS.state]: "claimed" },
      annotations: { [CLAIMED_BY]: shape.claimedBy },
    },
    spec: {
      warmPoolRef: { name: shape.warmPool },
      additionalPodMetadata: { labels: { [LABELS.state]: "claimed" } },
    },
  };
}

function api(plural: string) {
  return plural === PLURALS.sandbox ? SANDBOXES : EXTENSIONS;
}

/** Read `plural`/`name`; undefined when it does not exist. */
export async function readObject(
  cluster: Cluster,
  plural: string,
  name: string,
): Promise<Manifest | undefined> {
  try {
    return await cluster.custom.getNamespacedCustomObject({
      ...api(plural),
      namespace: cluster.namespace,
      plural,
      name,
    }) as Manifest;
  } catch (error) {
    if (isNotFound(error)) return undefined;
    throw clusterError(cluster, `read ${plural} "${name}"`, error);
  }
}

/** The objects of `plural` matching `labelSelector`. */
export async function listObjects(
  cluster: Cluster,
  plural: string,
  labelSelector: string,
): Promise<Manifest[]> {
  try {
    const list = await cluster.custom.listNamespacedCustomObject({
      ...api(plural),
      namespace: cluster.namespace,
      plural,
      labelSelector,
    }) as { items?: Manifest[] };
    return list.items ?? [];
  } catch (error) {
    throw clusterError(cluster, `list ${plural}`, error);
  }
}

/** Delete `plural`/`name` (its dependents with it); false when it was already gone. */
export async function deleteObject(cluster: Cluster, plural: string, name: string) {
  try {
    await cluster.custom.deleteNamespacedCustomObject({
      ...api(plural),
      namespace: cluster.namespace,
      plural,
      name,
      propagationPolicy: "Background",
    });
    return true;
  } catch (error) {
    if (isNotFound(error)) return false;
    throw clusterError(cluster, `delete ${plural} "${name}"`, error);
  }
}

function sameSpec(a: unknown, b: unknown): boolean {
  const sorted = (value: unknown) =>
    JSON.stringify(
      value ?? null,
      (_key, item) =>
        item && typeof item === "object" && !Array.isArray(item)
          ? Object.fromEntries(Object.entries(item).sort(([x], [y]) => x.localeCompare(y)))
          : item,
    );
  return sorted(a) === sorted(b);
}

/**
 * Create `body` (of `plural`), or replace the one there when its spec differs: what runs in the
 * pool is what this process would create, whoever edited it before.
 */
export async function ensureObject(cluster: Cluster, plural: string, body: Manifest) {
  const name = body.metadata!.name!;
  for (let attempt = 0; attempt < 3; attempt++) {
    const found = await readObject(cluster, plural, name);
    try {
      if (!found) {
        await cluster.custom.createNamespacedCustomObject({
          ...api(plural),
          namespace: cluster.namespace,
          plural,
          body,
        });
      } else if (!sameSpec(found.spec, body.spec)) {
        const metadata = { ...body.metadata, resourceVersion: found.metadata?.resourceVersion };
        await cluster.custom.replaceNamespacedCustomObject({
          ...api(plural),
          namespace: cluster.namespace,
          plural,
          name,
          body: { ...body, metadata },
        });
      }
      return;
    } catch (error) {
      // Created or changed meanwhile by another process: read it again and decide again.
      if (!isConflict(error)) throw clusterError(cluster, `write ${plural} "${name}"`, error);
    }
  }
  throw new SandboxError("cluster_failed", `${plural} "${name}" keeps changing under this process`);
}

/** The claim's Ready condition, as the controller reports it. */
function readyOf(claim: Manifest) {
  return claim.status?.conditions?.find((condition) => condition.type === "Ready");
}

/**
 * Create claim `body` and wait until its controller binds it to a Ready Sandbox; the name of that
 * Sandbox's pod, and whether it came from the warm pool. A terminal reason or the deadline deletes
 * the claim and raises why.
 */
export async function claimPod(
  cluster: Cluster,
  body: ReturnType<typeof claimManifest>,
  options: { timeoutMs: number; signal?: AbortSignal },
): Promise<{ pod: string; warm: boolean }> {
  const name = body.metadata.name;
  try {
    await cluster.custom.createNamespacedCustomObject({
      ...EXTENSIONS,
      namespace: cluster.namespace,
      plural: PLURALS.claim,
      body,
    });
  } catch (error) {
    throw clusterError(cluster, `create SandboxClaim "${name}"`, error);
  }
  try {
    const sandbox = await waitBound(cluster, name, options);
    const object = await readObject(cluster, PLURALS.sandbox, sandbox);
    if (!object) throw new SandboxError("cluster_failed", `Sandbox "${sandbox}" disappeared`);
    return {
      pod: object.metadata?.annotations?.[POD_NAME_ANNOTATION] || sandbox,
      warm: object.metadata?.labels?.[LAUNCH_TYPE_LABEL] === "warm",
    };
  } catch (error) {
    // A claim that cannot serve the run is removed; the error says why.
    await deleteObject(cluster, PLURALS.claim, name).catch(() => false);
    throw error;
  }
}

async function waitBound(
  cluster: Cluster,
  name: string,
  options: { timeoutMs: number; signal?: AbortSignal },
): Promise<string> {
  const deadline = Date.now() + options.timeoutMs;
  for (;;) {
    if (options.signal?.aborted) throw new SandboxError("interrupted", "Interrupted");
    const claim = await readObject(cluster, PLURALS.claim, name);
    if (!claim) {
      throw new SandboxError("cluster_failed", `SandboxClaim "${name}" disappeared while binding`);
    }
    const ready = readyOf(claim);
    const sandbox = claim.status?.sandbox?.name;
    if (ready?.status === "True" && sandbox) return sandbox;
    const why = ready ? `${ready.reason ?? "NotReady"}: ${ready.message ?? ""}`.trimEnd() : "";
    if (ready?.status === "False" && TERMINAL_REASONS.has(ready.reason ?? "")) {
      throw new SandboxError("cluster_failed", `SandboxClaim "${name}" failed: ${why}`);
    }
    if (Date.now() > deadline) {
      throw new SandboxError(
        "cluster_failed",
        `SandboxClaim "${name}" is not bound to a ready Sandbox after ${
          Math.round(options.timeoutMs / 1000)
        } s${why ? `: ${why}` : ""}`,
        { detail: `See kubectl -n ${cluster.namespace} describe sandboxclaim ${name}` },
      );
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

/** Set claim `name`'s state label (a kept run's claim): replaced at the version read. */
export async function relabelClaim(cluster: Cluster, name: string, state: string): Promise<void> {
  const claim = await readObject(cluster, PLURALS.claim, name);
  if (!claim) return;
  claim.metadata!.labels = { ...claim.metadata!.labels, [LABELS.state]: state };
  try {
    await cluster.custom.replaceNamespacedCustomObject({
      ...EXTENSIONS,
      namespace: cluster.namespace,
      plural: PLURALS.claim,
      name,
      body: claim,
    });
  } catch (error) {
    throw clusterError(cluster, `relabel SandboxClaim "${name}"`, error);
  }
}

/** Wait until warm pool `name` reports `replicas` ready Sandboxes. */
export async function waitWarm(
  cluster: Cluster,
  name: string,
  replicas: number,
  options: { timeoutMs: number; signal?: AbortSignal },
): Promise<void> {
  const deadline = Date.now() + options.timeoutMs;
  for (;;) {
    if (options.signal?.aborted) throw new SandboxError("interrupted", "Interrupted");
    const pool = await readObject(cluster, PLURALS.warmPool, name);
    const ready = pool?.status?.readyReplicas ?? 0;
    if (ready >= replicas) return;
    if (Date.now() > deadline) {
      throw new SandboxError(
        "cluster_failed",
        `SandboxWarmPool "${name}" has ${ready} of ${replicas} Sandboxes ready after ${
          Math.round(options.timeoutMs / 1000)
        } s`,
        { detail: `See kubectl -n ${cluster.namespace} describe sandboxwarmpool ${name}` },
      );
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}
