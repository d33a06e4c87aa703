/**
 * How each agent CLI is started: non-interactive with full autonomy, non-essential traffic off,
 * the session's proxy as its only LLM, no secret and no prompt on its command line, and the
 * checks that refuse a run an agent cannot do.
 */
import assert from "node:assert/strict";
import { checkAgentRun } from "../../lib/agents/agent_cli.ts";
import {
  agentProgram,
  claudeCodeLaunch,
  CODEX_HOME,
  codexConfig,
  codexLaunch,
  codexProfileName,
} from "../../lib/agents/launch.ts";
import { SandboxError } from "../../lib/errors.ts";
import { parseConfig, resolveProfile } from "../../lib/config.ts";

const TOKEN = "sbx_session-token-0123456789abcdef";
const SESSION_ENV = {
  SANDBOX_LLM_BASE_URL: "http://172.30.0.1:41000/proxy/v1",
  SANDBOX_LLM_TOKEN: TOKEN,
  SANDBOX_LLM_API: "anthropic",
  SANDBOX_LLM_MODEL: "claude-sonnet-4-5",
  OPENAI_BASE_URL: "http://172.30.0.1:41000/proxy/v1",
  OPENAI_API_KEY: TOKEN,
  ANTHROPIC_BASE_URL: "http://172.30.0.1:41000/proxy",
  ANTHROPIC_API_KEY: TOKEN,
};
const WORKTREE = "/workspace/worktrees/20261122-224149-064f15";

Deno.test("Claude Code runs in print mode with stream-json, skipping permission prompts, with its extra traffic off", () => {
  const launch = claudeCodeLaunch({
    env: SESSION_ENV,
    runId: "run-1",
    cwd: WORKTREE,
    instructionsFile: "/tmp/sandbox-prompts/run-1/instructions.txt",
  });
  assert.equal(launch.argv[0], agentProgram("claude-code"));
  assert.equal(launch.argv[0], "/opt/sandbox/agents/claude-code/claude");
  for (
    const flag of [
      "--print",
      "--verbose",
      "--dangerously-skip-permissions",
      "--no-session-persistence",
    ]
  ) {
    assert.ok(launch.argv.includes(flag), `missing ${flag}`);
  }
  assert.equal(launch.argv[launch.argv.indexOf("--output-format") + 1], "stream-json");
  assert.equal(
    launch.argv[launch.argv.indexOf("--model") + 1],
    "claude-sonnet-4-5",
    "the session's model by default",
  );
  assert.equal(
    launch.argv[launch.argv.indexOf("--append-system-prompt-file") + 1],
    "/tmp/sandbox-prompts/run-1/instructions.txt",
  );
  assert.deepEqual(launch.env, {
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    DISABLE_TELEMETRY: "1",
    DISABLE_ERROR_REPORTING: "1",
    DISABLE_AUTOUPDATER: "1",
    DISABLE_BUG_COMMAND: "1",
    CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY: "1",
  });
  assert.ok(
    !launch.argv.some((arg) => arg.includes(TOKEN)),
    "the token is never on the command line",
  );
  assert.deepEqual(launch.files, []);
  const chosen = claudeCodeLaunch({
    env: SESSION_ENV,
    runId: "run-1",
    cwd: WORKTREE,
    model: "replay",
  });
  assert.equal(
    chosen.argv[chosen.argv.indexOf("--model") + 1],
    "replay",
    "--model overrides the session's",
  );
  assert.ok(!chosen.argv.includes("--append-system-prompt-file"), "no instructions, no flag");
});

Deno.test("Codex runs exec --json without approvals or its own sandbox, configured by a per-run profile file", () => {
  const launch = codexLaunch({
    env: SESSION_ENV,
    runId: "20261122-224149-064f15",
    cwd: WORKTREE,
    model: "gpt-5.5",
    instructions: 'Say "hi"\nthen stop',
  });
  const profile = codexProfileName("20261122-224149-064f15");
  assert.deepEqual(launch.argv, [
    "/opt/sandbox/agents/codex/bin/codex",
    "exec",
    "--json",
    "--dangerously-bypass-approvals-and-sandbox",
    "--skip-git-repo-check",
    "--ephemeral",
    "--profile",
    profile,
    "--model",
    "gpt-5.5",
    "-c",
    `projects={"${WORKTREE}"={trust_level="untrusted"}}`,
    "-",
  ]);
  assert.deepEqual(launch.env, { CODEX_HOME });
  assert.deepEqual(launch.files.map((f) => f.path), [`${CODEX_HOME}/${profile}.config.toml`]);
  const config = launch.files[0].content;
  assert.equal(
    config,
    codexConfig({
      env: SESSION_ENV,
      runId: "20261122-224149-064f15",
      instructions: 'Say "hi"\nthen stop',
    }),
  );
  for (
    const line of [
      `model_provider = "sandbox"`,
      `base_url = "http://172.30.0.1:41000/proxy/v1"`,
      `env_key = "SANDBOX_LLM_TOKEN"`,
      `wire_api = "responses"`,
      "check_for_update_on_startup = false",
      `web_search = "disabled"`,
      `developer_instructions = "Say \\"hi\\"\\nthen stop"`,
      "[analytics]\nenabled = false",
      "plugins = false",
      "remote_plugin = false",
      "apps = false",
    ]
  ) assert.ok(config.includes(line), `config lacks ${JSON.stringify(line)}:\n${config}`);
  assert.ok(!config.includes(TOKEN), "the config names the token's variable, never the token");
  assert.ok(!launch.argv.some((arg) => arg.includes(TOKEN)));
});

