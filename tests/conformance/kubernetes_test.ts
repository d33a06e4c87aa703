/**
 * The provider contract (_contract.ts) against the Kubernetes implementation (mode kubernetes),
 * driven by `@kubernetes/client-node` against the tests' own API server (tests/_kube_api.ts),
 * whose pods are real Docker containers; with `sandbox.pool: 1`, so that acquires claim pooled
 * pods. `deno task test:kubernetes` runs it against the cluster `$KUBECONFIG` names instead
 * (SANDBOX_TEST_REAL_CLUSTER=1; the pods' image from $SANDBOX_TEST_KUBE_IMAGE, the namespace from
 * $SANDBOX_TEST_KUBE_NAMESPACE; docs/kubernetes.md).
 */
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";
import { dockerTest, profileFrom, uniqueProfile } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { type ConformanceSubject, providerContract } from "./_contract.ts";
import { bridgeGateway, type Holds, PIDS_YAML } from "./_holds.ts";
import { isNotFound, openCluster } from "../../lib/sandbox/kubernetes/cluster.ts";

async function openKubernetes(pool: "own" | "agent-sandbox" = "own"): Promise<ConformanceSubject> {
  const image = await ensureSandboxImage();
  const server = new KubeApiServer({ agentSandbox: pool === "agent-sandbox" });
  const dir = await Deno.makeTempDir({ prefix: "sandbox-kube-" });
  await server.writeKubeconfig(`${dir}/kubeconfig`);
  const previous = Deno.env.get("KUBECONFIG");
  Deno.env.set("KUBECONFIG", `${dir}/kubeconfig`);
  const name = uniqueProfile("conformance");
  const profile = profileFrom(
    `profiles:\n  ${name}:\n    sandbox: {mode: kubernetes, pool: 1, ${PIDS_YAML}, ` +
      `kubernetes: {image: "${image}", pool: ${pool}}}\n`,
    name,
  );
  return {
    lifecycle: await sandboxLifecycle(profile),
    profile,
    // The test server's pods are containers on this engine: a pod with a network would have
    // Docker's bridge.
    hostAddress: bridgeGateway,
    scratch: () => Promise.resolve("/workspace"),
    writable: ["/workspace", "/tmp", "/home/sandbox", "/cache"],
    traces(pod) {
      const left = server.pods.has(pod) ? [`pod ${pod}`] : [];
      return Promise.resolve(left);
    },
    async [Symbol.asyncDispose]() {
      await server[Symbol.asyncDispose]();
      if (previous === undefined) Deno.env.delete("KUBECONFIG");
      else Deno.env.set("KUBECONFIG", previous);
      await Deno.remove(dir, { recursive: true });
    },
  };
}

/** The cluster `$KUBECONFIG` names: its pods are looked up through its API server. */
async function openRealCluster(): Promise<ConformanceSubject> {
  const image = Deno.env.get("SANDBOX_TEST_KUBE_IMAGE");
  if (!image) {
    throw new Error("Set SANDBOX_TEST_KUBE_IMAGE to an image reference the cluster pulls");
  }
  const namespace = Deno.env.get("SANDBOX_TEST_KUBE_NAMESPACE") ?? "default";
  const name = uniqueProfile("conformance");
  const profile = profileFrom(
    `profiles:\n  ${name}:\n    sandbox: {mode: kubernetes, pool: 1, ${PIDS_YAML}, ` +
      `kubernetes: {image: "${image}", namespace: ${namespace}, start_timeout_s: 600}}\n`,
    name,
  );
  const cluster = await openCluster(profile);
  const lifecycle = await sandboxLifecycle(profile);
  return {
    lifecycle,
    profile,
    hostAddress: machineAddress,
    scratch: () => Promise.resolve("/workspace"),
    writable: ["/workspace", "/tmp", "/home/sandbox", "/cache"],
    async traces(pod) {
      try {
        await cluster.core.readNamespacedPod({ name: pod, namespace });
        return [`pod ${pod}`];
      } catch (error) {
        if (isNotFound(error)) return [];
        throw error;
      }
    },
    async [Symbol.asyncDispose]() {
      // The pool's pods of this profile, left by the contract's fills.
      const { teardownCluster } = await import("../../lib/sandbox/kubernetes/manage.ts");
      await teardownCluster(profile);
    },
  };
}

const REAL = Deno.env.get("SANDBOX_TEST_REAL_CLUSTER") === "1";

/**
 * A pod spec has no pids limit (a node's kubelet sets one for all its pods: `podPidsLimit`), so
 * the profile's cannot hold; the test server's pods have none. The rest holds: the pod's deny-all
 * NetworkPolicy, the relay on an exec stream into the relay container, the key on the host. What
 * the test server shows of the network is that the lifecycle's policy selects the pod (its
 * modelled plugin then gives the pod no network); that a cluster's plugin enforces it, only a run
 * against that cluster shows (`SANDBOX_TEST_REAL_CLUSTER=1`).
 */
const HOLDS: Holds = {
  pidsLimit: { not: "a pod spec sets no pids limit (the kubelet's podPidsLimit is the node's)" },
  noNetwork: true,
  relay: true,
  keyAbsent: true,
};

/** An address of this machine other than loopback: what a pod of a cluster reaches it by. */
function machineAddress(): Promise<string> {
  const found = Deno.networkInterfaces().find((each) =>
    each.family === "IPv4" && !each.address.startsWith("127.")
  );
  if (!found) throw new Error("This machine has no IPv4 address but loopback");
  return Promise.resolve(found.address);
}

providerContract({
  name: REAL ? "kubernetes (the cluster $KUBECONFIG names)" : "kubernetes",
  isolated: true,
  holds: HOLDS,
  testOptions: REAL ? { ignore: false } : dockerTest(),
  open: REAL ? openRealCluster : openKubernetes,
});

// agent-sandbox's SandboxWarmPool and SandboxClaim, served by the test server with its
// controllers (tests/_kube_agent_sandbox.ts).
if (!REAL) {
  providerContract({
    name: "kubernetes with agent-sandbox",
    isolated: true,
    holds: HOLDS,
    testOptions: dockerTest(),
    open: () => openKubernetes("agent-sandbox"),
  });
}
