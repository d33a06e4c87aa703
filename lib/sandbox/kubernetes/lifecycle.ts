/**
 * The Kubernetes implementation of the seam's lifecycle and relay transport (provider.ts):
 * a virgin pod per run, claimed from a small pool of ready pods the tool keeps itself (by label),
 * or created for the run; removed when the run ends. Before any pod, the namespace's
 * NetworkPolicy denying sandbox pods all traffic is created, or checked when it exists.
 *
 * A claim is one update of the pod's labels carrying the `resourceVersion` it was read at: the API
 * server accepts only the first of two claimers (the other gets 409 Conflict and tries the next
 * pod), so a pooled pod serves exactly one run.
 */
import type { V1Pod } from "@kubernetes/client-node";
import type { Profile } from "../../config.ts";
import { SandboxError } from "../../errors.ts";
import { readLines } from "../../lines.ts";
import { relayArgv, type RelayProcess, spawnRelayProcess } from "../../proxy/relay_host.ts";
import { CACHE_REPO } from "../../repo/cache_layout.ts";
import { HAS_BASE, REFS_END, UPDATE } from "../../repo/cache.ts";
import { type LocalRepo, sendBase } from "../../repo/local.ts";
import { ensureImage, IMAGE_REPOSITORY, imageTagFor } from "../image.ts";
import { DockerCli } from "../docker.ts";
import { AGENT_CLIS, type AgentCliName } from "../../agents/packages.ts";
import { agentImageTagFor, ensureAgentImage } from "../../agents/agent_image.ts";
import type {
  RunSandbox,
  SandboxKind,
  SandboxLifecycle,
  SandboxRelayTransport,
  SandboxRequest,
  Terminal,
} from "../provider.ts";
import { type Cluster, clusterError, isConflict, isNotFound, openCluster } from "./cluster.ts";
import {
  CLAIMED_BY,
  deniesAll,
  hardeningMismatch,
  LABELS,
  networkPolicyManifest,
  OWNER,
  podManifest,
  POLICY_NAME,
  RELAY_CONTAINER,
} from "./pod_spec.ts";
import { deletePod, KubernetesSandboxProvider } from "./provider.ts";
import {
  CLAIM_UID_LABEL,
  claimManifest,
  claimPod,
  deleteObject,
  ensureObject,
  listObjects,
  PLURALS,
  poolStrategy,
  relabelClaim,
  templateManifest,
  waitWarm,
  warmPoolManifest,
} from "./agent_sandbox.ts";
import { waitRunning } from "./pod_wait.ts";

/** How often a run's pod is looked at for an eviction (the kubelet's disk limit). */
const EVICTION_POLL_MS = 5_000;

/** The relay of one pod: in its relay container (uid 10002), on an exec stream. */
export class KubernetesRelayTransport implements SandboxRelayTransport {
  constructor(readonly provider: KubernetesSandboxProvider) {}

  get sandboxName(): string {
    return this.provider.podName;
  }

  launchRelay(relayArgs: readonly string[], runId?: string | null): RelayProcess {
    const id = runId ? `relay-${runId}-${crypto.randomUUID()}` : `relay-${crypto.randomUUID()}`;
    return spawnRelayProcess(relayArgv(relayArgs), {
      kill: () => this.provider.stopExec(id, RELAY_CONTAINER),
      spawn: (argv, options) =>
        this.provider.spawn(argv, { container: RELAY_CONTAINER, id, stdin: options.stdin }),
    });
  }

  /** No detached relays: every session's relay runs on its own exec stream. */
  startDetachedRelay(): Promise<{ exec?: string } | undefined> {
    return Promise.resolve(undefined);
  }

  stopRelay(id: string): Promise<void> {
    return this.provider.stopExec(id, RELAY_CONTAINER);
  }

  /** A pod shares no directory with this machine: the relay always uses the stream. */
  socketMount(): Promise<{ host: string; sandbox: string } | undefined> {
    return Promise.resolve(undefined);
  }
}

/** One run's pod (with `claim`: the SandboxClaim that bound it, agent-sandbox's). */
class KubernetesRunSandbox implements RunSandbox {
  readonly relay: KubernetesRelayTransport;
  constructor(
    readonly provider: KubernetesSandboxProvider,
    readonly fromPool: boolean,
    readonly claim?: string,
  ) {
    this.relay = new KubernetesRelayTransport(provider);
  }

