/**
 * `sandbox doctor` in sandbox mode kubernetes: what the cluster gives (the API server's version,
 * the namespace, the network plugin and whether it enforces NetworkPolicy), and the attacks that
 * run in a throwaway pod of the profile, acquired as a run acquires its pod (lib/sandbox/provider.ts
 * seam, `KubernetesLifecycle`):
 * - the pod network: a TCP connection from the sandbox pod to the API server's service address
 *   (what the kubelet gives every pod) must fail, since the deny-all NetworkPolicy selects the pod;
 *   its twin is the same connection from a pod of the same spec that no policy selects.
 * - escalation: the same probe as in a container (lib/doctor/probes.ts).
 * The other rows are NOT APPLICABLE, saying why. Both pods are deleted whatever happens.
 */
import * as k8s from "@kubernetes/client-node";
import type { V1Pod } from "@kubernetes/client-node";
import type { Profile } from "../config.ts";
import { randomHex } from "../hash.ts";
import { type Cluster, clusterError } from "../sandbox/kubernetes/cluster.ts";
import { KubernetesLifecycle, podName } from "../sandbox/kubernetes/lifecycle.ts";
import { podManifest } from "../sandbox/kubernetes/pod_spec.ts";
import { waitRunning } from "../sandbox/kubernetes/pod_wait.ts";
import { deletePod, KubernetesSandboxProvider } from "../sandbox/kubernetes/provider.ts";
import type { RunSandbox } from "../sandbox/provider.ts";
import { ESCALATION_PROBE, parseProbe, POD_REACH_PROBE, PROBE_ENV } from "./probes.ts";
import {
  type DefenceCheck,
  type DefenceId,
  DEFENCES,
  judgeEscalation,
  judgeReach,
} from "./verdicts.ts";

/** What the cluster gives the sandbox pods: facts, not verdicts. */
export interface KubernetesFacts {
  /** The API server's `gitVersion`, or null when `/version` did not say. */
  apiServerVersion: string | null;
  server: string;
  namespace: string;
  /** The network plugins recognised in kube-system's DaemonSets and pods (none: unknown). */
  networkPlugins: string[];
  /** Whether the plugin(s) enforce NetworkPolicy; null when unknown. */
  enforcesNetworkPolicy: boolean | null;
}

/** Name pattern in kube-system → plugin, and whether it enforces NetworkPolicy (null: depends). */
const PLUGINS: [RegExp, string, boolean | null][] = [
  [/^calico/, "calico", true],
  [/^canal/, "canal", true],
  [/^cilium/, "cilium", true],
  [/^weave/, "weave", true],
  [/^antrea/, "antrea", true],
  [/^kube-router/, "kube-router", true],
  [/^kube-ovn/, "kube-ovn", true],
  [/flannel/, "flannel", false],
  // Policy support is an option of these (a separate agent or a flag): not known from names.
  [/^kindnet/, "kindnet", null],
  [/^aws-node/, "aws-vpc-cni", null],
];

/** The plugins `names` show, and whether NetworkPolicy is enforced (any enforcing one is enough). */
export function networkPluginOf(names: string[]): Pick<
  KubernetesFacts,
  "networkPlugins" | "enforcesNetworkPolicy"
> {
  const found = PLUGINS.filter(([pattern]) => names.some((name) => pattern.test(name)));
  const plugins = [...new Set(found.map(([, name]) => name))];
  const enforces = found.some(([, , e]) => e === true)
    ? true
    : found.length > 0 && found.every(([, , e]) => e === false)
    ? false
    : null;
  return { networkPlugins: plugins, enforcesNetworkPolicy: enforces };
}

/** The cluster's facts; what the API server refuses to say stays unknown. */
export async function kubernetesFacts(cluster: Cluster): Promise<KubernetesFacts> {
  const version = await cluster.config.makeApiClient(k8s.VersionApi).getCode()
    .then((info) => info.gitVersion ?? null, () => null);
  const names: string[] = [];
  const namespace = "kube-system";
  // Either list may be forbidden to the sandbox's role: then the plugin is unknown, as shown.
  await cluster.config.makeApiClient(k8s.AppsV1Api).listNamespacedDaemonSet({ namespace })
    .then((list) => names.push(...list.items.map((d) => d.metadata?.name ?? "")), () => {});
  await cluster.core.listNamespacedPod({ namespace })
    .then((list) => names.push(...list.items.map((p) => p.metadata?.name ?? "")), () => {});
  return {
    apiServerVersion: version,
    server: cluster.server,
    namespace: cluster.namespace,
    ...networkPluginOf(names),
  };
}

export interface KubernetesAttacked {
  facts: KubernetesFacts;
  image: string;
  checks: DefenceCheck[];
}

/** Attack a throwaway pod of `profile` (mode kubernetes); both pods gone before this returns. */
export async function attackPod(
  profile: Profile,
  options: { signal?: AbortSignal; progress: (line: string) => void },
): Promise<KubernetesAttacked> {
  const lifecycle = new KubernetesLifecycle({
    ...profile,
    sandbox: { ...profile.sandbox, pool: 0 },
  });
  // Opening the cluster puts the deny-all NetworkPolicy in place, as for a run.
  const cluster = await lifecycle.cluster();
  const facts = await kubernetesFacts(cluster);
  options.progress(`starting a throwaway pod of profile "${profile.name}"`);
  const run = await lifecycle.acquire({ runId: `doctor${randomHex(4)}`, signal: options.signal });
  let twin: string | undefined;
  try {
    const pod = await readPod(cluster, run.name);
    const image = pod.spec?.containers[0]?.image ?? "";
    twin = await startTwin(cluster, profile, image, options.signal);
    options.progress("attacking: the pod network, escalation");
    const checks = await attackRun(run, { cluster, profile: profile.name, twin }, options.signal);
    return { facts, image, checks };
  } finally {
    options.progress("deleting the throwaway pods");
    await Promise.all([run.release(), twin ? deletePod(cluster, twin) : undefined]);
  }
}

