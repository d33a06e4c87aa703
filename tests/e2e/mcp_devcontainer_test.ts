/**
 * `sandbox mcp` with a profile in sandbox mode devcontainer: an environment is a container of the
 * repository's devcontainer image (built at the first open), its lifecycle commands run in the
 * checkout as for a run, and its work comes back as a branch on finish.
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, writeConfig } from "../_helpers.ts";
import { git, McpFixture } from "../_mcp_fixture.ts";
import { run } from "../../lib/process.ts";
import { SOURCE_LABEL } from "../../lib/sandbox/devcontainer/image.ts";

console.error("e2e: sandbox mcp mode devcontainer tests starting");

const MARK = crypto.randomUUID().slice(0, 8);

/** Remove the images built for `repo` (they carry its path as a label). */
async function removeImages(repo: string): Promise<void> {
  const listed = await run([
    "docker",
    "images",
    "--no-trunc",
    "--filter",
    `label=${SOURCE_LABEL}=${repo}`,
    "--format",
    "{{.ID}}",
  ]);
  for (const id of listed.stdout.split("\n").filter(Boolean)) {
    await run(["docker", "image", "rm", "--force", id]);
  }
}

Deno.test({
  name:
    "in mode devcontainer, an environment runs in the repository's devcontainer, its lifecycle commands run first, and its branch comes back on finish",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcpdc");
    try {
      await Deno.writeTextFile(
        `${fixture.repo}/.devcontainer.json`,
        `{ "image": "sandbox-base:bookworm", "containerEnv": { "DC_ONLY": "dc-${MARK}" },\n` +
          `  "postCreateCommand": "echo created > .lifecycle-marker" }\n`,
      );
      await git(fixture.repo, "add", "-A");
      await git(
        fixture.repo,
        "-c",
        "user.name=O",
        "-c",
        "user.email=o@e.test",
        "commit",
        "-qm",
        "dc",
      );
      fixture.config = await writeConfig(
        fixture.dir.path,
        `profiles:\n  ${fixture.profile}:\n` +
          `    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: UNUSED}}\n` +
          "    sandbox: {mode: devcontainer, pool: 0}\n",
      );
      await using mcp = await fixture.client();
      const opened = await mcp.ok("environment_open", {});
      const id: string = opened.environment_id;
      const ran = await mcp.ok("environment_run", {
        environment_id: id,
        command: 'echo "$DC_ONLY"; cat .lifecycle-marker; pwd',
      });
      assert.equal(ran.exit_code, 0, JSON.stringify(ran));
      assert.equal(ran.stdout, `dc-${MARK}\ncreated\n${opened.checkout}\n`);
      await mcp.ok("environment_write_file", {
        environment_id: id,
        path: "dc.txt",
        content: "dc\n",
      });
      const back = await mcp.ok("environment_finish", { environment_id: id });
      assert.equal(await git(fixture.repo, "show", `${back.branch}:dc.txt`), "dc");
      assert.equal(await git(fixture.repo, "status", "--porcelain"), "");
      assert.ok(await fixture.containerGone(opened.container), `${opened.container} remains`);
      assert.equal((await fixture.meta(id)).sandbox, "devcontainer");
    } finally {
      await removeImages(fixture.repo);
    }
  },
});
