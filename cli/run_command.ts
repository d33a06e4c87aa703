/** `sandbox run agentic|generate`: an agent in the sandbox, its messages on stdout. */
import { type Command, Option } from "commander";
import { SandboxError } from "../lib/errors.ts";
import { cliName } from "../lib/cli_name.ts";
import { runAgent } from "../lib/run/run.ts";
import { encodeMessage } from "../lib/run/protocol.ts";
import { renderMessage } from "../lib/run/transcript.ts";
import { type JsonSchema, loadJsonSchema } from "../worker/json_schema.ts";
import {
  cliState,
  note,
  parseTimeout,
  profileFor,
  profileOption,
  readInput,
  signal,
  stdout,
} from "./context.ts";
import { progress } from "./progress.ts";
import { reportError } from "./report.ts";
import { type AgentName, AGENTS } from "../lib/agents/packages.ts";

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
      .requiredOption("--prompt-file <file>", 'the prompt ("-" reads stdin)')
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
      .addOption(
        new Option(
          "--format <format>",
          "output format (default: pretty on a terminal, else ndjson)",
        ).choices(["ndjson", "pretty"]),
      );
    if (mode === "agentic") {
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
        );
    } else {
      sub.option("--schema <file>", "JSON Schema the result must satisfy");
    }
    sub.action(async (opts: RunFlags, command: Command) => {
      cliState.exitCode = await runAction(mode, opts, command);
    });
  }
}

interface RunFlags {
  promptFile: string;
  profile?: string;
  model?: string;
  timeout?: string;
  record?: string;
  format?: "ndjson" | "pretty";
  instructionsFile?: string;
  cwd?: string;
  schema?: string;
  repo?: string;
  base?: string;
  branch?: string;
  keepWorktree?: boolean;
  push?: boolean;
  lifecycleEvents?: boolean;
  agent?: AgentName;
}

async function runAction(
  mode: "agentic" | "generate",
  opts: RunFlags,
  command: Command,
): Promise<number> {
  const timeoutMs = parseTimeout(opts.timeout);
  if (!opts.repo && (opts.base || opts.branch || opts.keepWorktree || opts.push)) {
    throw new SandboxError("usage", "--base, --branch, --keep-worktree and --push need --repo");
  }
  const profile = await profileFor(command, opts.profile);
  const prompt = await readInput(opts.promptFile, "prompt file");
  const instructions = opts.instructionsFile
    ? await readInput(opts.instructionsFile, "instructions file")
    : undefined;
  let schema: JsonSchema | undefined;
  if (opts.schema) {
    try {
      schema = await loadJsonSchema(opts.schema);
    } catch (error) {
      throw new SandboxError("usage", (error as Error).message);
    }
  }
  const pretty = (opts.format ?? (Deno.stdout.isTerminal() ? "pretty" : "ndjson")) === "pretty";
  const outcome = await runAgent({
    mode,
    prompt,
    profile,
    model: opts.model,
    instructions,
    schema,
    timeoutMs: timeoutMs ?? profile.resources.timeoutMs,
    record: opts.record,
    hostCwd: opts.cwd,
    agent: opts.agent,
    repo: opts.repo
      ? {
        path: opts.repo,
        base: opts.base,
        branch: opts.branch,
        keepWorktree: opts.keepWorktree,
        push: opts.push,
      }
      : undefined,
    onLifecycle: opts.lifecycleEvents ? (event) => stdout.json(event) : undefined,
    signal,
    onStart: (meta) =>
      note(
        `run ${meta.id} (profile ${meta.profile}, model ${meta.model}); replay with: ${cliName()} logs ${meta.id}`,
      ),
    onProgress: progress,
    onWorkerStderr: (line) => {
      if (Deno.env.get("SANDBOX_DEBUG")) note(`worker: ${line}`);
    },
    onEvent: async (message) => {
      await stdout.line(pretty ? renderMessage(message) : encodeMessage(message));
    },
  });
  if (outcome.error) reportError(outcome.error);
  return outcome.exitCode;
}
