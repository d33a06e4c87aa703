/**
 * `sandbox doctor` in sandbox mode kubernetes through the CLI, against the tests' own API server
 * (tests/_kube_api.ts: pods as real containers, the network plugin modelled): with a plugin that
 * enforces NetworkPolicy the pod network is HELD (the sandbox pod cannot connect to the API server's
 * service address on the Docker bridge's gateway, while a pod no policy selects can) and the command
 * exits 0; with a plugin that ignores policies (flannel alone) it is BROKEN, exit 3. The cluster's
 * facts are reported, and no pod of the doctor is left.
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, explain, runCli, tempDir, writeConfig } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";

console.error("security: doctor kubernetes tests starting");

interface Report {
  checks: { id: string; status: string; reason: string; evidence: string[] }[];
  broken: string[];
  kubernetes: {
    apiServerVersion: string | null;
    namespace: string;
    networkPlugins: string[];
    enforcesNetworkPolicy: boolean | null;
  };
}

async function doctor(kube: KubeApiServer) {
  const image = await ensureSandboxImage();
  await using dir = await tempDir("sandbox-kdoctor-");
  await kube.writeKubeconfig(`${dir.path}/kubeconfig`, "doctorns");
  const config = await writeConfig(
    dir.path,
    `profiles:\n  kdoc:\n    sandbox: {mode: kubernetes, kubernetes: {image: "${image}", namespace: doctorns}}\n`,
  );
  const result = await runCli(["doctor", "-p", "kdoc", "--json"], {
    config,
    env: { XDG_STATE_HOME: `${dir.path}/state`, KUBECONFIG: `${dir.path}/kubeconfig` },
  });
  let report: Report | undefined;
  try {
    report = JSON.parse(result.stdout);
  } catch {
    assert.fail(`doctor printed no JSON report\n${explain(result)}`);
  }
  const status = Object.fromEntries(report!.checks.map((c) => [c.id, c.status]));
  return { result, report: report!, status };
}

Deno.test({
  name:
    "doctor in mode kubernetes: the pod network and escalation HELD where the plugin enforces NetworkPolicy (exit 0), the cluster's facts reported, no pod left",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using kube = new KubeApiServer();
    const { result, report, status } = await doctor(kube);
    const context = `${explain(result)}\n${JSON.stringify(report.checks, null, 2)}`;
    assert.equal(result.exitCode, 0, context);
    assert.equal(status.pod_network, "held", context);
    assert.equal(status.escalation, "held", context);
    for (const id of ["key", "host_service", "survivor", "disk", "git_grant"]) {
      assert.equal(status[id], "not_applicable", `${id}: ${context}`);
    }
    assert.equal(report.kubernetes.apiServerVersion, "v1.31.0-kubefake");
    assert.equal(report.kubernetes.namespace, "doctorns");
    assert.deepEqual(report.kubernetes.networkPlugins, ["calico"]);
    assert.equal(report.kubernetes.enforcesNetworkPolicy, true);
    assert.deepEqual([...kube.pods.keys()], [], "the doctor's pods are deleted");
  },
});

Deno.test({
  name:
    "doctor in mode kubernetes: a network plugin that ignores NetworkPolicy (flannel) makes the pod network BROKEN, exit 3",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using kube = new KubeApiServer({
      enforcesPolicies: false,
      networkPlugin: "kube-flannel-ds",
    });
    const { result, report, status } = await doctor(kube);
    const context = `${explain(result)}\n${JSON.stringify(report.checks, null, 2)}`;
    assert.equal(result.exitCode, 3, context);
    assert.equal(status.pod_network, "broken", context);
    assert.deepEqual(report.broken, ["pod_network"], context);
    assert.equal(status.escalation, "held", context);
    assert.deepEqual(report.kubernetes.networkPlugins, ["flannel"]);
    assert.equal(report.kubernetes.enforcesNetworkPolicy, false);
    assert.match(result.stderr, /pod_network/, context);
    assert.deepEqual([...kube.pods.keys()], [], "the doctor's pods are deleted");
  },
});
