/**
 * `sandbox mcp` under a real MCP host: Claude Code (the pinned package the sandboxes use, fetched
 * and checked as lib/agents/npm_tarball.ts does) started on the host with `--mcp-config` naming
 * `sandbox mcp`, driven by a scripted fake Anthropic upstream on 127.0.0.1 that makes it call our
 * tools: open an environment, write a file there, finish. The file lands on the environment's
 * branch in the host repository, and nothing is written in the user's working tree.
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, tempDir } from "../_helpers.ts";
import { type AgentLlmRequest, type AgentStep, FakeAgentLlm } from "../_fake_agent_llm.ts";
import { git, McpFixture } from "../_mcp_fixture.ts";
import { AGENT_PACKAGES } from "../../lib/agents/packages.ts";
import { fetchTarball } from "../../lib/agents/npm_tarball.ts";
import { run } from "../../lib/process.ts";

console.error("e2e: sandbox mcp under Claude Code starting");

const KEY = "sk-ant-fake-mcp-host-key";
const TOOL = (name: string) => `mcp__sandbox__environment_${name}`;

/** The environment id the last tool result carried (a run id: `YYYYMMDD-HHMMSS-hex6`). */
function environmentIdIn(request: AgentLlmRequest): string {
  const ids = JSON.stringify(request.body).match(/\d{8}-\d{6}-[0-9a-f]{6}/g);
  assert.ok(ids, `no environment id in the conversation: ${JSON.stringify(request.body)}`);
  return ids.at(-1)!;
}

/** The pinned Claude Code binary, unpacked in `dir`. */
async function claudeBinary(dir: string): Promise<string> {
  const arch = Deno.build.arch === "aarch64" ? "arm64" : "amd64";
  const tarball = AGENT_PACKAGES["claude-code"].tarballs[arch];
  const path = await fetchTarball(tarball);
  const unpacked = await run(["tar", "-xzf", path, "-C", dir]);
  assert.equal(unpacked.exitCode, 0, unpacked.stderr);
  return `${dir}/${tarball.root}/${AGENT_PACKAGES["claude-code"].entrypoint}`;
}

Deno.test({
  name: "Claude Code on the host works through sandbox mcp: the file lands on the branch only",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await McpFixture.open("mcpcc");
    await using scratch = await tempDir("sandbox-mcp-claude-");
    const claude = await claudeBinary(scratch.path);
    let environmentId = "";
    const script: (AgentStep | ((request: AgentLlmRequest) => AgentStep))[] = [
      { kind: "tool", name: TOOL("open"), input: {}, text: "Opening a sandbox." },
      (request) => {
        environmentId = environmentIdIn(request);
        return {
          kind: "tool",
          name: TOOL("write_file"),
          input: { environment_id: environmentId, path: "hello.txt", content: "from claude\n" },
        };
      },
      () => ({ kind: "tool", name: TOOL("finish"), input: { environment_id: environmentId } }),
      { kind: "text", text: "Done: hello.txt is on the branch." },
    ];
    await using fake = new FakeAgentLlm("anthropic", script, KEY, "fake-model");
    const [command, ...args] = fixture.serverArgv();
    const mcpConfig = `${scratch.path}/mcp.json`;
    await Deno.writeTextFile(
      mcpConfig,
      JSON.stringify({ mcpServers: { sandbox: { command, args, env: fixture.serverEnv() } } }),
    );
    const home = `${scratch.path}/home`;
    await Deno.mkdir(home);
    const before = await git(fixture.repo, "status", "--porcelain", "--ignored");
    const result = await run([
      claude,
      "--print",
      "--output-format",
      "stream-json",
      "--verbose",
      "--no-session-persistence",
      "--model",
      "fake-model",
      "--setting-sources",
      "user",
      "--strict-mcp-config",
      "--mcp-config",
      mcpConfig,
      "--allowedTools",
      [TOOL("open"), TOOL("write_file"), TOOL("finish")].join(","),
      "--",
      "Write hello.txt saying 'from claude' in a sandbox and bring it back.",
    ], {
      cwd: fixture.repo,
      clearEnv: true,
      env: {
        PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
        HOME: home,
        ANTHROPIC_BASE_URL: fake.baseUrl.replace(/\/v1$/, ""),
        ANTHROPIC_API_KEY: KEY,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
        DISABLE_TELEMETRY: "1",
        DISABLE_ERROR_REPORTING: "1",
        DISABLE_AUTOUPDATER: "1",
        MCP_TIMEOUT: "120000",
        MCP_TOOL_TIMEOUT: "600000",
      },
      timeoutMs: 600_000,
    });
    const context = `exit ${result.exitCode}\n${result.stdout}\n${result.stderr}`;
    assert.equal(result.exitCode, 0, context);
    assert.equal(fake.served, 4, context);
    assert.ok(environmentId, context);
    const branch = `sandbox/${environmentId}`;
    assert.equal(await git(fixture.repo, "show", `${branch}:hello.txt`), "from claude", context);
    // The user's working tree: exactly as it was; no hello.txt there.
    assert.equal(await git(fixture.repo, "status", "--porcelain", "--ignored"), before);
    await assert.rejects(Deno.stat(`${fixture.repo}/hello.txt`), Deno.errors.NotFound);
    assert.equal(await git(fixture.repo, "branch", "--show-current"), "main");
    // Every tool result Claude Code got back was a success.
    const events = result.stdout.trim().split("\n").map((line) => JSON.parse(line));
    const toolResults = events.flatMap((event) =>
      event.type === "user"
        ? event.message.content.filter((c: { type: string }) => c.type === "tool_result")
        : []
    );
    assert.equal(toolResults.length, 3, context);
    for (const each of toolResults) assert.notEqual(each.is_error, true, JSON.stringify(each));
    // The server Claude Code started ended with it; its sandbox is gone.
    assert.deepEqual(await fixture.containers(), []);
  },
});
