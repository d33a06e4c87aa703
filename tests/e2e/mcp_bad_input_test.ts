/**
 * `sandbox mcp` given bad input: an unknown tool, arguments of the wrong types, an environment id
 * that is not open, a command that never ends (killed at its timeout with everything it started),
 * and a `--repo` that is not a repository. Each is an error the client (or the user) can read, and
 * the server goes on serving.
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, explain, tempDir, writeConfig } from "../_helpers.ts";
import { type McpClient, McpFixture } from "../_mcp_fixture.ts";
import { run } from "../../lib/process.ts";

console.error("e2e: sandbox mcp bad input tests starting");

/** A call the server must refuse: a protocol error, or a tool error; its words. */
async function refusal(mcp: McpClient, name: string, args: Record<string, unknown>) {
  try {
    const answer = await mcp.call(name, args);
    assert.ok(answer.isError, `${name} ${JSON.stringify(args)} was accepted: ${answer.text}`);
    return answer.text;
  } catch (error) {
    return (error as Error).message;
  }
}

Deno.test({
  name:
    "unknown tools, wrong argument types and unknown environments are refused; the server goes on",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcpbad");
    await using mcp = await fixture.client();
    assert.match(
      await refusal(mcp, "environment_teleport", {}),
      /environment_teleport.*not found/i,
    );
    assert.match(
      await refusal(mcp, "environment_run", { environment_id: "x", command: 42 }),
      /command/,
    );
    assert.match(
      await refusal(mcp, "environment_open", { base: ["main"] }),
      /base/,
    );
    assert.match(
      await refusal(mcp, "environment_read_file", { environment_id: "nope", path: "README.md" }),
      /No open environment "nope"/,
    );
    assert.match(
      await refusal(mcp, "environment_open", { base: "no-such-branch" }),
      /Base "no-such-branch" not found/,
    );
    assert.match(
      await refusal(mcp, "environment_open", { branch: "main" }),
      /Branch "main" already exists/,
    );
    // Nothing was started by the refused calls; a good call still works.
    assert.deepEqual(await fixture.containers(), []);
    const { environment_id: id } = await mcp.ok("environment_open", {});
    assert.match(
      await refusal(mcp, "environment_read_file", { environment_id: id, path: "src" }),
      /not a regular file|outside/,
    );
    const ran = await mcp.ok("environment_run", { environment_id: id, command: ["true"] });
    assert.equal(ran.exit_code, 0);
  },
});

Deno.test({
  name: "a command that never ends is killed at its timeout, with everything it started",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcptime");
    await using mcp = await fixture.client();
    const opened = await mcp.ok("environment_open", {});
    const ran = await mcp.ok("environment_run", {
      environment_id: opened.environment_id,
      command: "echo started; (sleep 987654 &); sleep 987655 & sleep 987656",
      timeout_seconds: 3,
    });
    assert.equal(ran.timed_out, true, JSON.stringify(ran));
    assert.equal(ran.exit_code, 124);
    assert.equal(ran.stdout, "started\n");
    const top = await run(["docker", "top", opened.container]);
    assert.equal(top.exitCode, 0, top.stderr);
    assert.match(top.stdout, /sandbox-exec --init/, "the listing shows the container's processes");
    assert.doesNotMatch(top.stdout, /98765[456]/, top.stdout);
    // The environment goes on.
    const after = await mcp.ok("environment_run", {
      environment_id: opened.environment_id,
      command: "echo still here",
    });
    assert.equal(after.stdout, "still here\n");
  },
});

Deno.test({
  name: "sandbox mcp --repo on a directory that is no repository exits 2 before serving",
  ...dockerTest(),
  async fn() {
    await using fixture = await McpFixture.open("mcprepo");
    await using plain = await tempDir("sandbox-mcp-plain-");
    const result = await fixture.cli(["mcp", "-p", fixture.profile, "--repo", plain.path]);
    assert.equal(result.exitCode, 2, explain(result));
    assert.equal(result.stdout, "");
    assert.match(
      result.stderr,
      /^sandbox: error: Not a git repository: ".*sandbox-mcp-plain-/,
      explain(result),
    );
  },
});

Deno.test({
  name: "sandbox mcp with a profile in sandbox mode none exits 2 before serving",
  ...dockerTest(),
  async fn() {
    await using fixture = await McpFixture.open("mcpnone");
    // Its twin: the same command on the fixture's profile (mode container) serves, until its
    // input (empty here) ends.
    const served = await fixture.cli(["mcp", "-p", fixture.profile, "--repo", fixture.repo]);
    assert.equal(served.exitCode, 0, explain(served));
    assert.match(served.stderr, /the MCP client disconnected/, explain(served));
    fixture.config = await writeConfig(
      fixture.dir.path,
      `profiles:\n  ${fixture.profile}:\n` +
        `    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: UNUSED}}\n` +
        "    sandbox: {mode: none}\n",
    );
    const result = await fixture.cli(["mcp", "-p", fixture.profile, "--repo", fixture.repo]);
    assert.equal(result.exitCode, 2, explain(result));
    assert.equal(result.stdout, "");
    assert.match(
      result.stderr,
      /^sandbox: error: Profile "[^"]+" has sandbox mode "none": MCP environments need a sandbox/,
      explain(result),
    );
  },
});
