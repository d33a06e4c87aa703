/**
 * The warm pool of mode kubernetes on a cluster with agent-sandbox (`sandbox.kubernetes.pool`),
 * through the real CLI against the tests' API server serving agent-sandbox's resources with its
 * controllers scripted after the upstream (tests/_kube_agent_sandbox.ts): the requests the tool
 * makes (template from our pod manifest, warm pool, one claim per run, deletions), the pod a run
 * gets (the warm one the claim bound), `down`; and the choice of pool: `auto` on a cluster with
 * and without it, `own` beside it, `agent-sandbox` without it refused in one line.
 */
import assert from "node:assert/strict";
import { FakeLlm, text } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";
import { RunFixture } from "../_run_fixture.ts";
import { LABELS } from "../../lib/sandbox/kubernetes/pod_spec.ts";

console.error("e2e: kubernetes agent-sandbox tests starting");

const KEY_ENV = "SANDBOX_KUBE_AS_E2E_KEY";
const EXT = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default";

async function kubeFixture(
  kube: KubeApiServer,
  llmUrl: string,
  pool: number,
  choice: string,
  extra = "",
) {
  const image = await ensureSandboxImage();
  const fixture = await RunFixture.make({
    prefix: "e2e-kas",
    llmUrl,
    keyEnv: KEY_ENV,
    prompt: "Say done.\n",
    sandboxYaml:
      `{mode: kubernetes, pool: ${pool}, kubernetes: {image: "${image}", pool: ${choice}${extra}}}`,
  });
  const kubeconfig = `${fixture.dir.path}/kubeconfig`;
  await kube.writeKubeconfig(kubeconfig);
  fixture.env.KUBECONFIG = kubeconfig;
  return { fixture, image };
}

function runArgs(fixture: RunFixture): string[] {
  return ["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile];
}

Deno.test({
  name:
    "with agent-sandbox, up writes a SandboxTemplate of the hardened pod and a SandboxWarmPool; a run claims a warm pod with a SandboxClaim and deletes the claim after; down removes them",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using kube = new KubeApiServer({ agentSandbox: true });
    await using llm = new FakeLlm([text("done")]);
    const { fixture, image } = await kubeFixture(kube, llm.baseUrl, 1, "auto");
    await using _fixture = fixture;
    const p = fixture.profile;
    const api = kube.agentSandbox;
    const posted = (plural: string) =>
      api.requests.filter((r) => r.method === "POST" && r.path === `${EXT}/${plural}`);

    await t.step(
      "up: the template is our pod manifest, its network left to our policy",
      async () => {
        const up = await fixture.cli(["up", "-p", p]);
        assert.equal(up.exitCode, 0, explain(up));
        const [template] = posted("sandboxtemplates").map((r) => r.body!);
        assert.ok(template, `a SandboxTemplate was created: ${JSON.stringify(api.requests)}`);
        assert.equal(template.kind, "SandboxTemplate");
        assert.equal(template.spec.networkPolicyManagement, "Unmanaged");
        const spec = template.spec.podTemplate.spec;
        assert.equal(spec.automountServiceAccountToken, false);
        assert.deepEqual(spec.containers.map((c: { image: string }) => c.image), [image, image]);
        assert.equal(spec.containers[0].securityContext.runAsUser, 10001);
        assert.equal(template.spec.podTemplate.metadata.labels[LABELS.owner], "sandbox");
        assert.equal(template.spec.podTemplate.metadata.labels[LABELS.state], undefined);
        const [pool] = posted("sandboxwarmpools").map((r) => r.body!);
        assert.deepEqual(pool.spec, {
          replicas: 1,
          sandboxTemplateRef: { name: template.metadata.name },
          updateStrategy: { type: "Recreate" },
        });
        assert.equal(kube.policies.has("sandbox-deny-all"), true);
        assert.equal([...kube.pods.values()].length, 1, "the controller started one warm pod");
      },
    );

    const warm = [...kube.pods.keys()][0];
    await t.step("a run claims that warm pod with one SandboxClaim, deleted after", async () => {
      const run = await fixture.cli(runArgs(fixture));
      assert.equal(run.exitCode, 0, explain(run));
      const claims = posted("sandboxclaims").map((r) => r.body!);
      assert.equal(claims.length, 1, JSON.stringify(api.requests));
      const [claim] = claims;
      assert.equal(claim.spec.warmPoolRef.name, posted("sandboxwarmpools")[0].body!.metadata.name);
      assert.equal(claim.spec.additionalPodMetadata.labels[LABELS.state], "claimed");
      assert.equal(claim.metadata.labels[LABELS.profile], p);
      const execs = kube.execs.length;
      assert.ok(execs > 0, "the run ran in a pod");
      assert.ok(
        api.requests.some((r) =>
          r.method === "DELETE" && r.path === `${EXT}/sandboxclaims/${claim.metadata.name}`
        ),
        "the claim was deleted after the run",
      );
      assert.equal(kube.pods.has(warm), false, "the claimed warm pod is gone");
      const created = kube.created.map((pod) => pod.metadata!.name);
      assert.ok(created.includes(warm), `the run's pod was the warm one: ${created}`);
    });

    await t.step(
      "down removes the claims, the warm pool, the template and their pods",
      async () => {
        const down = await fixture.cli(["down", "-p", p]);
        assert.equal(down.exitCode, 0, explain(down));
        for (const plural of ["sandboxtemplates", "sandboxwarmpools", "sandboxclaims"]) {
          assert.equal(api.of(plural).size, 0, `${plural} left: ${[...api.of(plural).keys()]}`);
        }
        assert.equal(kube.pods.size, 0, `pods left: ${[...kube.pods.keys()]}`);
      },
    );
  },
});

