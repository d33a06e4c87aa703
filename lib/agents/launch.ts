/**
 * How to start each agent CLI inside the sandbox: its argv, environment and private files.
 *
 * Every agent runs non-interactively with permission to act alone (it is in a sandbox: that is
 * the point), with telemetry, error reporting, update checks and other traffic of its own turned
 * off, and with nothing but the session's variables to find its LLM: the credential proxy's URL and
 * the session token as its "API key". The prompt goes in on stdin, never argv; extra instructions
 * go in a 0600 file. Flags were checked against each pinned version's `--help` and behaviour
 * (see README, "Agent CLIs").
 */
import { SandboxError } from "../errors.ts";
import { AGENT_PACKAGES, type AgentCliName, agentDir } from "./packages.ts";
import type { ProjectConfigPath } from "./project_config.ts";

/** Where the agents keep their state: the sandbox user's home, a tmpfs that dies with the container. */
export const SANDBOX_HOME = "/home/sandbox";
export const CODEX_HOME = `${SANDBOX_HOME}/.codex`;

export interface LaunchInput {
  /** The session's variables: the credential proxy's URLs and the token. */
  env: Record<string, string>;
  /** Model name (default: the session's `SANDBOX_LLM_MODEL`). */
  model?: string;
  /** Names the run's private files, so concurrent runs never collide. */
  runId: string;
  /** A 0600 file inside the sandbox holding extra system instructions. */
  instructionsFile?: string;
  /** Extra system instructions' text (agents that take them in their config file). */
  instructions?: string;
  /** The agent's working directory inside the sandbox: the project it reads configuration from. */
  cwd: string;
  /**
   * The project configuration the user trusts (`project_config.ts`); the agent reads none of the
   * rest. Default: none.
   */
  trustedConfig?: readonly ProjectConfigPath[];
}

export interface AgentLaunch {
  /** The program and its arguments; no secret and no prompt among them. */
  argv: string[];
  /** The environment of the agent, on top of the session's. */
  env: Record<string, string>;
  /** Files to write (mode 0600, owned by the sandbox user) before starting, removed after. */
  files: { path: string; content: string }[];
}

/** The program of an agent CLI inside its image. */
export function agentProgram(agent: AgentCliName): string {
  return `${agentDir(agent)}/${AGENT_PACKAGES[agent].entrypoint}`;
}

/** The model the agent is told to use. */
export function modelFor(input: LaunchInput): string {
  const model = input.model || input.env.SANDBOX_LLM_MODEL;
  if (!model) {
    throw new SandboxError("usage", "No model for the agent: pass --model or set llm.model");
  }
  return model;
}

export function required(env: Record<string, string>, name: string, agent: AgentCliName): string {
  const value = env[name];
  if (!value) {
    throw new SandboxError("worker_failed", `Cannot start ${agent}: the session sets no ${name}`);
  }
  return value;
}

/**
 * Claude Code in print mode with `stream-json` events. Its API calls go to `ANTHROPIC_BASE_URL`
 * (the proxy, which it calls at `/v1/messages`) with `ANTHROPIC_API_KEY` (the token) as x-api-key.
 */
export function claudeCodeLaunch(input: LaunchInput): AgentLaunch {
  required(input.env, "ANTHROPIC_BASE_URL", "claude-code");
  required(input.env, "ANTHROPIC_API_KEY", "claude-code");
  return {
    argv: [
      agentProgram("claude-code"),
      "--print",
      "--output-format",
      "stream-json",
      // stream-json needs --verbose to print every event, not just the result.
      "--verbose",
      // Refused as root unless IS_SANDBOX=1 (the image sets it); the agent runs as uid 10001.
      "--dangerously-skip-permissions",
      // Transcripts would only pile up in a home that dies with the container.
      "--no-session-persistence",
      "--model",
      modelFor(input),
      ...(input.instructionsFile ? ["--append-system-prompt-file", input.instructionsFile] : []),
      ...claudeProjectFlags(input),
    ],
    env: { ...CLAUDE_QUIET_ENV },
    files: [],
  };
}

/** Claude Code's own traffic, off: the same in print mode and in its TUI. */
export const CLAUDE_QUIET_ENV: Readonly<Record<string, string>> = {
  // The umbrella switch: no telemetry, error reports, auto-update, feedback or release notes.
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
  // And each of them by name, for versions that read only the specific one.
  DISABLE_TELEMETRY: "1",
  DISABLE_ERROR_REPORTING: "1",
  DISABLE_AUTOUPDATER: "1",
  DISABLE_BUG_COMMAND: "1",
  CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY: "1",
};

