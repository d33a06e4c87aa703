/** `sandbox run agentic|generate`: an agent in the sandbox, its messages on stdout. */
import { type Command, Option } from "commander";
import { cliState } from "./context.ts";
import { SandboxError } from "../lib/errors.ts";
import { profileOption } from "./options.ts";
import type { RunFlags } from "./run_action.ts";
import { AGENTS } from "../lib/agents/packages.ts";

export function registerRunCommand(program: Command): void {
  const runCommand = program.command("run").description(
    "run an agent in the sandbox, streaming its messages",
  );
  for (const mode of ["agentic", "generate"] as const) {
    const sub = runCommand.command(mode)
      .description(
        mode === "agentic"
          ? "run a tool-using coding agent; one AgenticMessage JSON per line on stdout"
          : "one structured-output LLM call; with --schema the result is JSON valid against it",
      )
      .option(
        "--prompt-file <file>",
        'the prompt ("-" reads stdin; required but with --interactive)',
      )
      .addOption(profileOption())
      .option(
        "-m, --model <model>",
        "model name, or replay:FILE to serve a recorded conversation (no key needed)",
      )
      .option(
        "--timeout <duration>",
        "stop the run after this long (default: the profile's resources.timeout)",
      )
      .option("--record <file>", "record the provider's responses to FILE, for replay later")
      .option("--max-tokens <n>", "budget: LLM input+output tokens for this run")
      .option("--max-cost <usd>", "budget: estimated LLM cost in USD for this run")
      .option("--max-requests <n>", "budget: LLM requests for this run")
      .option("--max-egress <size>", 'budget: bytes through the egress proxy, like "100m"')
      .option(
        "-d, --detach",
        "start the run (or the --interactive session) in the background and print its id (attach ID follows it, stop ID ends it)",
      )
      .option("--json", "with --detach: print the id as JSON")
      .addOption(
        new Option(
          "--format <format>",
          "output format (default: pretty on a terminal, else ndjson)",
        ).choices(["ndjson", "pretty"]),
      );
    if (mode === "agentic") addAgenticOptions(sub);
    else sub.option("--schema <file>", "JSON Schema the result must satisfy");
    sub.action(async (opts: RunFlags & { interactive?: boolean; detach?: boolean }, command) => {
      if (opts.interactive) {
        const { interactiveAction } = await import("./agent_session_command.ts");
        return await interactiveAction(opts, command);
      }
      if (opts.promptFile === undefined) {
        throw new SandboxError("usage", "required option '--prompt-file <file>' not specified");
      }
      const { runAction } = await import("./run_action.ts");
      cliState.exitCode = await runAction(mode, opts, command);
    });
  }
}

/** `run agentic`'s own options: the agent, its instructions, where it works, `--interactive`. */
function addAgenticOptions(sub: Command): void {
  sub.addOption(
    new Option(
      "--agent <agent>",
      "the agent: the built-in worker, or an agent CLI (default: the profile's llm.agent)",
    ).choices([...AGENTS]),
  )
    .option("--instructions-file <file>", "extra system instructions for the agent")
    .option(
      "--cwd <dir>",
      "mode none only: the host directory the agent works in (default: current)",
    )
    .option(
      "--repo <path|url>",
      "a git repository, a local path or an https:// URL: its committed base goes in, the agent's work comes back as a branch (pushed with --push)",
    )
    .option("--base <ref>", "with --repo: the commit to start from (default: HEAD)")
    .option("--branch <name>", "with --repo: the branch to create (default: sandbox/<run-id>)")
    .option("--keep-worktree", "with --repo: leave the run's worktree in the sandbox")
    .option(
      "--push",
      "with a remote --repo: push the run branch (the only ref the git proxy lets through)",
    )
    .option(
      "--lifecycle-events",
      "also print our own namespaced events (sandbox.branch) on stdout",
    )
    .option(
      "--interactive",
      "open the agent CLI's own terminal UI in the sandbox, as a session (see sandbox attach)",
    );
}
