/**
 * The program of an interactive agent session (`sandbox run agentic --interactive`): the agent
 * CLI's TUI (lib/agents/interactive.ts), its start-up files written into the session's sandbox,
 * its environment the session's (proxy URLs and token, never a key) less what the TUI must not
 * see.
 */
import { INTERACTIVE_HIDDEN_ENV, interactiveLaunch } from "../agents/interactive.ts";
import type { RunSandbox } from "../sandbox/provider.ts";
import type { SessionAgent } from "./protocol.ts";

/** Where the TUI starts without a repository: the sandbox's workspace. */
const DEFAULT_CWD = "/workspace";

export async function agentProgram(
  sandbox: RunSandbox,
  agent: SessionAgent,
  session: { env: Record<string, string>; cwd?: string; runId: string },
): Promise<{ argv: string[]; env: Record<string, string> }> {
  const launch = interactiveLaunch(agent.name, {
    env: session.env,
    model: agent.model,
    runId: session.runId,
    cwd: session.cwd ?? DEFAULT_CWD,
    trustedConfig: agent.trustedConfig,
  });
  for (const file of launch.files) {
    await sandbox.provider.writeFile(file.path, file.content, { mode: 0o600 });
  }
  const env: Record<string, string> = { ...session.env, ...launch.env };
  for (const name of INTERACTIVE_HIDDEN_ENV[agent.name]) delete env[name];
  return { argv: launch.argv, env };
}
