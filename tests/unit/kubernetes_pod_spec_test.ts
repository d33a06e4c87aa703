/**
 * The sandbox pod and the NetworkPolicy as the tool writes them (lib/sandbox/kubernetes/pod_spec.ts):
 * every hardening field of the Docker provider, in Kubernetes' terms, asserted one by one; and the
 * check of an existing NetworkPolicy against the tests' own API server (no pods, so no Docker).
 */
import assert from "node:assert/strict";
import type { V1NetworkPolicy } from "@kubernetes/client-node";
import {
  deniesAll,
  networkPolicyManifest,
  podManifest,
  POLICY_NAME,
  RELAY_CONTAINER,
  SANDBOX_CONTAINER,
} from "../../lib/sandbox/kubernetes/pod_spec.ts";
import { ensureNetworkPolicy } from "../../lib/sandbox/kubernetes/lifecycle.ts";
import { openCluster } from "../../lib/sandbox/kubernetes/cluster.ts";
import type { SandboxError } from "../../lib/errors.ts";
import { RELAY_UID, SANDBOX_UID } from "../../lib/sandbox/users.ts";
import { profileFrom, tempDir, withEnv } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";

const PROFILE = profileFrom(
  "profiles:\n  k:\n    sandbox: {mode: kubernetes, resources: {memory: 1g, cpus: 1, disk: 2g}, " +
    "kubernetes: {runtime_class_name: gvisor}}\n",
  "k",
);

const pod = podManifest(PROFILE, {
  name: "sandbox-k-x",
  image: "img:1",
  state: "claimed",
  pool: "w",
});
const spec = pod.spec!;

Deno.test("the sandbox pod shares nothing of its node: no host namespaces, no token, no service links", () => {
  assert.equal(spec.automountServiceAccountToken, false);
  assert.equal(spec.enableServiceLinks, false);
  assert.equal(spec.hostNetwork, false);
  assert.equal(spec.hostPID, false);
  assert.equal(spec.hostIPC, false);
  assert.equal(spec.shareProcessNamespace, false);
  assert.equal(spec.restartPolicy, "Never");
  assert.equal(spec.runtimeClassName, "gvisor");
  assert.equal(spec.securityContext?.runAsNonRoot, true);
  assert.equal(spec.securityContext?.seccompProfile?.type, "RuntimeDefault");
});

Deno.test("each pod container runs hardened as its own non-root uid", async (t) => {
  for (const [name, uid] of [[SANDBOX_CONTAINER, SANDBOX_UID], [RELAY_CONTAINER, RELAY_UID]]) {
    await t.step(
      `${name}: uid ${uid}, no escalation, no capability, read-only root, seccomp`,
      () => {
        const container = spec.containers.find((c) => c.name === name);
        assert.ok(container, `container ${name}`);
        const security = container.securityContext!;
        assert.equal(security.runAsUser, uid);
        assert.equal(security.runAsGroup, uid);
        assert.equal(security.runAsNonRoot, true);
        assert.equal(security.allowPrivilegeEscalation, false);
        assert.equal(security.privileged, false);
        assert.equal(security.readOnlyRootFilesystem, true);
        assert.deepEqual(security.capabilities, { drop: ["ALL"] });
        assert.deepEqual(security.seccompProfile, { type: "RuntimeDefault" });
        assert.ok(container.resources?.limits?.memory, "a memory limit");
        assert.ok(container.resources?.limits?.cpu, "a CPU limit");
      },
    );
  }
  assert.equal(spec.containers.length, 2, "no other container");
});

Deno.test("the sandbox container's limits are the profile's; its workspace an emptyDir of the disk size", () => {
  const sandbox = spec.containers.find((c) => c.name === SANDBOX_CONTAINER)!;
  assert.deepEqual(sandbox.resources?.limits, { memory: String(1024 ** 3), cpu: "1" });
  assert.deepEqual(sandbox.resources?.requests, sandbox.resources?.limits);
  const volumes = Object.fromEntries((spec.volumes ?? []).map((v) => [v.name, v]));
  assert.equal(volumes.workspace.emptyDir?.sizeLimit, String(2 * 1024 ** 3));
  for (const volume of spec.volumes ?? []) {
    assert.ok(volume.emptyDir?.sizeLimit, `${volume.name} is an emptyDir with a size limit`);
    assert.deepEqual(Object.keys(volume).sort(), ["emptyDir", "name"], "no host path, no secret");
  }
});

Deno.test("the NetworkPolicy the tool writes denies sandbox pods all ingress and egress", () => {
  const policy = networkPolicyManifest();
  assert.deepEqual(policy.spec?.policyTypes, ["Ingress", "Egress"]);
  assert.deepEqual(policy.spec?.ingress, []);
  assert.deepEqual(policy.spec?.egress, []);
  assert.equal(deniesAll(policy), true);
  const labels = pod.metadata?.labels ?? {};
  for (const [key, value] of Object.entries(policy.spec?.podSelector?.matchLabels ?? {})) {
    assert.equal(labels[key], value, "the policy selects the pod");
  }
});

/** The written policy with one change. */
function weakened(change: (policy: V1NetworkPolicy) => void): V1NetworkPolicy {
  const policy = networkPolicyManifest();
  change(policy);
  return policy;
}

Deno.test("a policy that lets anything through, or selects other pods, is no deny-all", () => {
  assert.equal(deniesAll(weakened((p) => p.spec!.egress = [{}])), false, "egress to all");
  assert.equal(deniesAll(weakened((p) => p.spec!.ingress = [{}])), false, "ingress from all");
  assert.equal(deniesAll(weakened((p) => p.spec!.policyTypes = ["Ingress"])), false, "no Egress");
  assert.equal(deniesAll(weakened((p) => p.spec!.policyTypes = ["Egress"])), false, "no Ingress");
  assert.equal(
    deniesAll(weakened((p) => p.spec!.podSelector = { matchLabels: { app: "other" } })),
    false,
    "other pods",
  );
});

Deno.test("a run refuses a namespace whose sandbox NetworkPolicy is weaker; the tool's own passes", async () => {
  await using kube = new KubeApiServer();
  await using dir = await tempDir();
  await kube.writeKubeconfig(`${dir.path}/kubeconfig`);
  await withEnv({ KUBECONFIG: `${dir.path}/kubeconfig` }, async () => {
    const cluster = await openCluster(PROFILE);
    // The twin: created when missing, then accepted as it is.
    await ensureNetworkPolicy(cluster);
    assert.equal(deniesAll(kube.policies.get(POLICY_NAME)!), true);
    await ensureNetworkPolicy(cluster);
    // Someone opened it up: every run stops until it is fixed.
    kube.policies.get(POLICY_NAME)!.spec!.egress = [{}];
    await assert.rejects(
      () => ensureNetworkPolicy(cluster),
      (error: SandboxError) =>
        error.code === "cluster_failed" &&
        /does not deny sandbox pods all traffic/.test(error.message),
    );
  });
});
