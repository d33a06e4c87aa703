/**
 * An agent CLI's own terminal UI in a sandbox (`sandbox run agentic --interactive`): its argv,
 * environment and the files it reads at start, for a session's supervisor to start with a
 * terminal (lib/session/). Like a headless run it acts alone (permission prompts off: it is in a
 * sandbox), its own traffic is off, and its only way to its LLM is the credential proxy, with the
 * session token as its credential; the project's configuration for it is kept out unless trusted.
 *
 * Only Claude Code: Codex's TUI is not offered (see `interactiveLaunch`).
 */
import { SandboxError } from "../errors.ts";
import {
  type AgentLaunch,
  agentProgram,
  CLAUDE_QUIET_ENV,
  claudeProjectFlags,
  type LaunchInput,
  modelFor,
  required,
  SANDBOX_HOME,
} from "./launch.ts";
import type { AgentCliName } from "./packages.ts";

/**
 * Claude Code's TUI. Its credential is `ANTHROPIC_AUTH_TOKEN` (sent as `Authorization: Bearer`),
 * set to the session token, a placeholder only the credential proxy accepts; the proxy attaches
 * the host's key or subscription token. `ANTHROPIC_API_KEY` is left out: the TUI would stop to
 * ask whether to use a key it finds there. Its first-start screens (onboarding, the trust of the
 * folder, the bypass-permissions warning) are answered by the files it reads at start, in the
 * sandbox user's home, which dies with the container. (Checked against 2.1.330.)
 */
export function claudeCodeInteractive(input: LaunchInput): AgentLaunch {
  required(input.env, "ANTHROPIC_BASE_URL", "claude-code");
  const token = required(input.env, "SANDBOX_LLM_TOKEN", "claude-code");
  const state = {
    hasCompletedOnboarding: true,
    projects: { [input.cwd]: { hasTrustDialogAccepted: true } },
  };
  return {
    argv: [
      agentProgram("claude-code"),
      "--dangerously-skip-permissions",
      "--model",
      modelFor(input),
      ...claudeProjectFlags(input),
    ],
    env: { ...CLAUDE_QUIET_ENV, ANTHROPIC_AUTH_TOKEN: token },
    files: [
      { path: `${SANDBOX_HOME}/.claude.json`, content: JSON.stringify(state) },
      {
        path: `${SANDBOX_HOME}/.claude/settings.json`,
        content: JSON.stringify({ skipDangerousModePermissionPrompt: true }),
      },
    ],
  };
}

/** Variables of the session the TUI must not see (it would ask about a key it finds). */
export const INTERACTIVE_HIDDEN_ENV: Readonly<Record<AgentCliName, readonly string[]>> = {
  "claude-code": ["ANTHROPIC_API_KEY"],
  codex: [],
};

/**
 * Refuse an agent whose TUI is not offered, before anything starts. Codex 0.169's TUI is not:
 * its ChatGPT sign-in keeps an OAuth token pair in `auth.json` that Codex refreshes itself
 * against auth.openai.com and sends to chatgpt.com's own backend, so the sign-in cannot stay on
 * the host behind the credential proxy; and its TUI's first-start screens are not checked here.
 */
export function checkInteractiveAgent(agent: AgentCliName): void {
  if (agent === "claude-code") return;
  throw new SandboxError(
    "usage",
    `--interactive is not available for agent "${agent}": only claude-code's TUI runs in a sandbox`,
    {
      detail:
        "Codex keeps its ChatGPT sign-in in auth.json and refreshes it itself, so it cannot stay outside the sandbox; run codex headless: run agentic --agent codex --prompt-file FILE",
    },
  );
}

/** The launch of `agent`'s TUI for one session. */
export function interactiveLaunch(agent: AgentCliName, input: LaunchInput): AgentLaunch {
  checkInteractiveAgent(agent);
  return claudeCodeInteractive(input);
}
