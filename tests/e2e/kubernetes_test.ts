/**
 * Mode kubernetes as a user meets it, through the real CLI against the tests' own Kubernetes API
 * server (tests/_kube_api.ts, pods as real Docker containers): `up`, `status -p`, `down` and
 * `teardown --all -p` by label on the cluster; and each failure a person can act on (no
 * kubeconfig, an unreachable API server, forbidden with the Role, a pod stuck pending with the
 * reason from its events, an image the cluster cannot pull, a quota exceeded), each answered so by
 * the API server, beside a run that succeeds against the same server.
 */
import assert from "node:assert/strict";
import { FakeLlm, text } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";
import { RunFixture } from "../_run_fixture.ts";
import { LABELS } from "../../lib/sandbox/kubernetes/pod_spec.ts";

console.error("e2e: kubernetes tests starting");

const KEY_ENV = "SANDBOX_KUBE_E2E_KEY";

/** A fixture whose profile is in mode kubernetes against `kube`, with `kubernetes` added to its block. */
async function kubeFixture(
  kube: KubeApiServer,
  llmUrl: string,
  options: { pool?: number; kubernetes?: string; image?: string } = {},
) {
  const image = options.image ?? await ensureSandboxImage();
  const fixture = await RunFixture.make({
    prefix: "e2e-kube",
    llmUrl,
    keyEnv: KEY_ENV,
    prompt: "Say done.\n",
    sandboxYaml: `{mode: kubernetes, pool: ${options.pool ?? 0}, ` +
      `kubernetes: {image: "${image}"${options.kubernetes ? `, ${options.kubernetes}` : ""}}}`,
  });
  const kubeconfig = `${fixture.dir.path}/kubeconfig`;
  await kube.writeKubeconfig(kubeconfig);
  fixture.env.KUBECONFIG = kubeconfig;
  return fixture;
}

function runArgs(fixture: RunFixture): string[] {
  return ["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile];
}

Deno.test({
  name:
    "up fills the profile's pool on the cluster, status -p lists its pods, down removes them by label, teardown --all -p removes every owned pod and the NetworkPolicy",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using kube = new KubeApiServer();
    await using llm = new FakeLlm([]);
    await using fixture = await kubeFixture(kube, llm.baseUrl, { pool: 1 });
    const p = fixture.profile;

    await t.step("up: one ready pod of the profile, and the deny-all policy", async () => {
      const up = await fixture.cli(["up", "-p", p]);
      assert.equal(up.exitCode, 0, explain(up));
      const pods = [...kube.pods.values()];
      assert.equal(pods.length, 1, explain(up));
      assert.equal(pods[0].metadata?.labels?.[LABELS.state], "ready");
      assert.match(up.stdout, new RegExp(`sandbox ${pods[0].metadata?.name} is ready`));
      assert.deepEqual([...kube.policies.keys()], ["sandbox-deny-all"]);
    });

    await t.step("status -p: the pod, running, as the pool's", async () => {
      const status = await fixture.cli(["status", "-p", p, "--json"]);
      assert.equal(status.exitCode, 0, explain(status));
      const listed = JSON.parse(status.stdout);
      assert.deepEqual(
        listed.map((s: Record<string, string>) => [s.profile, s.state, s.kind]),
        [[p, "running", "pool"]],
      );
    });

    // A pod of another profile in the same namespace: down leaves it, teardown --all does not.
    const other = structuredClone([...kube.pods.values()][0]);
    other.metadata!.name = "sandbox-someone-else";
    other.metadata!.labels![LABELS.profile] = "someone-else";
    kube.pods.set(other.metadata!.name, other);

    await t.step("down: the profile's pods go, another profile's stay", async () => {
      const down = await fixture.cli(["down", "-p", p]);
      assert.equal(down.exitCode, 0, explain(down));
      assert.match(down.stdout, /^removed sandbox-/, explain(down));
      assert.deepEqual([...kube.pods.keys()], ["sandbox-someone-else"]);
      const again = await fixture.cli(["down", "-p", p]);
      assert.match(again.stdout, new RegExp(`no sandbox for profile ${p}`), explain(again));
    });

    await t.step("teardown --all -p: every owned pod and the NetworkPolicy go", async () => {
      const teardown = await fixture.cli(["teardown", "--all", "-p", p]);
      assert.equal(teardown.exitCode, 0, explain(teardown));
      assert.match(teardown.stdout, /removed containers: sandbox-someone-else/, explain(teardown));
      assert.match(teardown.stdout, /removed networks: sandbox-deny-all/, explain(teardown));
      assert.equal(kube.pods.size, 0);
      assert.equal(kube.policies.size, 0);
    });
  },
});

