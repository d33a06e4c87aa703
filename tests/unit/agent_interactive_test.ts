/**
 * How an agent CLI's TUI is started in a session: Claude Code with permission prompts off, its
 * own traffic off, the session token as its only credential (never as ANTHROPIC_API_KEY, which the
 * TUI would ask about), its first-start screens answered by files in its home, the repository's
 * configuration kept out unless trusted; Codex refused with the reason.
 */
import assert from "node:assert/strict";
import {
  checkInteractiveAgent,
  INTERACTIVE_HIDDEN_ENV,
  interactiveLaunch,
} from "../../lib/agents/interactive.ts";
import { agentProgram } from "../../lib/agents/launch.ts";
import { SandboxError } from "../../lib/errors.ts";

const TOKEN = "sbx_session-token-0123456789abcdef";
const SESSION_ENV = {
  SANDBOX_LLM_TOKEN: TOKEN,
  SANDBOX_LLM_MODEL: "claude-sonnet-4-5",
  ANTHROPIC_BASE_URL: "http://127.0.0.1:41000/proxy",
  ANTHROPIC_API_KEY: TOKEN,
};
const CWD = "/workspace/worktrees/20261127-000000-abcdef";

Deno.test("Claude Code's TUI starts with permission prompts off and the session token as its only credential", () => {
  const launch = interactiveLaunch("claude-code", { env: SESSION_ENV, runId: "s-1", cwd: CWD });
  assert.deepEqual(launch.argv, [
    agentProgram("claude-code"),
    "--dangerously-skip-permissions",
    "--model",
    "claude-sonnet-4-5",
    "--setting-sources",
    "user",
    "--strict-mcp-config",
  ]);
  assert.ok(!launch.argv.includes("--print"), "the TUI, not print mode");
  assert.equal(launch.env.ANTHROPIC_AUTH_TOKEN, TOKEN);
  assert.equal(launch.env.CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, "1");
  assert.deepEqual(INTERACTIVE_HIDDEN_ENV["claude-code"], ["ANTHROPIC_API_KEY"]);
  const files = Object.fromEntries(launch.files.map((f) => [f.path, JSON.parse(f.content)]));
  assert.deepEqual(files["/home/sandbox/.claude.json"], {
    hasCompletedOnboarding: true,
    projects: { [CWD]: { hasTrustDialogAccepted: true } },
  });
  assert.deepEqual(files["/home/sandbox/.claude/settings.json"], {
    skipDangerousModePermissionPrompt: true,
  });
  for (const file of launch.files) assert.ok(!file.content.includes(TOKEN), file.path);
});

Deno.test("Claude Code's TUI reads the repository's configuration only when trusted, and the model given", () => {
  const launch = interactiveLaunch("claude-code", {
    env: SESSION_ENV,
    runId: "s-1",
    cwd: CWD,
    model: "claude-opus-4",
    trustedConfig: [".claude", ".mcp.json"],
  });
  assert.deepEqual(launch.argv.slice(1), [
    "--dangerously-skip-permissions",
    "--model",
    "claude-opus-4",
  ]);
});

Deno.test("Codex's TUI is refused as a usage error that says why", () => {
  checkInteractiveAgent("claude-code");
  for (
    const attempt of [
      () => checkInteractiveAgent("codex"),
      () => interactiveLaunch("codex", { env: SESSION_ENV, runId: "s-1", cwd: CWD }),
    ]
  ) {
    assert.throws(attempt, (error) => {
      assert.ok(error instanceof SandboxError);
      assert.equal(error.code, "usage");
      assert.match(error.message, /--interactive is not available for agent "codex"/);
      assert.match(error.detail ?? "", /ChatGPT sign-in/);
      return true;
    });
  }
});