/**
 * What Claude Code reads of the project. Untrusted, `.claude/` stays out through the setting
 * sources (the "project" source is `.claude/` and, with it, `.mcp.json`: settings, skills, agents,
 * commands; "local" is `.claude/settings.local.json`), and `.mcp.json` through `--strict-mcp-config`.
 * Trusted, the CLI reads them as it does by default; a trusted `.mcp.json` without a trusted
 * `.claude/` is named with `--mcp-config`. (Checked against 2.1.330: with `--setting-sources user`
 * no project hook, env, apiKeyHelper, skill, agent or MCP server is loaded.)
 */
export function claudeProjectFlags(input: LaunchInput): string[] {
  const trusted = new Set(input.trustedConfig ?? []);
  const sources = trusted.has(".claude") ? [] : ["--setting-sources", "user"];
  if (!trusted.has(".mcp.json")) return [...sources, "--strict-mcp-config"];
  return trusted.has(".claude") ? sources : [...sources, "--mcp-config", `${input.cwd}/.mcp.json`];
}

/** A TOML basic string: JSON's escapes are all valid TOML escapes (and JSON.stringify makes no `\/`). */
function tomlString(value: string): string {
  return JSON.stringify(value);
}

/**
 * Codex's configuration for one run, as a profile file layered on its defaults (`-p`): the
 * credential proxy as its only model provider, speaking the Responses API, with the token read
 * from the environment by name (so the file holds no secret), and every feature that would reach
 * a service of its own switched off: update checks, analytics, web search (a server-side tool the
 * proxy refuses anyway), plugins and connectors (which fetch from github.com and chatgpt.com).
 */
export function codexConfig(input: Pick<LaunchInput, "env" | "runId" | "instructions">): string {
  const baseUrl = required(input.env, "OPENAI_BASE_URL", "codex");
  required(input.env, "SANDBOX_LLM_TOKEN", "codex");
  return [
    `# Written by sandbox for run ${input.runId}; removed when the run ends.`,
    `model_provider = "sandbox"`,
    "check_for_update_on_startup = false",
    `web_search = "disabled"`,
    ...(input.instructions?.trim()
      ? [`developer_instructions = ${tomlString(input.instructions)}`]
      : []),
    "",
    "[model_providers.sandbox]",
    `name = "sandbox credential proxy"`,
    `base_url = ${tomlString(baseUrl)}`,
    `env_key = "SANDBOX_LLM_TOKEN"`,
    `wire_api = "responses"`,
    "",
    "[analytics]",
    "enabled = false",
    "",
    "[history]",
    `persistence = "none"`,
    "",
    "[features]",
    "plugins = false",
    "remote_plugin = false",
    "apps = false",
    "",
  ].join("\n");
}

/** The name of a run's Codex profile file (`$CODEX_HOME/<name>.config.toml`). */
export function codexProfileName(runId: string): string {
  return `sandbox-${runId.replace(/[^A-Za-z0-9_-]/g, "-")}`;
}

/**
 * What Codex reads of the project. Codex loads a project's `.codex/` (config, hooks, rules) only
 * for a project it trusts, by its `projects` table; the table given here replaces whatever the
 * agent-writable `$CODEX_HOME` says, and "untrusted" is final even against `--trust`. Trusted,
 * `sandbox trust` of every file stands for Codex's own review of each hook, which a run without a
 * terminal cannot give. (Checked against 0.169.0.)
 */
export function codexProjectFlags(input: LaunchInput): string[] {
  const trusted = (input.trustedConfig ?? []).includes(".codex");
  const table = `projects={${tomlString(input.cwd)}={trust_level="${
    trusted ? "trusted" : "untrusted"
  }"}}`;
  return trusted ? ["-c", table, "--dangerously-bypass-hook-trust"] : ["-c", table];
}

/** `codex exec` with JSON events, reading the prompt from stdin (`-`). */
export function codexLaunch(input: LaunchInput): AgentLaunch {
  const profile = codexProfileName(input.runId);
  return {
    argv: [
      agentProgram("codex"),
      "exec",
      "--json",
      // Codex's own sandbox (bubblewrap, landlock) cannot work without privileges, and is not needed.
      "--dangerously-bypass-approvals-and-sandbox",
      // A run without --repo works in a plain directory.
      "--skip-git-repo-check",
      "--ephemeral",
      "--profile",
      profile,
      "--model",
      modelFor(input),
      ...codexProjectFlags(input),
      "-",
    ],
    env: { CODEX_HOME },
    files: [{ path: `${CODEX_HOME}/${profile}.config.toml`, content: codexConfig(input) }],
  };
}

/** The launch of `agent` for one run. */
export function agentLaunch(agent: AgentCliName, input: LaunchInput): AgentLaunch {
  return agent === "claude-code" ? claudeCodeLaunch(input) : codexLaunch(input);
}