  get name(): string {
    return this.provider.podName;
  }

  /** No worker waits in a pod: the run starts its own. */
  attachWorker() {
    return Promise.resolve(undefined);
  }

  /** The kubelet enforces the workspace's size limit by evicting the pod: a run sees that here. */
  watchDisk(options: { onAbort?: (reason: SandboxError) => void }) {
    const { cluster, podName } = this.provider;
    const timer = setInterval(async () => {
      const pod = await cluster.core.readNamespacedPod({
        name: podName,
        namespace: cluster.namespace,
      }).catch(() => undefined);
      // A read that fails (the API server busy) says nothing: the next poll looks again.
      if (pod?.status?.phase !== "Failed") return;
      clearInterval(timer);
      options.onAbort?.(
        new SandboxError(
          "disk_limit",
          `Pod "${podName}" was stopped by the cluster: ${pod.status.reason ?? "failed"}: ${
            pod.status.message ?? ""
          }`.trimEnd(),
        ),
      );
    }, EVICTION_POLL_MS);
    return { close: () => Promise.resolve(clearInterval(timer)) };
  }

  /**
   * The pod's own object cache (an emptyDir at /cache): the base commit arrives as a pack over an
   * exec stream. No cache is shared between pods, so each run's pod receives its base in full.
   */
  async updateCache(repo: LocalRepo, signal?: AbortSignal): Promise<number> {
    const input = new TransformStream<Uint8Array, Uint8Array>();
    const child = this.provider.spawn(
      ["sh", "-c", UPDATE, "sh", repo.base, REFS_END, HAS_BASE, CACHE_REPO],
      { stdin: input.readable, signal },
    );
    const sent = await sendBase(readLines(child.stdout, 4096), input.writable, repo, {
      refsEnd: REFS_END,
      hasBase: HAS_BASE,
      signal,
    });
    const outcome = await child.finished;
    if (outcome.exitCode !== 0) {
      throw new SandboxError("exec_failed", `Cannot send the base commit into pod "${this.name}"`, {
        detail: outcome.stderrTail,
      });
    }
    return sent;
  }

  /** The claim goes (its Sandbox with it) and the pod at once, not when the collector gets to it. */
  startTerminal(): Promise<Terminal> {
    return Promise.reject(
      new SandboxError(
        "unsupported",
        'Sandbox mode "kubernetes" has no terminals: a shell needs mode "container"',
      ),
    );
  }

  /** A pod the cluster stopped says so through `watchDisk`'s poll; nothing more is told here. */
  stoppedFromOutside(): Promise<string | undefined> {
    return Promise.resolve(undefined);
  }

  async release(): Promise<void> {
    if (this.claim) await deleteObject(this.provider.cluster, PLURALS.claim, this.claim);
    await deletePod(this.provider.cluster, this.name);
  }

  /** Kept: relabelled, so that no pool claims it and no reap removes it (`sandbox down` does). */
  async keep(): Promise<void> {
    if (this.claim) return await relabelClaim(this.provider.cluster, this.claim, "kept");
    await relabel(this.provider.cluster, this.name, "kept");
  }
}

/** A pod name (DNS-1123) of `profile`'s with `suffix`. */
export function podName(profile: string, suffix: string): string {
  const slug = (text: string) => text.toLowerCase().replace(/[^a-z0-9-]+/g, "-");
  const tail = slug(suffix).replace(/^-+|-+$/g, "").slice(0, 24) || "x";
  const head = slug(profile).replace(/^-+|-+$/g, "").slice(0, 63 - 9 - tail.length - 1);
  return `sandbox-${head}-${tail}`.replace(/-{2,}/g, "-");
}

/** Set pod `name`'s state label, with its resourceVersion: false when another update won. */
async function relabel(
  cluster: Cluster,
  name: string,
  state: string,
  read?: V1Pod,
  claimedBy?: string,
): Promise<boolean> {
  try {
    const pod = read ?? await cluster.core.readNamespacedPod({
      name,
      namespace: cluster.namespace,
    });
    pod.metadata!.labels = { ...pod.metadata!.labels, [LABELS.state]: state };
    if (claimedBy) {
      pod.metadata!.annotations = { ...pod.metadata!.annotations, [CLAIMED_BY]: claimedBy };
    }
    await cluster.core.replaceNamespacedPod({ name, namespace: cluster.namespace, body: pod });
    return true;
  } catch (error) {
    if (isConflict(error) || isNotFound(error)) return false;
    throw clusterError(cluster, `claim pod "${name}"`, error);
  }
}

