/**
 * `sandbox run agentic --interactive`: an agent CLI's own TUI in a sandbox, as a terminal session
 * (docs/sessions.md): durable, `attach`/`stop`, with --repo its work back as a branch. The same
 * guarantees as a headless run: the key (or subscription token) stays in the credential proxy on
 * the host, egress goes through the allowlist, the repository's agent configuration is used only
 * when trusted. Checked here, before anything starts: the agent, its API, the key, the flags.
 */
import { SandboxError } from "../lib/errors.ts";
import type { Profile } from "../lib/config.ts";
import type { ShellRepo } from "../lib/session/shell_repo.ts";
import type { SessionSpec } from "../lib/session/protocol.ts";
import { type Invocation, note, profileFor } from "./context.ts";
import type { RunFlags } from "./run_action.ts";
import { openTerminalSession } from "./shell_command.ts";

export interface InteractiveFlags extends RunFlags {
  interactive?: boolean;
  detach?: boolean;
}

/** Flags of a headless run that a TUI session does not take: the prompt is typed in its terminal. */
const HEADLESS_ONLY: [keyof InteractiveFlags, string][] = [
  ["promptFile", "--prompt-file"],
  ["instructionsFile", "--instructions-file"],
  ["record", "--record"],
  ["format", "--format"],
  ["timeout", "--timeout"],
  ["cwd", "--cwd"],
  ["base", "--base"],
  ["keepWorktree", "--keep-worktree"],
  ["push", "--push"],
  ["lifecycleEvents", "--lifecycle-events"],
  ["maxTokens", "--max-tokens"],
  ["maxCost", "--max-cost"],
  ["maxRequests", "--max-requests"],
  ["maxEgress", "--max-egress"],
];

export async function interactiveAction(
  opts: InteractiveFlags,
  command: Invocation,
): Promise<void> {
  const given = HEADLESS_ONLY.filter(([key]) => opts[key] !== undefined).map(([, flag]) => flag);
  if (given.length > 0) {
    throw new SandboxError(
      "usage",
      `--interactive does not take ${given.join(", ")}: type the prompt in the agent's terminal`,
    );
  }
  if (opts.model?.startsWith("replay:")) {
    throw new SandboxError("usage", "--interactive does not replay a recording: -m replay:FILE");
  }
  const profile = await profileFor(command, opts.profile);
  const { isAgentCli } = await import("../lib/agents/packages.ts");
  const agent = opts.agent ?? profile.llm.agent;
  if (!isAgentCli(agent)) {
    throw new SandboxError(
      "usage",
      `--interactive needs an agent CLI: --agent claude-code or codex (the built-in worker "${agent}" has no terminal UI)`,
    );
  }
  await openTerminalSession(opts, command, {
    what: "sandbox run agentic --interactive",
    argv: [],
    prepare: (profile, repo) => prepareAgent(profile, repo, { agent, model: opts.model }),
  });
}

/** The agent's API and key checked, its trusted project configuration found: the spec's part. */
async function prepareAgent(
  profile: Profile,
  repo: ShellRepo | undefined,
  options: { agent: "claude-code" | "codex"; model?: string },
): Promise<Partial<SessionSpec>> {
  const [{ checkAgentRun }, { keySourceFor, llmTarget }, { KeyStore, describeKeySource }] =
    await Promise.all([
      import("../lib/agents/agent_cli.ts"),
      import("../lib/proxy/llm_providers.ts"),
      import("../lib/keys.ts"),
    ]);
  const keys = new KeyStore();
  const { upstream } = llmTarget(profile.llm, keys);
  checkAgentRun(options.agent, {
    mode: "agentic",
    sandboxMode: profile.sandbox.mode,
    api: upstream.kind,
    profile: profile.name,
    replay: false,
  });
  // The key is read here only to fail now, not in the agent's first call (and to tell a ChatGPT
  // sign-in from a key): the supervisor reads it again for its credential proxy, on the host.
  const source = keySourceFor(profile.llm);
  let key: string;
  try {
    key = await keys.resolve(source);
  } catch (error) {
    if (!(error instanceof SandboxError) || error.code !== "config_invalid") throw error;
    throw new SandboxError(
      "config_invalid",
      `Cannot start profile "${profile.name}": ${error.message}`,
      {
        detail: "env" in source
          ? `Set ${source.env}, or choose another source with profiles.${profile.name}.llm.key`
          : `Check that ${describeKeySource(source)} prints the key`,
      },
    );
  }
  if (options.agent === "codex") {
    const { checkCodexSignIn } = await import("../lib/agents/interactive.ts");
    checkCodexSignIn(profile.name, upstream.baseUrl, key);
  }
  const { checkAgentProjectConfig, describeIgnored } = await import(
    "../lib/agents/project_config.ts"
  );
  const config = await checkAgentProjectConfig(options.agent, repo?.local);
  for (const line of describeIgnored(options.agent, config)) note(line);
  return {
    agent: { name: options.agent, model: options.model, trustedConfig: config.trusted },
  };
}
