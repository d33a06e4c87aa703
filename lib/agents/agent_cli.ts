/**
 * An agent CLI as the driver uses it: how to start it, and how to read what it prints. The driver
 * (`lib/run/container_driver.ts`) knows nothing of any one agent beyond this interface.
 */
import { ClaudeCodeTranslator } from "./claude_code_events.ts";
import { CodexTranslator } from "./codex_events.ts";
import { type AgentLaunch, agentLaunch, type LaunchInput } from "./launch.ts";
import type { AgentCliName } from "./packages.ts";
import type { ProjectConfigPath } from "./project_config.ts";
import type { EventTranslator } from "./translate.ts";
import { SandboxError } from "../errors.ts";
import { normalizeToolName } from "../run/tool_names.ts";

export interface TranslatorOptions {
  /** The model the agent was told to use. */
  model?: string;
  /** The agent's own warnings, for stderr. */
  onDiagnostic?: (message: string) => void;
  /** Tool names as the wire reports them (default for Claude Code: the seeds' standard names). */
  toolName?: (raw: string) => string;
}

export interface AgentCli {
  readonly name: AgentCliName;
  launch(input: LaunchInput): AgentLaunch;
  /** A fresh translator for one run's events. */
  translator(options?: TranslatorOptions): EventTranslator;
}

export interface AgentCliOptions {
  /** The project configuration the user trusts (`project_config.ts`); default none. */
  trustedConfig?: readonly ProjectConfigPath[];
}

export function agentCli(name: AgentCliName, options: AgentCliOptions = {}): AgentCli {
  return {
    name,
    launch: (input) => agentLaunch(name, { trustedConfig: options.trustedConfig, ...input }),
    translator: (options = {}) =>
      name === "claude-code"
        // Claude Code's tool names (Bash, Write…) as the seeds' drivers report them.
        ? new ClaudeCodeTranslator({
          model: options.model,
          toolName: options.toolName ?? normalizeToolName,
        })
        : new CodexTranslator({ model: options.model, onDiagnostic: options.onDiagnostic }),
  };
}

/** The wire format each agent CLI speaks to its LLM. */
export const AGENT_API: Readonly<Record<AgentCliName, "openai" | "anthropic">> = {
  "claude-code": "anthropic",
  codex: "openai",
};

/** The sandbox modes an agent CLI runs in. */
const AGENT_SANDBOX_MODES: readonly string[] = ["container", "devcontainer", "kubernetes", "local"];

/**
 * Refuse, before anything starts, a run an agent CLI cannot do: anything but `run agentic` in a
 * sandbox (container, devcontainer, kubernetes, local), or an upstream in another wire format (Claude Code speaks only Anthropic Messages,
 * Codex only the OpenAI Responses API).
 */
export function checkAgentRun(
  agent: AgentCliName,
  run: {
    mode: "agentic" | "generate";
    sandboxMode: string;
    api: "openai" | "anthropic";
    profile: string;
    replay: boolean;
  },
): void {
  if (run.mode !== "agentic") {
    throw new SandboxError("usage", `--agent ${agent} is for run agentic`);
  }
  // A devcontainer run is a container run on the repository's image: the layer goes on top of it;
  // a kubernetes run's pod runs the layer pushed beside the sandbox image; a local run binds the
  // same package, unpacked on the host (host_agent.ts).
  if (!AGENT_SANDBOX_MODES.includes(run.sandboxMode)) {
    throw new SandboxError(
      "usage",
      `Agent "${agent}" needs sandbox mode "container", "devcontainer", "kubernetes" or "local", not "${run.sandboxMode}"`,
      {
        detail: "Agent CLIs run isolated, from their pinned package: never with no sandbox",
      },
    );
  }
  const wanted = AGENT_API[agent];
  if (run.api !== wanted) {
    const hint = run.replay
      ? `the recording holds ${run.api === "anthropic" ? "Anthropic Messages" : "OpenAI"} answers`
      : `profile "${run.profile}" uses an ${
        run.api === "anthropic" ? "Anthropic" : "OpenAI-style"
      } provider`;
    const fix = wanted === "anthropic"
      ? "set llm.provider: anthropic (or custom with api: anthropic)"
      : "set llm.provider: openai (or custom with api: openai, an endpoint with the Responses API)";
    throw new SandboxError(
      "usage",
      `Agent "${agent}" speaks the ${
        wanted === "anthropic" ? "Anthropic Messages" : "OpenAI Responses"
      } API, but ${hint}`,
      {
        detail: `To run ${agent}, ${fix}`,
      },
    );
  }
}