Deno.test("An agent is refused, before anything starts, where it cannot run", async (t) => {
  const ok = { mode: "agentic" as const, sandboxMode: "container", profile: "work", replay: false };
  await t.step("each agent with its own API is accepted, in a container or a devcontainer", () => {
    checkAgentRun("claude-code", { ...ok, api: "anthropic" });
    checkAgentRun("codex", { ...ok, api: "openai" });
    checkAgentRun("codex", { ...ok, api: "openai", sandboxMode: "devcontainer" });
  });
  const refusals: [string, () => void, RegExp][] = [
    [
      "claude-code against an OpenAI provider",
      () => checkAgentRun("claude-code", { ...ok, api: "openai" }),
      /speaks the Anthropic Messages API, but profile "work" uses an OpenAI-style provider/,
    ],
    [
      "codex against an Anthropic provider",
      () => checkAgentRun("codex", { ...ok, api: "anthropic" }),
      /speaks the OpenAI Responses API/,
    ],
    [
      "codex replaying an Anthropic recording",
      () => checkAgentRun("codex", { ...ok, api: "anthropic", replay: true }),
      /the recording holds Anthropic Messages answers/,
    ],
    [
      "sandbox mode none",
      () => checkAgentRun("codex", { ...ok, api: "openai", sandboxMode: "none" }),
      /needs sandbox mode "container", "devcontainer", "kubernetes" or "local", not "none"/,
    ],
    [
      "run generate",
      () => checkAgentRun("codex", { ...ok, api: "openai", mode: "generate" }),
      /is for run agentic/,
    ],
  ];
  for (const [name, attempt, message] of refusals) {
    await t.step(name, () => {
      assert.throws(
        attempt,
        (error: unknown) =>
          error instanceof SandboxError && error.code === "usage" && message.test(error.message),
      );
    });
  }
});

Deno.test("llm.agent picks the agent of a profile: the built-in worker by default, an agent CLI by name, nothing else", () => {
  const parsed = parseConfig(
    "profiles:\n  cc:\n    llm: {provider: anthropic, agent: claude-code}\n  plain: {}\n",
    "test.yaml",
    () => undefined,
  );
  assert.equal(parsed.kind, "ok");
  if (parsed.kind !== "ok") return;
  assert.equal(resolveProfile(parsed.config, "cc").llm.agent, "claude-code");
  assert.equal(resolveProfile(parsed.config, "plain").llm.agent, "deepagents");
  const bad = parseConfig(
    "profiles:\n  x:\n    llm: {agent: aider}\n",
    "test.yaml",
    () => undefined,
  );
  assert.equal(bad.kind, "invalid");
  if (bad.kind !== "invalid") return;
  assert.equal(bad.issues.length, 1);
  assert.equal(bad.issues[0].path, "profiles.x.llm.agent");
  assert.match(bad.issues[0].message, /deepagents.*claude-code.*codex/);
});

Deno.test("Claude Code reads none of the project's configuration until the user trusts it, then reads it as it would by default", async (t) => {
  const flags = (trustedConfig?: (".claude" | ".mcp.json")[]) => {
    const argv =
      claudeCodeLaunch({ env: SESSION_ENV, runId: "run-1", cwd: WORKTREE, trustedConfig }).argv;
    return argv.slice(argv.indexOf("claude-sonnet-4-5") + 1);
  };
  await t.step("untrusted: user settings only, and no MCP server but the ones named (none)", () => {
    assert.deepEqual(flags(), ["--setting-sources", "user", "--strict-mcp-config"]);
    assert.deepEqual(flags([]), ["--setting-sources", "user", "--strict-mcp-config"]);
  });
  await t.step(
    ".claude trusted: every setting source, as by default; an untrusted .mcp.json stays out",
    () => {
      assert.deepEqual(flags([".claude"]), ["--strict-mcp-config"]);
    },
  );
  await t.step("both trusted: the CLI's defaults, no switch at all", () => {
    assert.deepEqual(flags([".claude", ".mcp.json"]), []);
  });
  await t.step(
    ".mcp.json alone trusted: its servers by name, the project's settings still out",
    () => {
      assert.deepEqual(flags([".mcp.json"]), [
        "--setting-sources",
        "user",
        "--mcp-config",
        `${WORKTREE}/.mcp.json`,
      ]);
    },
  );
});

Deno.test("Codex's project is explicitly untrusted until the user trusts .codex/; trusted, its hooks run without Codex's own review", () => {
  const argv = (trustedConfig?: ".codex"[]) =>
    codexLaunch({ env: SESSION_ENV, runId: "r", cwd: WORKTREE, model: "m", trustedConfig }).argv;
  const untrusted = argv();
  assert.equal(
    untrusted[untrusted.indexOf("-c") + 1],
    `projects={"${WORKTREE}"={trust_level="untrusted"}}`,
  );
  assert.ok(!untrusted.includes("--dangerously-bypass-hook-trust"));
  assert.ok(!untrusted.includes("--trust"));
  const trusted = argv([".codex"]);
  assert.equal(
    trusted[trusted.indexOf("-c") + 1],
    `projects={"${WORKTREE}"={trust_level="trusted"}}`,
  );
  assert.ok(trusted.includes("--dangerously-bypass-hook-trust"));
  assert.equal(trusted.at(-1), "-", "the prompt still comes from stdin");
  // A working directory with a quote or backslash stays one TOML key.
  const odd = codexLaunch({ env: SESSION_ENV, runId: "r", cwd: '/w/a"b\\c', model: "m" }).argv;
  assert.equal(odd[odd.indexOf("-c") + 1], `projects={"/w/a\\"b\\\\c"={trust_level="untrusted"}}`);
});