Deno.test({
  name: "a run fails with an error a person can act on when the cluster answers so",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using kube = new KubeApiServer();
    await using llm = new FakeLlm([]);

    await t.step("positive twin: the same run against the same server succeeds", async () => {
      llm.script.push(text("done"));
      await using fixture = await kubeFixture(kube, llm.baseUrl);
      const result = await fixture.cli(runArgs(fixture));
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(result.stdout, /done/, explain(result));
    });

    await t.step("no kubeconfig: exit 2, naming the file and what to set", async () => {
      await using fixture = await kubeFixture(kube, llm.baseUrl);
      const missing = `${fixture.dir.path}/no-such-kubeconfig`;
      const result = await fixture.cli(runArgs(fixture), { KUBECONFIG: missing });
      assert.equal(result.exitCode, 2, explain(result));
      assert.match(result.stderr, new RegExp(`^sandbox: error: No kubeconfig: .*${missing}`, "m"));
      assert.match(result.stderr, /Set KUBECONFIG/);
      assert.doesNotMatch(result.stderr, /^\s+at /m, "no stack trace");
    });

    await t.step("an unreachable API server: exit 125, naming it", async () => {
      await using fixture = await kubeFixture(kube, llm.baseUrl);
      const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      const port = closed.addr.port;
      closed.close();
      const config = await Deno.readTextFile(fixture.env.KUBECONFIG);
      await Deno.writeTextFile(
        fixture.env.KUBECONFIG,
        config.replace(kube.url, `http://127.0.0.1:${port}`),
      );
      const result = await fixture.cli(runArgs(fixture));
      assert.equal(result.exitCode, 125, explain(result));
      assert.match(
        result.stderr,
        new RegExp(
          `^sandbox: error: Cannot reach the Kubernetes API server http://127\\.0\\.0\\.1:${port}`,
          "m",
        ),
      );
      assert.match(result.stderr, /Check that the cluster runs/);
    });

    await t.step("forbidden: the refusal, and the Role to grant", async () => {
      await using fixture = await kubeFixture(kube, llm.baseUrl);
      kube.refuse(
        "POST",
        /\/pods$/,
        403,
        "Forbidden",
        'pods is forbidden: User "fake" cannot create resource "pods" in API group "" in the namespace "default"',
      );
      try {
        const result = await fixture.cli(runArgs(fixture));
        assert.equal(result.exitCode, 125, explain(result));
        assert.match(
          result.stderr,
          /^sandbox: error: Kubernetes refused to create pod .* forbidden/m,
        );
        assert.match(result.stderr, /kind: Role/, explain(result));
        assert.match(result.stderr, /resources: \["pods\/exec"\]/, explain(result));
      } finally {
        kube.allow();
      }
    });

    await t.step("quota exceeded: said as a quota, with what to do", async () => {
      await using fixture = await kubeFixture(kube, llm.baseUrl);
      kube.refuse(
        "POST",
        /\/pods$/,
        403,
        "Forbidden",
        'pods "x" is forbidden: exceeded quota: sandbox-quota, requested: limits.memory=4Gi, used: limits.memory=8Gi, limited: limits.memory=8Gi',
      );
      try {
        const result = await fixture.cli(runArgs(fixture));
        assert.equal(result.exitCode, 125, explain(result));
        assert.match(
          result.stderr,
          /a ResourceQuota is exhausted: .*exceeded quota: sandbox-quota/,
        );
        assert.match(result.stderr, /ask for a bigger quota/);
        assert.doesNotMatch(result.stderr, /kind: Role/, "a quota is no RBAC problem");
      } finally {
        kube.allow();
      }
    });

    await t.step("an image the cluster cannot pull: said so, with how to push it", async () => {
      await using fixture = await kubeFixture(kube, llm.baseUrl, {
        image: "sandbox-kube-test/missing:nope",
      });
      const result = await fixture.cli(runArgs(fixture));
      assert.equal(result.exitCode, 125, explain(result));
      assert.match(result.stderr, /cannot pull the image of pod .*ErrImagePull/, explain(result));
      assert.match(result.stderr, /sandbox image push --registry/);
      assert.equal(kube.pods.size, 0, "the pod that could not run is removed");
    });

    await t.step("a pod stuck pending: the reason from its events", async () => {
      await using fixture = await kubeFixture(kube, llm.baseUrl, {
        kubernetes: "start_timeout_s: 1",
      });
      kube.unschedulable = true;
      try {
        const result = await fixture.cli(runArgs(fixture));
        assert.equal(result.exitCode, 125, explain(result));
        assert.match(
          result.stderr,
          /is still pending after 1 s: FailedScheduling: 0\/3 nodes are available: 3 Insufficient memory/,
          explain(result),
        );
        assert.equal(kube.pods.size, 0, "the pending pod is removed");
      } finally {
        kube.unschedulable = false;
      }
    });
  },
});