Deno.test({
  name:
    "pool auto on a cluster without agent-sandbox and pool own beside it use the tool's own pods; pool agent-sandbox without it exits 2 naming the key",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([]);
    await t.step("auto without agent-sandbox: own pods, no request to its groups", async () => {
      await using kube = new KubeApiServer();
      const { fixture } = await kubeFixture(kube, llm.baseUrl, 1, "auto");
      await using _fixture = fixture;
      const up = await fixture.cli(["up", "-p", fixture.profile]);
      assert.equal(up.exitCode, 0, explain(up));
      const pods = [...kube.pods.values()];
      assert.equal(pods.length, 1);
      assert.equal(pods[0].metadata!.labels![LABELS.state], "ready");
      assert.deepEqual(kube.agentSandbox.requests, []);
    });
    await t.step("own beside agent-sandbox: own pods, no request to its groups", async () => {
      await using kube = new KubeApiServer({ agentSandbox: true });
      const { fixture } = await kubeFixture(kube, llm.baseUrl, 1, "own");
      await using _fixture = fixture;
      const up = await fixture.cli(["up", "-p", fixture.profile]);
      assert.equal(up.exitCode, 0, explain(up));
      assert.equal([...kube.pods.values()][0].metadata!.labels![LABELS.state], "ready");
      assert.deepEqual(kube.agentSandbox.requests, []);
    });
    await t.step("agent-sandbox without it: exit 2, one line naming the key", async () => {
      await using kube = new KubeApiServer();
      const { fixture } = await kubeFixture(kube, llm.baseUrl, 1, "agent-sandbox");
      await using _fixture = fixture;
      const up = await fixture.cli(["up", "-p", fixture.profile]);
      assert.equal(up.exitCode, 2, explain(up));
      const first = up.stderr.split("\n").find((line) => line.startsWith("sandbox:")) ?? "";
      assert.match(first, /sandbox\.kubernetes\.pool is "agent-sandbox", but .* does not serve/);
      assert.doesNotMatch(up.stderr, /at .*\.ts:\d+/, "no stack trace");
      assert.equal(kube.pods.size, 0);
    });
  },
});

Deno.test({
  name:
    "a claim that is not bound to a ready Sandbox in time fails the run with the controller's reason, and the claim is deleted",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using kube = new KubeApiServer({ agentSandbox: true });
    kube.unschedulable = true;
    await using llm = new FakeLlm([]);
    const { fixture } = await kubeFixture(
      kube,
      llm.baseUrl,
      0,
      "agent-sandbox",
      ", start_timeout_s: 1",
    );
    await using _fixture = fixture;
    const run = await fixture.cli(runArgs(fixture));
    assert.equal(run.exitCode, 125, explain(run));
    assert.match(
      run.stderr,
      /SandboxClaim "[^"]+" is not bound to a ready Sandbox after 1 s: SandboxNotReady/,
    );
    const deleted = kube.agentSandbox.requests.filter((r) =>
      r.method === "DELETE" && r.path.startsWith(`${EXT}/sandboxclaims/`)
    );
    assert.equal(deleted.length, 1, JSON.stringify(kube.agentSandbox.requests));
    assert.equal(kube.agentSandbox.of("sandboxclaims").size, 0);
  },
});