async function readPod(cluster: Cluster, name: string): Promise<V1Pod> {
  try {
    return await cluster.core.readNamespacedPod({ name, namespace: cluster.namespace });
  } catch (error) {
    throw clusterError(cluster, `read pod "${name}"`, error);
  }
}

/**
 * The twin pod: the sandbox pod's spec and image, labelled so that no sandbox NetworkPolicy selects
 * it (it has the network of any pod of the namespace). Running when this returns.
 */
async function startTwin(
  cluster: Cluster,
  profile: Profile,
  image: string,
  signal?: AbortSignal,
): Promise<string> {
  const name = podName(profile.name, `doctor-twin-${randomHex(4)}`);
  const body = podManifest(profile, { name, image, pool: "doctor-twin" });
  body.metadata!.labels = { "sandbox.dev/doctor-twin": "true" };
  try {
    await cluster.core.createNamespacedPod({ namespace: cluster.namespace, body });
  } catch (error) {
    throw clusterError(cluster, `create pod "${name}"`, error);
  }
  try {
    const timeoutMs = profile.sandbox.kubernetes.start_timeout_s * 1000;
    await waitRunning(cluster, name, { timeoutMs, signal });
  } catch (error) {
    await deletePod(cluster, name);
    throw error;
  }
  return name;
}

async function attackRun(
  run: RunSandbox,
  pods: { cluster: Cluster; profile: string; twin: string },
  signal?: AbortSignal,
): Promise<DefenceCheck[]> {
  const twinPod = new KubernetesSandboxProvider(pods.cluster, pods.profile, pods.twin);
  const twinOut = parseProbe(
    (await twinPod.exec(["bash", "-c", POD_REACH_PROBE], { signal, timeoutMs: 60_000 })).stdout,
  );
  const target = twinOut.get("target")?.[0]?.[0] ?? "";
  const [attack, escalation] = await Promise.all([
    run.provider.exec(["bash", "-c", POD_REACH_PROBE], {
      env: { [PROBE_ENV.target]: target },
      signal,
      timeoutMs: 60_000,
    }),
    run.provider.exec(["bash", "-c", ESCALATION_PROBE], { signal, timeoutMs: 60_000 }),
  ]);
  return [
    ...notApplicable(),
    judgePodNetwork(target, parseProbe(attack.stdout), twinOut),
    judgeEscalationOf(parseProbe(escalation.stdout)),
  ];
}

/** The pod network: the connection refused, while the unselected twin's got through. */
export function judgePodNetwork(
  target: string,
  attack: Map<string, string[][]>,
  twin: Map<string, string[][]>,
): DefenceCheck {
  if (!target) {
    return {
      id: "pod_network",
      defence: DEFENCES.pod_network,
      status: "not_applicable",
      reason: "no API server service address (KUBERNETES_SERVICE_HOST) in the pods to connect to",
      evidence: [],
    };
  }
  const [code, detail] = attack.get("reach")?.[0] ?? ["?", "no answer"];
  const [twinCode, twinDetail] = twin.get("reach")?.[0] ?? ["?", "no answer"];
  return judgeReach("pod_network", {
    reached: code === "0" ? [`${target} (the API server's service address)`] : [],
    refused: code === "0" ? [] : [`${target}: exit ${code} ${(detail ?? "").trim()}`.trim()],
    twinReached: twinCode === "0",
    twinDetail: `a pod of the same spec that no NetworkPolicy selects, to ${target}: ${
      twinCode === "0" ? "connected" : `exit ${twinCode} ${(twinDetail ?? "").trim()}`
    }`,
  });
}

function judgeEscalationOf(probe: Map<string, string[][]>): DefenceCheck {
  const field = (name: string) => probe.get(name)?.[0] ?? [];
  const unshare = field("unshare");
  return judgeEscalation({
    statusRead: probe.has("CapEff"),
    capEff: field("CapEff")[0] ?? "?",
    capPrm: field("CapPrm")[0] ?? "?",
    noNewPrivs: field("NoNewPrivs")[0] === "1",
    setuidFiles: (probe.get("setuid") ?? []).map((f) => f[0]),
    unshare: unshare[0] === "missing" ? "missing" : unshare[0] === "0" ? "succeeded" : "refused",
    unshareDetail: unshare[1] ?? unshare[0] ?? "",
  });
}

/** Why each row the pod attacks do not cover says NOT APPLICABLE in mode kubernetes. */
const NOT_RUN: [DefenceId, string][] = [
  [
    "key",
    "not run in mode kubernetes: the doctor opens no session (relay, credential proxy) for its pod",
  ],
  [
    "host_service",
    "the doctor's listeners are on this host, which a cluster's pod need not reach: the pod network row attacks the pod's way out instead",
  ],
  ["egress_allowlist", "not run in mode kubernetes: the doctor opens no egress proxy for its pod"],
  ["address_guard", "not run in mode kubernetes: the doctor opens no egress proxy for its pod"],
  ["survivor", "not run in mode kubernetes: the pod's end is the cluster's (pod deletion)"],
  ["disk", "not run in mode kubernetes: the kubelet's eviction is not exercised by the doctor"],
  ["git_grant", "no git remote: the git proxy serves only runs on a remote repository"],
];

function notApplicable(): DefenceCheck[] {
  return NOT_RUN.map(([id, reason]) => ({
    id,
    defence: DEFENCES[id],
    status: "not_applicable",
    reason,
    evidence: [],
  }));
}
