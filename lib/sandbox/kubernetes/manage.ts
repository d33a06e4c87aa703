/**
 * `sandbox status`, `down` and `teardown --all` on a cluster (mode kubernetes): everything the
 * tool made there (pods, and agent-sandbox's templates, warm pools and claims) carries its owner
 * label (pod_spec.ts LABELS), and is found and removed by it.
 */
import type { Profile } from "../../config.ts";
import type { SandboxStatus, TeardownReport } from "../provider.ts";
import { type Cluster, clusterError, isNotFound, openCluster } from "./cluster.ts";
import { LABELS, OWNER, POLICY_NAME } from "./pod_spec.ts";
import { deletePod, podStatus } from "./provider.ts";
import { deleteObject, listObjects, PLURALS, servesAgentSandbox } from "./agent_sandbox.ts";

function selector(profile?: string): string {
  return [`${LABELS.owner}=${OWNER}`, ...(profile ? [`${LABELS.profile}=${profile}`] : [])]
    .join(",");
}

async function ownedPods(cluster: Cluster, profile?: string) {
  try {
    return (await cluster.core.listNamespacedPod({
      namespace: cluster.namespace,
      labelSelector: selector(profile),
    })).items;
  } catch (error) {
    throw clusterError(cluster, "list pods", error);
  }
}

/** Every sandbox pod in the namespace of `profile`'s cluster (of every profile). */
export async function clusterSandboxes(profile: Profile): Promise<SandboxStatus[]> {
  const cluster = await openCluster(profile);
  return (await ownedPods(cluster)).map((pod) => {
    const name = pod.metadata?.name ?? "";
    return podStatus(pod.metadata?.labels?.[LABELS.profile] ?? "", name, pod);
  });
}

/**
 * Remove `profile`'s pods (its pool, runs' pods, kept ones) from its cluster; with `all`, every
 * pod the tool owns in that namespace and its NetworkPolicy too.
 */
export async function teardownCluster(
  profile: Profile,
  options: { all?: boolean } = {},
): Promise<TeardownReport> {
  const cluster = await openCluster(profile);
  const who = options.all ? undefined : profile.name;
  const pods = await ownedPods(cluster, who);
  // agent-sandbox's first: its controllers would start again the pods removed below (removing a
  // claim or a warm pool removes its pods).
  if (profile.sandbox.kubernetes.pool !== "own" && await servesAgentSandbox(cluster)) {
    for (const plural of [PLURALS.claim, PLURALS.warmPool, PLURALS.template]) {
      for (const object of await listObjects(cluster, plural, selector(who))) {
        await deleteObject(cluster, plural, object.metadata?.name ?? "");
      }
    }
  }
  const removed: string[] = [];
  for (const pod of pods) {
    const name = pod.metadata?.name ?? "";
    // Gone already with its claim or pool: removed all the same.
    await deletePod(cluster, name);
    removed.push(name);
  }
  const policies: string[] = [];
  if (options.all) {
    try {
      await cluster.networking.deleteNamespacedNetworkPolicy({
        name: POLICY_NAME,
        namespace: cluster.namespace,
      });
      policies.push(POLICY_NAME);
    } catch (error) {
      if (!isNotFound(error)) {
        throw clusterError(cluster, `delete NetworkPolicy "${POLICY_NAME}"`, error);
      }
    }
  }
  return { containers: removed, networks: policies, volumes: [] };
}