/** Who claims a pod: this process, so that a reap can tell a claim whose run is gone. */
function claimant(): string {
  return `${Deno.hostname()}:${Deno.pid}`;
}

/** Sandbox pods for runs of one profile (mode kubernetes). */
export class KubernetesLifecycle implements SandboxLifecycle {
  readonly isolated = true;
  #cluster: Promise<Cluster> | undefined;
  #strategy: Promise<"agent-sandbox" | "own"> | undefined;

  constructor(readonly profile: Profile) {}

  /** The cluster, opened once, with the deny-all policy in place. */
  cluster(): Promise<Cluster> {
    this.#cluster ??= (async () => {
      const cluster = await openCluster(this.profile);
      await ensureNetworkPolicy(cluster);
      return cluster;
    })();
    return this.#cluster;
  }

  /** Whose warm pool: agent-sandbox's or the tool's own (`sandbox.kubernetes.pool`), found once. */
  strategy(): Promise<"agent-sandbox" | "own"> {
    this.#strategy ??= this.cluster().then((cluster) => poolStrategy(cluster, this.profile));
    return this.#strategy;
  }

  /** The image of pool `pool`'s pods: the sandbox image, or an agent CLI's layer on it. */
  async #image(pool: string): Promise<string> {
    const agent = AGENT_CLIS.find((name) => name === pool);
    if (agent) return await this.#agentImage(agent);
    return this.profile.sandbox.kubernetes.image ?? await imageTagFor(this.profile.sandbox.image);
  }

  /**
   * Agent CLI `agent`'s layer: pushed beside `kubernetes.image` by `sandbox image push`
   * (`REG/sandbox-agent:<agent>-<hash>` of `REG/sandbox-runtime:<hash>`), or without
   * `kubernetes.image` the local one, built here when missing (a cluster on this machine's Docker).
   */
  async #agentImage(agent: AgentCliName): Promise<string> {
    const pushed = this.profile.sandbox.kubernetes.image;
    if (pushed) {
      const m = new RegExp(`^(.+)/${IMAGE_REPOSITORY}:([^/:@]+)$`).exec(pushed);
      if (!m) {
        throw new SandboxError(
          "config_invalid",
          `--agent ${agent} in mode kubernetes needs profiles.${this.profile.name}.sandbox.kubernetes.image as sandbox image push names it (REG/${IMAGE_REPOSITORY}:TAG), not "${pushed}"`,
          { detail: `Push the images: sandbox image push -p ${this.profile.name} --registry REG` },
        );
      }
      return `${m[1]}/${await agentImageTagFor(`${IMAGE_REPOSITORY}:${m[2]}`, agent)}`;
    }
    const docker = new DockerCli();
    const base = await ensureImage(docker, this.profile.sandbox.image);
    return (await ensureAgentImage(docker, base.tag, agent)).tag;
  }

  #poolKey(kind: SandboxKind): string {
    return kind.agent ?? "worker";
  }

  #selector(state: string, pool?: string): string {
    return [
      `${LABELS.owner}=${OWNER}`,
      `${LABELS.profile}=${this.profile.name}`,
      ...(state ? [`${LABELS.state}=${state}`] : []),
      ...(pool ? [`${LABELS.pool}=${pool}`] : []),
    ].join(",");
  }

  async #list(cluster: Cluster, selector: string): Promise<V1Pod[]> {
    try {
      const list = await cluster.core.listNamespacedPod({
        namespace: cluster.namespace,
        labelSelector: selector,
      });
      return list.items;
    } catch (error) {
      throw clusterError(cluster, "list pods", error);
    }
  }

  async #create(cluster: Cluster, name: string, state: "ready" | "claimed", pool: string) {
    const body = podManifest(this.profile, {
      name,
      image: await this.#image(pool),
      state,
      pool,
      claimedBy: state === "claimed" ? claimant() : undefined,
    });
    try {
      await cluster.core.createNamespacedPod({ namespace: cluster.namespace, body });
    } catch (error) {
      throw clusterError(cluster, `create pod "${name}"`, error);
    }
  }

  async acquire(request: SandboxRequest): Promise<RunSandbox> {
    const cluster = await this.cluster();
    const pool = this.#poolKey(request);
    if (await this.strategy() === "agent-sandbox") {
      return await this.#claimAgentSandbox(cluster, request, pool);
    }
    const timeoutMs = this.profile.sandbox.kubernetes.start_timeout_s * 1000;
    if (this.profile.sandbox.pool > 0) {
      for (const pod of await this.#list(cluster, this.#selector("ready", pool))) {
        if (pod.status?.phase !== "Running") continue;
        const name = pod.metadata!.name!;
        if (!await relabel(cluster, name, "claimed", pod, claimant())) continue;
        const provider = new KubernetesSandboxProvider(cluster, this.profile.name, name);
        return new KubernetesRunSandbox(provider, true);
      }
    }
    const name = podName(this.profile.name, request.runId);
    await this.#create(cluster, name, "claimed", pool);
    try {
      await waitRunning(cluster, name, { timeoutMs, signal: request.signal });
    } catch (error) {
      // A pod that cannot run is removed; the error says why it could not.
      await deletePod(cluster, name).catch(() => false);
      throw error;
    }
    const provider = new KubernetesSandboxProvider(cluster, this.profile.name, name);
    return new KubernetesRunSandbox(provider, false);
  }

  /** The SandboxTemplate and SandboxWarmPool of `pool`, as this process would create them. */
  async #ensureWarmPool(cluster: Cluster, pool: string): Promise<string> {
    const name = podName(this.profile.name, pool);
    const pod = podManifest(this.profile, { name, image: await this.#image(pool), pool });
    await ensureObject(
      cluster,
      PLURALS.template,
      templateManifest(name, this.profile.name, pool, pod),
    );
    await ensureObject(
      cluster,
      PLURALS.warmPool,
      warmPoolManifest(name, this.profile.name, pool, this.profile.sandbox.pool),
    );
    return name;
  }

  /**
   * A SandboxClaim on the profile's warm pool; the pod it binds is checked against our manifest
   * before the run uses it (whoever can edit the template chooses what the controller starts).
   */
  async #claimAgentSandbox(cluster: Cluster, request: SandboxRequest, pool: string) {
    const warmPool = await this.#ensureWarmPool(cluster, pool);
    const timeoutMs = this.profile.sandbox.kubernetes.start_timeout_s * 1000;
    const claim = podName(this.profile.name, request.runId);
    const { pod: name, warm } = await claimPod(
      cluster,
      claimManifest(claim, { profile: this.profile.name, pool, warmPool, claimedBy: claimant() }),
      { timeoutMs, signal: request.signal },
    );
    try {
      const pod = await cluster.core.readNamespacedPod({ name, namespace: cluster.namespace })
        .catch((error) => {
          throw clusterError(cluster, `read pod "${name}"`, error);
        });
      const expected = podManifest(this.profile, { name, image: await this.#image(pool), pool });
      const mismatch = hardeningMismatch(pod, expected);
      if (mismatch) {
        throw new SandboxError(
          "defence_broken",
          `Pod "${name}" bound by SandboxClaim "${claim}" is not the sandbox's hardened pod: ${mismatch}`,
          {
            detail: `SandboxTemplate "${warmPool}" was changed in the cluster; ` +
              `sandbox up -p ${this.profile.name} writes it back`,
          },
        );
      }
      await waitRunning(cluster, name, { timeoutMs, signal: request.signal });
    } catch (error) {
      await deleteObject(cluster, PLURALS.claim, claim).catch(() => false);
      await deletePod(cluster, name).catch(() => false);
      throw error;
    }
    const provider = new KubernetesSandboxProvider(cluster, this.profile.name, name);
    return new KubernetesRunSandbox(provider, warm, claim);
  }

  async fill(kind: SandboxKind & { wait?: boolean }): Promise<string[]> {
    const cluster = await this.cluster();
    const pool = this.#poolKey(kind);
    if (await this.strategy() === "agent-sandbox") {
      const name = await this.#ensureWarmPool(cluster, pool);
      if (kind.wait) {
        const timeoutMs = this.profile.sandbox.kubernetes.start_timeout_s * 1000;
        await waitWarm(cluster, name, this.profile.sandbox.pool, {
          timeoutMs,
          signal: kind.signal,
        });
      }
      // The controller names the Sandboxes it starts: none are this process's to report.
      return [];
    }
    const have = (await this.#list(cluster, this.#selector("ready", pool)))
      .filter((pod) => pod.status?.phase !== "Failed" && !pod.metadata?.deletionTimestamp);
    const names: string[] = [];
    for (let count = have.length; count < this.profile.sandbox.pool; count++) {
      const name = podName(this.profile.name, crypto.randomUUID().slice(0, 8));
      await this.#create(cluster, name, "ready", pool);
      names.push(name);
    }
    if (kind.wait) {
      const timeoutMs = this.profile.sandbox.kubernetes.start_timeout_s * 1000;
      const waiting = [...have.map((pod) => pod.metadata!.name!), ...names];
      await Promise.all(
        waiting.map((name) => waitRunning(cluster, name, { timeoutMs, signal: kind.signal })),
      );
    }
    return names;
  }

  async ready(kind: SandboxKind): Promise<string[]> {
    const cluster = await this.cluster();
    const pool = this.#poolKey(kind);
    // agent-sandbox's warm pods carry the template's labels: no state, no claim.
    const pods = await this.strategy() === "agent-sandbox"
      ? (await this.#list(cluster, this.#selector("", pool))).filter((pod) =>
        !pod.metadata?.labels?.[LABELS.state] && !pod.metadata?.labels?.[CLAIM_UID_LABEL]
      )
      : await this.#list(cluster, this.#selector("ready", pool));
    return pods.filter((pod) => pod.status?.phase === "Running").map((pod) => pod.metadata!.name!);
  }

  /** Claimed pods (or claims) of this machine whose claiming process is gone. */
  async reapOrphans(): Promise<string[]> {
    const cluster = await this.cluster();
    const host = `${Deno.hostname()}:`;
    const reaped: string[] = [];
    if (await this.strategy() === "agent-sandbox") {
      for (const claim of await listObjects(cluster, PLURALS.claim, this.#selector("claimed"))) {
        const by = claim.metadata?.annotations?.[CLAIMED_BY] ?? "";
        if (!by.startsWith(host) || processAlive(Number(by.slice(host.length)))) continue;
        const name = claim.metadata!.name!;
        if (await deleteObject(cluster, PLURALS.claim, name)) reaped.push(name);
      }
      return reaped;
    }
    for (const pod of await this.#list(cluster, this.#selector("claimed"))) {
      const by = pod.metadata?.annotations?.[CLAIMED_BY] ?? "";
      if (!by.startsWith(host) || processAlive(Number(by.slice(host.length)))) continue;
      if (await deletePod(cluster, pod.metadata!.name!)) reaped.push(pod.metadata!.name!);
    }
    return reaped;
  }
}

function processAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    Deno.statSync(`/proc/${pid}`);
    return true;
  } catch {
    // No such process (or no /proc): treated as gone only when the entry is missing.
    return false;
  }
}

/** Create the deny-all NetworkPolicy, or check the one there: a weaker one stops everything. */
export async function ensureNetworkPolicy(cluster: Cluster): Promise<void> {
  const namespace = cluster.namespace;
  try {
    const found = await cluster.networking.readNamespacedNetworkPolicy({
      name: POLICY_NAME,
      namespace,
    });
    if (deniesAll(found)) return;
    throw new SandboxError(
      "cluster_failed",
      `NetworkPolicy "${POLICY_NAME}" in namespace "${namespace}" does not deny sandbox pods all traffic`,
      {
        detail: `Delete it (kubectl -n ${namespace} delete networkpolicy ${POLICY_NAME}): ` +
          "sandbox then creates the right one",
      },
    );
  } catch (error) {
    if (!isNotFound(error)) {
      throw clusterError(cluster, `read NetworkPolicy "${POLICY_NAME}"`, error);
    }
  }
  try {
    await cluster.networking.createNamespacedNetworkPolicy({
      namespace,
      body: networkPolicyManifest(),
    });
  } catch (error) {
    // Created meanwhile by another process: checked on the next open.
    if (!isConflict(error)) {
      throw clusterError(cluster, `create NetworkPolicy "${POLICY_NAME}"`, error);
    }
  }
}
