/**
 * Mode kubernetes with agent-sandbox's warm pool: the pod a SandboxClaim binds is built by a
 * controller from a SandboxTemplate anyone with edit rights in the namespace can change, so the
 * tool checks that pod against its own manifest before a run uses it, and writes the template so
 * that the pods' network is left to the `sandbox-deny-all` policy alone. Against the tests' API
 * server with agent-sandbox's controllers scripted (tests/_kube_agent_sandbox.ts), pods as real
 * Docker containers.
 */
import assert from "node:assert/strict";
import { SandboxError } from "../../lib/errors.ts";
import { openCluster } from "../../lib/sandbox/kubernetes/cluster.ts";
import { podManifest } from "../../lib/sandbox/kubernetes/pod_spec.ts";
import { KubernetesSandboxProvider } from "../../lib/sandbox/kubernetes/provider.ts";
import { waitRunning } from "../../lib/sandbox/kubernetes/pod_wait.ts";
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { assertDocker, dockerTest, profileFrom, tempDir, uniqueProfile } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";

console.error("security: kubernetes agent-sandbox tests starting");

async function setup(kube: KubeApiServer, dir: string, pool: number) {
  const image = await ensureSandboxImage();
  await kube.writeKubeconfig(`${dir}/kubeconfig`);
  Deno.env.set("KUBECONFIG", `${dir}/kubeconfig`);
  const name = uniqueProfile("sec-kas");
  const profile = profileFrom(
    `profiles:\n  ${name}:\n    sandbox: {mode: kubernetes, pool: ${pool}, ` +
      `kubernetes: {image: "${image}", pool: agent-sandbox, start_timeout_s: 120}}\n`,
    name,
  );
  return { profile, image, lifecycle: await sandboxLifecycle(profile) };
}

Deno.test({
  name:
    "a pod a SandboxClaim binds from a template changed in the cluster (root, privileged) is refused and its claim deleted; the template as written gives a pod of uid 10001",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const previous = Deno.env.get("KUBECONFIG");
    try {
      await using kube = new KubeApiServer({ agentSandbox: true });
      await using dir = await tempDir("sandbox-kas-sec-");
      const { lifecycle } = await setup(kube, dir.path, 0);
      const api = kube.agentSandbox;

      await t.step("twin: the template as written: the run's pod runs as 10001", async () => {
        const sandbox = await lifecycle.acquire({
          runId: `twin${crypto.randomUUID().slice(0, 6)}`,
        });
        try {
          const id = await sandbox.provider.exec(["id", "-u"]);
          assert.equal(id.stdout.trim(), "10001");
        } finally {
          await sandbox.release();
        }
      });

      await t.step(
        "attack: the template made root and privileged as the claim is made",
        async () => {
          api.onRequest = (method, path) => {
            if (method !== "POST" || !path.endsWith("/sandboxclaims")) return;
            for (const template of api.of("sandboxtemplates").values()) {
              const box = template.spec.podTemplate.spec.containers[0].securityContext;
              Object.assign(box, { runAsUser: 0, runAsNonRoot: false, privileged: true });
              delete box.capabilities;
            }
          };
          const error = await lifecycle.acquire({ runId: `atk${crypto.randomUUID().slice(0, 6)}` })
            .then(() => undefined, (e) => e);
          assert.ok(error instanceof SandboxError, `refused: ${error}`);
          assert.equal(error.code, "defence_broken");
          assert.match(error.message, /is not the sandbox's hardened pod: its container "sandbox"/);
          assert.equal(api.of("sandboxclaims").size, 0, "the claim was deleted");
          const root = [...kube.pods.values()].filter((pod) =>
            pod.spec?.containers[0].securityContext?.runAsUser === 0
          );
          assert.deepEqual(root, [], "the root pod was deleted");
          assert.ok(
            kube.created.some((pod) => pod.spec?.containers[0].securityContext?.runAsUser === 0),
            "the controller did start a root pod from the changed template",
          );
        },
      );
    } finally {
      if (previous === undefined) Deno.env.delete("KUBECONFIG");
      else Deno.env.set("KUBECONFIG", previous);
    }
  },
});

Deno.test({
  name:
    "a pod claimed from agent-sandbox's warm pool has no network interface but loopback (its template leaves the network to sandbox-deny-all); a pod the policy does not select has one",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const previous = Deno.env.get("KUBECONFIG");
    try {
      await using kube = new KubeApiServer({ agentSandbox: true });
      await using dir = await tempDir("sandbox-kas-net-");
      const { lifecycle, profile, image } = await setup(kube, dir.path, 1);
      await lifecycle.fill({ wait: true });
      const interfaces = async (provider: { exec: KubernetesSandboxProvider["exec"] }) =>
        (await provider.exec(["ls", "/sys/class/net"])).stdout.split(/\s+/).filter(Boolean);

      await t.step("attack: the claimed warm pod lists only lo", async () => {
        const sandbox = await lifecycle.acquire({ runId: `net${crypto.randomUUID().slice(0, 6)}` });
        try {
          assert.equal(sandbox.fromPool, true);
          assert.deepEqual(await interfaces(sandbox.provider), ["lo"]);
        } finally {
          await sandbox.release();
        }
      });

      await t.step(
        "twin: the same probe in a pod no deny-all policy selects sees eth0",
        async () => {
          const cluster = await openCluster(profile);
          const pod = podManifest(profile, { name: "kas-open", image, pool: "probe" });
          pod.metadata!.labels = { probe: "open" };
          await cluster.core.createNamespacedPod({ namespace: "default", body: pod });
          await waitRunning(cluster, "kas-open", { timeoutMs: 120_000 });
          const provider = new KubernetesSandboxProvider(cluster, profile.name, "kas-open");
          assert.ok((await interfaces(provider)).includes("eth0"));
          await provider.teardown();
        },
      );
    } finally {
      if (previous === undefined) Deno.env.delete("KUBECONFIG");
      else Deno.env.set("KUBECONFIG", previous);
    }
  },
});
