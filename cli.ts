/**
 * The `sandbox` command line: parse arguments, call `lib/`, turn errors into exit codes.
 * This is the only module that exits the process. The commands live in `cli/`.
 *
 * Start-up loads only what the command needs: `run` and `exec` in their plain forms are read by
 * the fast path (cli/fast_path.ts) and never load commander; every other command line builds the
 * commander program, whose actions import the engine's modules when they run.
 */
import "./cli/defer_yaml.ts";
import type { Command } from "commander";
import denoJson from "./deno.json" with { type: "json" };
import { cliName } from "./lib/cli_name.ts";
import { EXIT, exitCodeFor, SandboxError } from "./lib/errors.ts";
import {
  checkNamedConfigFirst,
  cliState,
  type Invocation,
  note,
  onSecondInterrupt,
  signal,
  stdout,
} from "./cli/context.ts";
import { type FastCommand, parseFastPath } from "./cli/fast_path.ts";
import { stopSpinner } from "./cli/progress.ts";
import { reportError } from "./cli/report.ts";
import { trace } from "./lib/trace.ts";

const VERSION = denoJson.version;
const encoder = new TextEncoder();

const CONFIG_FLAGS = "-c, --config <file>";
const CONFIG_HELP =
  "configuration file (default: ./sandbox.yaml, the repo root's, or ~/.config/sandbox/config.yaml)";

/** The whole command line interface, with every command's options and help. */
export async function buildProgram(): Promise<Command> {
  const [
    { Command },
    { registerConfigCommands },
    { registerCpCommand },
    { registerDoctorCommand },
    { registerEgressCommands },
    { registerMcpCommand },
    { registerProxyCommand },
    { registerRunCommand },
    { registerRunsCommands },
    { registerSandboxCommands },
    { registerShellCommands },
    { registerTrustCommand },
  ] = await Promise.all([
    import("commander"),
    import("./cli/config_commands.ts"),
    import("./cli/cp_command.ts"),
    import("./cli/doctor_command.ts"),
    import("./cli/egress_command.ts"),
    import("./cli/mcp_command.ts"),
    import("./cli/proxy_command.ts"),
    import("./cli/run_command.ts"),
    import("./cli/runs_commands.ts"),
    import("./cli/sandbox_commands.ts"),
    import("./cli/shell_command.ts"),
    import("./cli/trust_command.ts"),
  ]);
  // Named as the user runs it (`./sandbox` from a checkout), so that the usage lines are true.
  const program = new Command(cliName())
    .description("Run AI coding agents in isolated Docker sandboxes")
    .version(VERSION, "-V, --version")
    .option(CONFIG_FLAGS, CONFIG_HELP)
    .enablePositionalOptions()
    .showHelpAfterError(`${PREFIX}   (run with --help for usage)`)
    .exitOverride()
    .configureOutput({
      writeErr: (text) => Deno.stderr.writeSync(encoder.encode(text)),
      // Usage errors look like every other error: `sandbox: error: ...`, what follows indented.
      outputError: (text, write) => write(prefixed(text)),
    })
    .hook("preAction", checkNamedConfigFirst);
  registerSandboxCommands(program);
  registerCpCommand(program);
  registerProxyCommand(program);
  registerEgressCommands(program);
  registerDoctorCommand(program);
  registerMcpCommand(program);
  registerRunCommand(program);
  registerRunsCommands(program);
  registerShellCommands(program);
  registerConfigCommands(program);
  registerTrustCommand(program);
  acceptGlobalOptionsAnywhere(program);
  return program;
}

const PREFIX = "sandbox:";

/** commander's error text, each line prefixed as `note()` does: the first as the error, the rest as its detail. */
function prefixed(text: string): string {
  return text.trimEnd().split("\n").map((line, i) => `${PREFIX} ${i === 0 ? "" : "  "}${line}\n`)
    .join("");
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
  trace("cli: modules loaded");
  try {
    const fast = parseFastPath(args);
    return await outcomeOf(() => fast ? runFast(fast) : runProgram(args));
  } finally {
    stopSpinner();
  }
}

/** `run` or `exec` as commander would run them, without commander. */
async function runFast(fast: FastCommand): Promise<void> {
  const invocation: Invocation = { optsWithGlobals: () => ({ config: fast.config }) };
  // As commander's preAction hook does: a named configuration is checked before anything else.
  await checkNamedConfigFirst(undefined, invocation);
  if (fast.kind === "run") {
    const { runAction } = await import("./cli/run_action.ts");
    cliState.exitCode = await runAction(fast.mode, fast.opts, invocation);
  } else {
    const { execAction } = await import("./cli/exec_action.ts");
    await execAction(fast.argv, fast.opts, invocation);
  }
}

/** commander stopped: help or version shown (exit code 0), or a usage mistake it reported. */
class CommanderExit extends Error {
  constructor(readonly exitCode: number) {
    super("commander exited");
  }
}

async function runProgram(args: string[]): Promise<void> {
  const [{ CommanderError }, program] = await Promise.all([import("commander"), buildProgram()]);
  try {
    await program.parseAsync(args, { from: "user" });
  } catch (error) {
    if (error instanceof CommanderError) throw new CommanderExit(error.exitCode);
    throw error;
  }
}

/** Run the command; its exit code, with every error reported as the user should see it. */
async function outcomeOf(command: () => Promise<void>): Promise<number> {
  try {
    await command();
    await stdout.flush();
    return cliState.endedBySignal ? EXIT.ok : signal.aborted ? EXIT.interrupted : cliState.exitCode;
  } catch (error) {
    // A stdout already broken (a closed pipe) cannot take the rest; the error reported below is
    // what the user needs, and it goes to stderr.
    await stdout.flush().catch(() => {});
    if (error instanceof CommanderExit) {
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

/**
 * Ends the process with `code` on the next turn of the event loop, not inside the entry module's
 * evaluation: Deno writes a module's V8 code cache only once its evaluation is complete, so an exit
 * from within it (as `Deno.exit(await main())` was) left the bundled CLI, one 1.8 MB module,
 * compiling itself on every start that never reached a later turn — every `--version` and `--help`
 * (measured: ~12 ms of its ~60). The exit still does not wait for what is left open (keep-alive
 * sockets, signal listeners, library timers).
 */
export function exitSoon(code: number): void {
  setTimeout(() => Deno.exit(code), 0);
}

if (import.meta.main) {
  // A second Ctrl-C or SIGTERM ends the process at once, whatever the command is still doing.
  onSecondInterrupt(() => Deno.exit(EXIT.interrupted));
  exitSoon(await main(Deno.args));
}
