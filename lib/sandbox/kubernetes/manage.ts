/**
 * `sandbox status`, `down` and `teardown --all` on a cluster (mode kubernetes): everything the
 * tool made there carries its owner label (pod_spec.ts LABELS), and is found and removed by it.
 */
import type { Profile } from "../../config.ts";
import type { SandboxStatus, TeardownReport } from "../provider.ts";
import { type Cluster, clusterError, isNotFound, openCluster } from "./cluster.ts";
import { LABELS, OWNER, POLICY_NAME } from "./pod_spec.ts";
import { deletePod, podStatus } from "./provider.ts";

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
  const removed: string[] = [];
  for (const pod of await ownedPods(cluster, options.all ? undefined : profile.name)) {
    const name = pod.metadata?.name ?? "";
    if (await deletePod(cluster, name)) removed.push(name);
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
