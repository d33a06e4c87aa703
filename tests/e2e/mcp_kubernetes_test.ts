/**
 * `sandbox mcp` with a profile in sandbox mode kubernetes, against the tests' own Kubernetes API
 * server (tests/_kube_api.ts, pods as real Docker containers): an environment is a run's pod,
 * acquired as a run's is, its session's relay on the pod's exec stream; its work comes back as a
 * branch on finish and the pod is deleted.
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, writeConfig } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";
import { git, McpFixture } from "../_mcp_fixture.ts";

console.error("e2e: sandbox mcp mode kubernetes tests starting");

Deno.test({
  name:
    "in mode kubernetes, an MCP client opens an environment in a pod, works in it, and its branch comes back on finish",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const image = await ensureSandboxImage();
    await using kube = new KubeApiServer();
    await using fixture = await McpFixture.open("mcpkube");
    fixture.config = await writeConfig(
      fixture.dir.path,
      `profiles:\n  ${fixture.profile}:\n` +
        `    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: UNUSED}}\n` +
        `    sandbox: {mode: kubernetes, pool: 0, kubernetes: {image: "${image}"}}\n`,
    );
    await kube.writeKubeconfig(`${fixture.dir.path}/kubeconfig`);
    fixture.env.KUBECONFIG = `${fixture.dir.path}/kubeconfig`;
    const head = await git(fixture.repo, "rev-parse", "HEAD");
    await using mcp = await fixture.client();

    const opened = await mcp.ok("environment_open", {});
    const id: string = opened.environment_id;
    assert.deepEqual([...kube.pods.keys()], [opened.container], "the environment is one pod");
    const ran = await mcp.ok("environment_run", {
      environment_id: id,
      command: "pwd; cat README.md",
    });
    assert.equal(ran.exit_code, 0, JSON.stringify(ran));
    assert.equal(ran.stdout, `${opened.checkout}\n# demo\n`);
    await mcp.ok("environment_write_file", {
      environment_id: id,
      path: "pod.txt",
      content: "written in a pod\n",
    });

    const back = await mcp.ok("environment_finish", { environment_id: id });
    assert.equal(back.branch, `sandbox/${id}`);
    assert.equal(await git(fixture.repo, "show", `${back.branch}:pod.txt`), "written in a pod");
    assert.equal(await git(fixture.repo, "rev-parse", `${back.branch}~1`), head);
    assert.equal(await git(fixture.repo, "status", "--porcelain"), "");
    assert.deepEqual([...kube.pods.keys()], [], "the pod was deleted");
    const meta = await fixture.meta(id);
    assert.equal(meta.status, "succeeded");
    assert.equal(meta.sandbox, "kubernetes");
  },
});
