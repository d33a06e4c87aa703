/**
 * The fast path for the two commands whose start-up is on every agent's critical path, `run` and
 * `exec`: their usual command lines are read here, without loading commander (a CommonJS package:
 * loading it costs ~30 ms of every start).
 *
 * Only the plain forms are recognised — options as `--name value`, `--name=value` or `-x value`,
 * each given at most once — and anything else (help, a short option
 * glued to its value, an unknown or repeated option, a missing value or prompt file, a `--format`
 * outside its choices…) returns `undefined`: commander then parses the line, with its own errors
 * and help. So the fast path never decides differently from commander; it only decides sooner
 * (tests/unit/fast_path_test.ts compares the two on every form). The option tables below mirror
 * the commands' definitions in run_command.ts and sandbox_commands.ts; an option missing here just
 * sends its command lines to commander.
 */
import type { ExecFlags } from "./exec_action.ts";
import type { RunFlags } from "./run_action.ts";
import { AGENTS } from "../lib/agents/packages.ts";

export type FastCommand =
  | { kind: "run"; mode: "agentic" | "generate"; opts: RunFlags; config?: string }
  | { kind: "exec"; argv: string[]; opts: ExecFlags; config?: string };

interface OptionSpec {
  /** The key commander gives the value (camelCase of the long name). */
  key: string;
  /** Takes a value (else a flag: true). */
  value: boolean;
  choices?: readonly string[];
  /** Repeatable: values collected in a list. */
  repeat?: boolean;
}

function table(entries: [names: string[], spec: OptionSpec][]): Map<string, OptionSpec> {
  const map = new Map<string, OptionSpec>();
  for (const [names, spec] of entries) for (const name of names) map.set(name, spec);
  return map;
}

const value = (key: string, choices?: readonly string[]): OptionSpec => ({
  key,
  value: true,
  choices,
});
const flag = (key: string): OptionSpec => ({ key, value: false });

/** Options every run mode has (run_command.ts), and `--config` (accepted after the command too). */
const RUN_COMMON: [string[], OptionSpec][] = [
  [["--prompt-file"], value("promptFile")],
  [["-p", "--profile"], value("profile")],
  [["-m", "--model"], value("model")],
  [["--timeout"], value("timeout")],
  [["--record"], value("record")],
  [["--max-tokens"], value("maxTokens")],
  [["--max-cost"], value("maxCost")],
  [["--max-requests"], value("maxRequests")],
  [["--max-egress"], value("maxEgress")],
  [["--format"], value("format", ["ndjson", "pretty"])],
  [["-c", "--config"], value("config")],
];

const RUN_OPTIONS = {
  agentic: table([
    ...RUN_COMMON,
    [["--agent"], value("agent", AGENTS)],
    [["--instructions-file"], value("instructionsFile")],
    [["--cwd"], value("cwd")],
    [["--repo"], value("repo")],
    [["--base"], value("base")],
    [["--branch"], value("branch")],
    [["--keep-worktree"], flag("keepWorktree")],
    [["--push"], flag("push")],
    [["--lifecycle-events"], flag("lifecycleEvents")],
  ]),
  generate: table([...RUN_COMMON, [["--schema"], value("schema")]]),
};

const EXEC_OPTIONS = table([
  [["-p", "--profile"], value("profile")],
  [["--repo"], value("repo")],
  [["--cwd"], value("cwd")],
  [["-e", "--env"], { key: "env", value: true, repeat: true }],
  [["--timeout"], value("timeout")],
  [["-c", "--config"], value("config")],
]);

/** Options of the program itself, before the command. */
const PROGRAM_OPTIONS = table([[["-c", "--config"], value("config")]]);

/**
 * Read options from `args` at `start` until a token that is not one (returned as `next`), or
 * undefined when a token is one this path leaves to commander.
 */
function readOptions(
  args: readonly string[],
  start: number,
  options: Map<string, OptionSpec>,
): { values: Record<string, unknown>; next: number } | undefined {
  const values: Record<string, unknown> = {};
  let i = start;
  while (i < args.length) {
    const arg = args[i];
    if (arg === "--" || !arg.startsWith("-") || arg === "-") break;
    const eq = arg.startsWith("--") ? arg.indexOf("=") : -1;
    const name = eq === -1 ? arg : arg.slice(0, eq);
    const spec = options.get(name);
    if (!spec) return undefined;
    let given: string | true;
    if (!spec.value) {
      if (eq !== -1) return undefined;
      given = true;
      i += 1;
    } else if (eq !== -1) {
      given = arg.slice(eq + 1);
      i += 1;
    } else {
      // As commander: the next argument is the value, whatever it looks like (`--prompt-file -`).
      const next = args[i + 1];
      if (next === undefined) return undefined;
      given = next;
      i += 2;
    }
    if (typeof given === "string" && spec.choices && !spec.choices.includes(given)) {
      return undefined;
    }
    if (spec.repeat) {
      values[spec.key] = [...(values[spec.key] as string[] | undefined ?? []), given];
    } else {
      if (spec.key in values) return undefined;
      values[spec.key] = given;
    }
  }
  return { values, next: i };
}

/** The command line as the fast path reads it, or undefined: commander's turn. */
export function parseFastPath(args: readonly string[]): FastCommand | undefined {
  const program = readOptions(args, 0, PROGRAM_OPTIONS);
  if (!program) return undefined;
  // commander's optsWithGlobals(): the program's --config, when given, wins over the command's.
  const globalConfig = program.values.config as string | undefined;
  const command = args[program.next];
  if (command === "run") {
    const mode = args[program.next + 1];
    if (mode !== "agentic" && mode !== "generate") return undefined;
    const parsed = readOptions(args, program.next + 2, RUN_OPTIONS[mode]);
    // Anything left (an argument, `--`) is commander's to refuse.
    if (!parsed || parsed.next !== args.length) return undefined;
    const { config, ...opts } = parsed.values;
    if (typeof opts.promptFile !== "string") return undefined;
    return {
      kind: "run",
      mode,
      opts: opts as unknown as RunFlags,
      config: globalConfig ?? config as string | undefined,
    };
  }
  if (command === "exec") {
    const parsed = readOptions(args, program.next + 1, EXEC_OPTIONS);
    if (!parsed) return undefined;
    const rest = args.slice(parsed.next);
    const argv = rest[0] === "--" ? rest.slice(1) : rest;
    if (argv.length === 0) return undefined;
    const { config, ...given } = parsed.values;
    const opts: ExecFlags = { cwd: "/workspace", env: [], ...given } as ExecFlags;
    return { kind: "exec", argv, opts, config: globalConfig ?? config as string | undefined };
  }
  return undefined;
}
