/**
 * The `sandbox` command line: parse arguments, call `lib/`, turn errors into exit codes.
 * This is the only module that exits the process. The commands live in `cli/`.
 */
import { Command, CommanderError } from "commander";
import denoJson from "./deno.json" with { type: "json" };
import { EXIT, exitCodeFor, SandboxError } from "./lib/errors.ts";
import { registerConfigCommands } from "./cli/config_commands.ts";
import { checkNamedConfigFirst, cliState, note, signal, stdout } from "./cli/context.ts";
import { registerProxyCommand } from "./cli/proxy_command.ts";
import { stopSpinner } from "./cli/progress.ts";
import { reportError } from "./cli/report.ts";
import { registerRunCommand } from "./cli/run_command.ts";
import { registerRunsCommands } from "./cli/runs_commands.ts";
import { registerSandboxCommands } from "./cli/sandbox_commands.ts";
import { registerTrustCommand } from "./cli/trust_command.ts";

const VERSION = denoJson.version;
const encoder = new TextEncoder();

function buildProgram(): Command {
  const program = new Command("sandbox")
    .description("Run AI coding agents in isolated Docker sandboxes")
    .version(VERSION, "-V, --version")
    .option(
      "-c, --config <file>",
      "configuration file (default: ./sandbox.yaml, the repo root's, or ~/.config/sandbox/config.yaml)",
    )
    .enablePositionalOptions()
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride()
    .configureOutput({ writeErr: (text) => Deno.stderr.writeSync(encoder.encode(text)) })
    .hook("preAction", checkNamedConfigFirst);
  registerSandboxCommands(program);
  registerProxyCommand(program);
  registerRunCommand(program);
  registerRunsCommands(program);
  registerConfigCommands(program);
  registerTrustCommand(program);
  return program;
}
export async function main(args: string[]): Promise<number> {
  const program = buildProgram();
  try {
    return await runProgram(program, args);
  } finally {
    stopSpinner();
  }
}

async function runProgram(program: Command, args: string[]): Promise<number> {
  try {
    await program.parseAsync(args, { from: "user" });
    await stdout.flush();
    return cliState.endedBySignal ? EXIT.ok : signal.aborted ? EXIT.interrupted : cliState.exitCode;
  } catch (error) {
    await stdout.flush().catch(() => {});
    if (error instanceof CommanderError) {
      // Help and version are successes; anything else commander rejects is a usage error.
      return error.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    if (signal.aborted && !(error instanceof SandboxError && error.code !== "interrupted")) {
      note("interrupted");
      return EXIT.interrupted;
    }
    reportError(error);
    return exitCodeFor(error);
  }
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
