/**
 * Waiting for a pod to run, and saying why it does not: an image the cluster cannot pull fails at
 * once; a pod still pending at the deadline fails with the reasons its events give (no node fits,
 * a quota, a volume).
 */
import type { CoreV1Event, V1Pod } from "@kubernetes/client-node";
import { SandboxError } from "../../errors.ts";
import { type Cluster, clusterError, isNotFound } from "./cluster.ts";

const POLL_MS = 250;
/** Waiting reasons that mean the image will not come without someone's help. */
const IMAGE_FAILURES = new Set([
  "ErrImagePull",
  "ImagePullBackOff",
  "InvalidImageName",
  "ErrImageNeverPull",
]);

/** The latest warning events of pod `name`, one line each (oldest first). */
export async function podWarnings(cluster: Cluster, name: string): Promise<string[]> {
  let events: CoreV1Event[] = [];
  try {
    events = (await cluster.core.listNamespacedEvent({
      namespace: cluster.namespace,
      fieldSelector: `involvedObject.name=${name}`,
    })).items;
  } catch {
    // Events explain a failure that is raised either way: without them the message is shorter.
    return [];
  }
  return events.filter((event) => event.type === "Warning").slice(-5)
    .map((event) => `${event.reason ?? "Warning"}: ${event.message ?? ""}`.trimEnd());
}

function imageFailure(pod: V1Pod): string | undefined {
  for (const status of pod.status?.containerStatuses ?? []) {
    const waiting = status.state?.waiting;
    if (waiting?.reason && IMAGE_FAILURES.has(waiting.reason)) {
      return `${waiting.reason}: ${waiting.message ?? status.image}`;
    }
  }
  return undefined;
}

/** Wait until pod `name` runs with every container started; raise why it cannot. */
export async function waitRunning(
  cluster: Cluster,
  name: string,
  options: { timeoutMs: number; signal?: AbortSignal },
): Promise<void> {
  const deadline = Date.now() + options.timeoutMs;
  for (;;) {
    if (options.signal?.aborted) throw new SandboxError("interrupted", "Interrupted");
    let pod: V1Pod;
    try {
      pod = await cluster.core.readNamespacedPod({ name, namespace: cluster.namespace });
    } catch (error) {
      if (isNotFound(error)) {
        throw new SandboxError("cluster_failed", `Pod "${name}" disappeared while starting`);
      }
      throw clusterError(cluster, `read pod "${name}"`, error);
    }
    const phase = pod.status?.phase;
    const started = (pod.status?.containerStatuses ?? []).every((each) => each.state?.running);
    if (phase === "Running" && started) return;
    const image = imageFailure(pod);
    if (image) {
      throw new SandboxError(
        "cluster_failed",
        `The cluster cannot pull the image of pod "${name}": ${image}`,
        {
          detail: "Push the image where the cluster can pull it (sandbox image push --registry " +
            "REG) and set sandbox.kubernetes.image to that reference",
        },
      );
    }
    if (phase === "Failed" || phase === "Succeeded") {
      throw new SandboxError("cluster_failed", `Pod "${name}" ended before it ran: ${phase}`, {
        detail: (await podWarnings(cluster, name)).join("\n") || pod.status?.message,
      });
    }
    if (Date.now() > deadline) {
      const why = await podWarnings(cluster, name);
      throw new SandboxError(
        "cluster_failed",
        `Pod "${name}" is still pending after ${Math.round(options.timeoutMs / 1000)} s${
          why.length ? `: ${why.at(-1)}` : ""
        }`,
        { detail: why.join("\n") || "No events explain it: see kubectl describe pod" },
      );
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}
