/**
 * The provider contract (_contract.ts) against the Kubernetes implementation (mode kubernetes),
 * driven by `@kubernetes/client-node` against the tests' own API server (tests/_kube_api.ts),
 * whose pods are real Docker containers; with `sandbox.pool: 1`, so that acquires claim pooled
 * pods. With KUBECONFIG_CONFORMANCE set, against that cluster instead (docs/kubernetes.md).
 */
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";
import { dockerTest, profileFrom, uniqueProfile } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { type ConformanceSubject, providerContract } from "./_contract.ts";

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

providerContract({
  name: "kubernetes",
  isolated: true,
  testOptions: dockerTest(),
  open: openKubernetes,
});
