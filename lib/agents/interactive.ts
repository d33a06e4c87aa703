/**
 * An agent CLI's own terminal UI in a sandbox (`sandbox run agentic --interactive`): its argv,
 * environment and the files it reads at start, for a session's supervisor to start with a
 * terminal (lib/session/). Like a headless run it acts alone (permission prompts off: it is in a
 * sandbox), its own traffic is off, and its only way to its LLM is the credential proxy, with the
 * session token as its credential; the project's configuration for it is kept out unless trusted.
 *
 * Claude Code and Codex, Codex with an API key only (see `checkCodexSignIn`).
 */
import { SandboxError } from "../errors.ts";
import {
  type AgentLaunch,
  agentProgram,
  CLAUDE_QUIET_ENV,
  claudeProjectFlags,
  CODEX_HOME,
  codexConfig,
  codexProfileName,
  codexProjectFlags,
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
 * Codex's TUI, started as `codex exec` is for a headless run but without `exec`: approvals and
 * its own sandbox off (`--dangerously-bypass-approvals-and-sandbox`), the run's profile file
 * naming the credential proxy as its only model provider with the session token read from
 * `SANDBOX_LLM_TOKEN`, and the project explicitly untrusted unless the user trusts `.codex/`. A
 * provider of its own needs no OpenAI sign-in, so no sign-in screen is shown. An untrusted folder
 * makes Codex ask, at every start, how to open it: "Open restricted" (its default, Enter) is the
 * only way on; no configuration answers it but trusting the folder. (Checked against 0.169.0.)
 */
export function codexInteractive(input: LaunchInput): AgentLaunch {
  const profile = codexProfileName(input.runId);
  return {
    argv: [
      agentProgram("codex"),
      "--dangerously-bypass-approvals-and-sandbox",
      "--profile",
      profile,
      "--model",
      modelFor(input),
      ...codexProjectFlags(input),
    ],
    env: { CODEX_HOME },
    files: [{ path: `${CODEX_HOME}/${profile}.config.toml`, content: codexConfig(input) }],
  };
}

/** ChatGPT's own backend, which takes only a ChatGPT sign-in. */
const CHATGPT_HOST = /(^|\.)chatgpt\.com$/i;

/** The issuer of a ChatGPT sign-in's tokens. */
const CHATGPT_ISSUER = "https://auth.openai.com";

/** What shows that `key` (for an upstream at `baseUrl`) is a ChatGPT sign-in, if it is one. */
export function chatGptSignIn(baseUrl: string, key: string): string | undefined {
  const host = URL.parse(baseUrl)?.hostname ?? "";
  if (CHATGPT_HOST.test(host)) return `its base URL is ChatGPT's backend (${host})`;
  const json = parseJson(key.trim());
  if (isRecord(json) && ("tokens" in json || "auth_mode" in json)) {
    return "its key is Codex's auth.json";
  }
  const parts = key.trim().split(".");
  if (parts.length !== 3) return undefined;
  const claims = parseJson(decodeBase64Url(parts[1]));
  if (
    isRecord(claims) &&
    (claims.iss === CHATGPT_ISSUER || "https://api.openai.com/auth" in claims)
  ) {
    return "its key is a ChatGPT sign-in's access token (issued by auth.openai.com)";
  }
  return undefined;
}

/**
 * Refuse Codex's TUI with a ChatGPT sign-in (`codex login`), before anything starts: Codex 0.169
 * keeps it as an OAuth token pair in `auth.json`, refreshes it itself against auth.openai.com and
 * sends it to chatgpt.com's own backend, so it cannot stay on the host behind the credential
 * proxy. With an API key, the TUI runs as a headless run does.
 */
export function checkCodexSignIn(profile: string, baseUrl: string, key: string): void {
  const sign = chatGptSignIn(baseUrl, key);
  if (!sign) return;
  throw new SandboxError(
    "usage",
    `--interactive --agent codex cannot use a ChatGPT sign-in: profile "${profile}": ${sign}`,
    {
      detail:
        "Codex refreshes its ChatGPT sign-in itself (auth.json), so it cannot stay outside the sandbox; use an OpenAI API key (llm.key, or OPENAI_API_KEY)",
    },
  );
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined; // not JSON: not a sign-in's file or claims
  }
}

function decodeBase64Url(text: string): string {
  try {
    return atob(text.replaceAll("-", "+").replaceAll("_", "/"));
  } catch {
    return ""; // not base64url: not a token's claims
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The launch of `agent`'s TUI for one session. */
export function interactiveLaunch(agent: AgentCliName, input: LaunchInput): AgentLaunch {
  return agent === "claude-code" ? claudeCodeInteractive(input) : codexInteractive(input);
}
