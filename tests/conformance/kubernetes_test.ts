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
import { isNotFound, openCluster } from "../../lib/sandbox/kubernetes/cluster.ts";

console.error("conformance: kubernetes provider tests starting");

async function openKubernetes(): Promise<ConformanceSubject> {
  const image = await ensureSandboxImage();
  const server = new KubeApiServer();
  const dir = await Deno.makeTempDir({ prefix: "sandbox-kube-" });
  await server.writeKubeconfig(`${dir}/kubeconfig`);
  const previous = Deno.env.get("KUBECONFIG");
  Deno.env.set("KUBECONFIG", `${dir}/kubeconfig`);
  const name = uniqueProfile("conformance");
  const profile = profileFrom(
    `profiles:\n  ${name}:\n    sandbox: {mode: kubernetes, pool: 1, kubernetes: {image: "${image}"}}\n`,
    name,
  );
  return {
    lifecycle: await sandboxLifecycle(profile),
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
    `profiles:\n  ${name}:\n    sandbox: {mode: kubernetes, pool: 1, ` +
      `kubernetes: {image: "${image}", namespace: ${namespace}, start_timeout_s: 600}}\n`,
    name,
  );
  const cluster = await openCluster(profile);
  const lifecycle = await sandboxLifecycle(profile);
  return {
    lifecycle,
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

providerContract({
  name: REAL ? "kubernetes (the cluster $KUBECONFIG names)" : "kubernetes",
  isolated: true,
  testOptions: REAL ? { ignore: false } : dockerTest(),
  open: REAL ? openRealCluster : openKubernetes,
});
