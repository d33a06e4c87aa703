/**
 * `sandbox mcp`'s security rules, attacked with a real server (the CLI) and real sandboxes:
 * - a command in an environment cannot read a host file nor reach a host service on loopback
 *   (twins: the same read and request from the host succeed);
 * - the file tools work only inside the checkout: `..`, absolute paths and symlinks made inside
 *   the checkout that point out of it are refused (twins: the same tools inside succeed);
 * - a client that vanishes mid-command, or a server that is stopped, leaves none of its
 *   sandboxes behind.
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, tempDir } from "../_helpers.ts";
import { McpFixture, RawMcpServer } from "../_mcp_fixture.ts";
import { run } from "../../lib/process.ts";

console.error("security: sandbox mcp tests starting");

Deno.test({
  name: "an environment's command cannot read a host file or reach a host service; the host can",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcpiso");
    await using secretDir = await tempDir("sandbox-mcp-secret-");
    const secretFile = `${secretDir.path}/secret.txt`;
    await Deno.writeTextFile(secretFile, "host-only-secret\n");
    await Deno.chmod(secretDir.path, 0o755);
    await Deno.chmod(secretFile, 0o644);
    await using service = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      () => new Response("host-service-answer"),
    );
    const url = `http://127.0.0.1:${service.addr.port}/`;
    // Twins: the host reads the file and reaches the service.
    assert.equal(await Deno.readTextFile(secretFile), "host-only-secret\n");
    assert.equal(await (await fetch(url)).text(), "host-service-answer");

    await using mcp = await fixture.client();
    const { environment_id: id } = await mcp.ok("environment_open", {});
    const read = await mcp.ok("environment_run", {
      environment_id: id,
      command: `cat ${secretFile}; cat ${fixture.repo}/README.md`,
    });
    assert.notEqual(read.exit_code, 0);
    assert.doesNotMatch(read.stdout, /host-only-secret|# demo/);
    assert.match(read.stderr, /No such file or directory/);
    // Positive twin inside: the same command on the sandbox's own files works.
    const own = await mcp.ok("environment_run", { environment_id: id, command: "cat README.md" });
    assert.equal(own.stdout, "# demo\n");

    // Directly, then through the egress proxy the sandbox is given: neither reaches it.
    const reach = await mcp.ok("environment_run", {
      environment_id: id,
      command: `curl -sS --max-time 20 --noproxy '*' ${url}; echo "direct=$?"; ` +
        `curl -sS --max-time 20 --noproxy '' -x "$HTTP_PROXY" ${url}; echo "proxied=$?"`,
    });
    assert.doesNotMatch(reach.stdout, /host-service-answer/, JSON.stringify(reach));
    assert.match(reach.stdout, /direct=[1-9]/);
    assert.match(reach.stdout, /egress proxy: "127\.0\.0\.1:\d+" is not allowed/);
    const log = await mcp.ok("environment_egress_log", { environment_id: id });
    assert.ok(
      log.entries.some((entry: { decision: string; port: number }) =>
        entry.decision === "deny" && entry.port === service.addr.port
      ),
      JSON.stringify(log),
    );
    await mcp.ok("environment_discard", { environment_id: id });
  },
});

Deno.test({
  name: "file tools refuse paths outside the checkout, symlinks made inside included",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcppath");
    await using mcp = await fixture.client();
    const { environment_id: id, checkout } = await mcp.ok("environment_open", {});
    await mcp.ok("environment_run", {
      environment_id: id,
      command:
        "ln -s /etc out && ln -s /etc/passwd passwd-link && mkdir d && ln -s ../README.md d/readme",
    });
    const refused = async (tool: string, args: Record<string, unknown>) => {
      const answer = await mcp.call(tool, { environment_id: id, ...args });
      assert.ok(answer.isError, `${tool} ${JSON.stringify(args)} was allowed: ${answer.text}`);
      assert.match(answer.text, /outside the checkout/, answer.text);
      assert.doesNotMatch(answer.text, /root:x:0/);
    };
    await refused("environment_read_file", { path: "../../../etc/passwd" });
    await refused("environment_read_file", { path: "/etc/passwd" });
    await refused("environment_read_file", { path: "out/passwd" });
    await refused("environment_read_file", { path: "passwd-link" });
    await refused("environment_write_file", { path: "out/evil", content: "x" });
    await refused("environment_write_file", { path: "passwd-link", content: "x" });
    await refused("environment_list_files", { path: "out" });
    await refused("environment_search", { pattern: "root", path: "out" });
    await refused("environment_run", { command: "true", cwd: "out" });
    await refused("environment_run", { command: "true", cwd: "/" });
    // Twins: the same tools on paths that stay inside (through a symlink that does) work.
    const readme = await mcp.call("environment_read_file", {
      environment_id: id,
      path: "d/readme",
    });
    assert.equal(readme.text, "# demo\n");
    const absolute = await mcp.call("environment_read_file", {
      environment_id: id,
      path: `${checkout}/README.md`,
    });
    assert.equal(absolute.text, "# demo\n");
    await mcp.ok("environment_write_file", { environment_id: id, path: "d/new", content: "y" });
    await mcp.ok("environment_run", { environment_id: id, command: "true", cwd: "d" });
    // The refused writes wrote nothing anywhere.
    const etc = await mcp.ok("environment_run", {
      environment_id: id,
      command: "ls /etc/evil 2>&1; head -c 5 /etc/passwd",
    });
    assert.match(etc.stdout, /No such file/);
    assert.equal(etc.stdout.trim().endsWith("root:"), true, etc.stdout);
  },
});

/** Open an environment on a raw server, start a command that never ends, and wait until it runs. */
async function midCommand(fixture: McpFixture, server: RawMcpServer) {
  await server.initialize();
  const opened = await server.tool("environment_open", {});
  const marker = `${crypto.randomUUID().slice(0, 8)}`;
  // Sent, never answered: the command does not end.
  await server.request("tools/call", {
    name: "environment_run",
    arguments: { environment_id: opened.environment_id, command: `sleep 86400; echo ${marker}` },
  });
  for (let i = 0; i < 600; i++) {
    const top = await run(["docker", "top", opened.container]);
    if (top.stdout.includes(marker)) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const top = await run(["docker", "top", opened.container]);
  assert.match(top.stdout, new RegExp(marker), "the command never started");
  assert.deepEqual(await fixture.containers(), [opened.container]);
  return opened;
}

for (
  const [how, end] of [
    ["the client vanishes (its input ends)", (server: RawMcpServer) => server.closeInput()],
    ["the server gets SIGTERM", (server: RawMcpServer) => server.child.kill("SIGTERM")],
    ["the server gets SIGINT", (server: RawMcpServer) => server.child.kill("SIGINT")],
  ] as const
) {
  Deno.test({
    name: `when ${how} mid-command, every sandbox the server started is destroyed`,
    ...dockerTest(),
    async fn() {
      assertDocker();
      await using fixture = await McpFixture.open("mcpgone");
      await using server = new RawMcpServer(fixture);
      const opened = await midCommand(fixture, server);
      await end(server);
      // Bounded (the server could hang on): the sandbox must go, then the server ends.
      assert.ok(await fixture.containerGone(opened.container), `${opened.container} remains`);
      assert.deepEqual(await fixture.containers(), []);
      const status = await server.child.status;
      assert.equal(status.code, 0, "the server ends as a server does");
      const meta = await fixture.meta(opened.environment_id);
      assert.equal(meta.status, "interrupted");
    },
  });
}
