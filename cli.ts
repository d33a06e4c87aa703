/**
 * The `sandbox` command line: parse arguments, call `lib/`, turn errors into exit codes.
 * This is the only module that exits the process. The commands live in `cli/`.
 */
import { Command, CommanderError } from "commander";
import denoJson from "./deno.json" with { type: "json" };
import { cliName } from "./lib/cli_name.ts";
import { EXIT, exitCodeFor, SandboxError } from "./lib/errors.ts";
import { registerConfigCommands } from "./cli/config_commands.ts";
import { registerCpCommand } from "./cli/cp_command.ts";
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

const CONFIG_FLAGS = "-c, --config <file>";
const CONFIG_HELP = "configuration file (default: ./sandbox.yaml, the repo root's, or ~/.config/sandbox/config.yaml)";

function buildProgram(): Command {
  // Named as the user runs it (`./sandbox` from a checkout), so that the usage lines are true.
  const program = new Command(cliName())
    .description("Run AI coding agents in isolated Docker sandboxes")
    .version(VERSION, "-V, --version")
    .option(CONFIG_FLAGS, CONFIG_HELP)
    .enablePositionalOptions()
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride()
    .configureOutput({ writeErr: (text) => Deno.stderr.writeSync(encoder.encode(text)) })
    .hook("preAction", checkNamedConfigFirst);
  registerSandboxCommands(program);
  registerCpCommand(program);
  registerProxyCommand(program);
  registerRunCommand(program);
  registerRunsCommands(program);
  registerConfigCommands(program);
  registerTrustCommand(program);
  acceptGlobalOptionsAnywhere(program);
  return program;
}

/**
 * `--config` is accepted after the subcommand too (`sandbox up -c x.yaml`): every command that
 * acts gets it as its own option, and `globals()` prefers the nearest one. (The program's own
 * options stay positional, which `exec`'s pass-through of the command's arguments needs.)
 */
function acceptGlobalOptionsAnywhere(command: Command): void {
  for (const sub of command.commands) {
    if (sub.commands.length > 0) acceptGlobalOptionsAnywhere(sub);
    else sub.option(CONFIG_FLAGS, CONFIG_HELP);
  }
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
