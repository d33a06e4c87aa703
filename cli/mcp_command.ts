/** `sandbox mcp`: the MCP server on stdio (lib/mcp/server.ts); stdout carries only its protocol. */
import process from "node:process";
import type { Command } from "commander";
import { cliState, note, profileFor, signal } from "./context.ts";
import { profileOption } from "./options.ts";

export function registerMcpCommand(program: Command): void {
  program.command("mcp")
    .description(
      "serve sandboxes to an MCP client (Claude Code, Codex, an IDE) on stdio: environments with the repository checked out, whose work comes back as branches",
    )
    .addOption(profileOption())
    .option(
      "--repo <path>",
      "the git repository environments check out (default: the current directory's)",
      ".",
    )
    .action(async (opts: { profile?: string; repo: string }, command: Command) => {
      const { serveMcp } = await import("../lib/mcp/server.ts");
      const profile = await profileFor(command, opts.profile);
      await serveMcp({
        profile,
        repoPath: opts.repo,
        input: process.stdin,
        output: process.stdout,
        signal,
        onProgress: note,
      });
      // Stopped by a signal or by the client leaving: both are how a server ends.
      cliState.endedBySignal = true;
    });
}
