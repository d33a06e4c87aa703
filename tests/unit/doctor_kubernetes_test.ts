/**
 * `sandbox doctor` in mode kubernetes, judged from observations (lib/doctor/kubernetes.ts): the pod
 * network's verdict beside its twin, and the network plugin named from kube-system's workloads.
 */
import assert from "node:assert/strict";
import { judgePodNetwork, networkPluginOf } from "../../lib/doctor/kubernetes.ts";

const reach = (code: string, detail = "") => new Map([["reach", [[code, detail]]]]);

Deno.test("a sandbox pod that connected out is BROKEN, whatever its twin saw", () => {
  const check = judgePodNetwork("10.96.0.1:443", reach("0"), reach("0"));
  assert.equal(check.status, "broken");
  assert.match(check.reason, /10\.96\.0\.1:443/);
});

Deno.test("a refused connection is HELD when the unselected twin pod connected", () => {
  const check = judgePodNetwork("10.96.0.1:443", reach("1", "Network is unreachable"), reach("0"));
  assert.equal(check.status, "held");
  assert.match(check.evidence.join("\n"), /Network is unreachable/);
});

Deno.test("a refused connection proves nothing when the twin pod could not connect either", () => {
  const check = judgePodNetwork("10.96.0.1:443", reach("124"), reach("124"));
  assert.equal(check.status, "not_applicable");
});

Deno.test("without a service address in the pods, the pod network is NOT APPLICABLE", () => {
  assert.equal(judgePodNetwork("", new Map(), new Map()).status, "not_applicable");
});

Deno.test("the network plugin is named from kube-system's DaemonSets and pods", () => {
  assert.deepEqual(networkPluginOf(["calico-node", "kube-proxy"]), {
    networkPlugins: ["calico"],
    enforcesNetworkPolicy: true,
  });
  assert.deepEqual(networkPluginOf(["cilium", "cilium-operator-7d9f-abcde"]), {
    networkPlugins: ["cilium"],
    enforcesNetworkPolicy: true,
  });
});

Deno.test("flannel alone does not enforce NetworkPolicy; with calico (canal's pair) it is enforced", () => {
  assert.deepEqual(networkPluginOf(["kube-flannel-ds", "kube-proxy"]), {
    networkPlugins: ["flannel"],
    enforcesNetworkPolicy: false,
  });
  assert.equal(networkPluginOf(["kube-flannel-ds", "calico-node"]).enforcesNetworkPolicy, true);
});

Deno.test("an unrecognised plugin, or one whose policy support is an option, is unknown", () => {
  assert.deepEqual(networkPluginOf(["kube-proxy", "coredns-5d78c9869d-x2x4z"]), {
    networkPlugins: [],
    enforcesNetworkPolicy: null,
  });
  assert.deepEqual(networkPluginOf(["kindnet"]), {
    networkPlugins: ["kindnet"],
    enforcesNetworkPolicy: null,
  });
});
