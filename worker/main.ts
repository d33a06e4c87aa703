/**
 * The agent worker: runs inside the sandbox (or on the host in mode "none") and speaks the wire
 * protocol of `lib/protocol.ts` on stdout, nothing else; diagnostics go to stderr.
 *
 *   worker agentic  --prompt-file F [--instructions-file F] [--model M] [--cwd D] [--max-turns N]
 *   worker generate --prompt-file F [--schema F.json] [--model M]
 *
 * The LLM connection comes from the environment (see `llm.ts`). The prompt file is only read:
 * its owner (the host) deletes it. Exit codes: 0 once a result was emitted, even an `is_error`
 * one (a missing prompt file, a bad schema, an unreachable LLM, a failed agent are all results);
 * 2 for bad usage (nothing on stdout); 1 if a result could not be emitted at all.
 */
import { parseArgs } from "node:util";
import { Emitter } from "./emit.ts";
import { loadJsonSchema } from "./json_schema.ts";
import { describeError, llmSettings, scrubEnvironment } from "./llm.ts";

export const USAGE = `Usage:
  worker agentic  --prompt-file F [--instructions-file F] [--model M] [--cwd D] [--max-turns N]
  worker generate --prompt-file F [--schema F.json] [--model M]

Environment: SANDBOX_LLM_BASE_URL, SANDBOX_LLM_TOKEN, SANDBOX_LLM_MODEL, SANDBOX_LLM_API,
SANDBOX_LLM_MAX_RETRIES. Output: one AgenticMessage JSON object per line on stdout.`;

export type WorkerCommand =
  | { kind: "help" }
  | {
    kind: "agentic";
    promptFile: string;
    instructionsFile?: string;
    model?: string;
    cwd?: string;
    maxTurns?: number;
  }
  | { kind: "generate"; promptFile: string; schemaFile?: string; model?: string };

const FLAGS = {
  agentic: ["prompt-file", "instructions-file", "model", "cwd", "max-turns"],
  generate: ["prompt-file", "schema", "model"],
} as const;

/** Parse argv; raises `TypeError` with a usage message on bad input. */
export function parseWorkerArgs(args: readonly string[]): WorkerCommand {
  const [mode, ...rest] = args;
  if (mode === undefined || mode === "--help" || mode === "-h" || mode === "help") {
    return { kind: "help" };
  }
  if (mode !== "agentic" && mode !== "generate") {
    throw new TypeError(`Unknown mode "${mode}": expected "agentic" or "generate"`);
  }
  const options = Object.fromEntries(
    FLAGS[mode].map((name) => [name, { type: "string" as const }]),
  );
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({ args: [...rest], options, strict: true, allowPositionals: false }));
  } catch (error) {
    throw new TypeError(`Invalid arguments for "${mode}": ${(error as Error).message}`);
  }
  const value = (name: string) => values[name] as string | undefined;
  const promptFile = value("prompt-file");
  if (!promptFile) throw new TypeError(`Missing --prompt-file for "${mode}"`);
  if (mode === "generate") {
    return { kind: "generate", promptFile, schemaFile: value("schema"), model: value("model") };
  }
  const maxTurnsText = value("max-turns");
  const maxTurns = maxTurnsText === undefined ? undefined : Number(maxTurnsText);
  if (maxTurns !== undefined && (!Number.isInteger(maxTurns) || maxTurns < 1)) {
    throw new TypeError(`Invalid --max-turns "${maxTurnsText}": expected a positive integer`);
  }
  return {
    kind: "agentic",
    promptFile,
    instructionsFile: value("instructions-file"),
    model: value("model"),
    cwd: value("cwd"),
    maxTurns,
  };
}

/** Run the worker; returns the exit code. */
export async function main(args: readonly string[]): Promise<number> {
  let command: WorkerCommand;
  try {
    command = parseWorkerArgs(args);
  } catch (error) {
    console.error(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (command.kind === "help") {
    console.log(USAGE);
    return 0;
  }
  // stdout belongs to the protocol: a library that logs with console.log must not corrupt it.
  console.log = console.error;
  console.info = console.error;
  console.debug = console.error;

  const started = performance.now();
  const emit = new Emitter();
  const fallbackModel = command.model || Deno.env.get("SANDBOX_LLM_MODEL") || null;
  try {
    const givenEnv = Deno.env.toObject();
    const llm = llmSettings(givenEnv, command.model);
    scrubEnvironment();
    const prompt = await readInput(command.promptFile, "prompt");
    if (prompt.trim() === "") throw new Error(`The prompt file "${command.promptFile}" is empty`);
    if (command.kind === "agentic") {
      const cwd = workingDirectory(command.cwd);
      const instructions = command.instructionsFile
        ? await readInput(command.instructionsFile, "instructions")
        : undefined;
      // Loaded on demand: `generate` need not evaluate deepagents, LangGraph and LangSmith.
      const { runAgentic } = await import("./agentic.ts");
      const { maxTurns } = command;
      await runAgentic({ prompt, instructions, cwd, maxTurns, llm, toolEnv: givenEnv }, emit);
    } else {
      const schema = command.schemaFile ? await loadJsonSchema(command.schemaFile) : undefined;
      const { runGenerate } = await import("./generate.ts");
      await runGenerate({ prompt, schema, llm }, emit);
    }
    return 0;
  } catch (error) {
    if (emit.resultSent) {
      console.error(`worker: failed after the result: ${describeError(error)}`);
      return 1;
    }
    try {
      await emit.result(`Cannot run the worker: ${describeError(error)}`, {
        isError: true,
        model: fallbackModel,
      });
      await emit.usage({
        duration_ms: Math.round(performance.now() - started),
        num_turns: 0,
        model: fallbackModel,
      });
      return 0;
    } catch (emitError) {
      console.error(`worker: cannot emit a result: ${describeError(emitError)}`);
      return 1;
    }
  }
}

async function readInput(file: string, what: string): Promise<string> {
  try {
    return await Deno.readTextFile(file);
  } catch (error) {
    throw new Error(`Cannot read ${what} file "${file}": ${(error as Error).message}`);
  }
}

/** Enter `--cwd`, creating it if needed (saves the host a round trip into the sandbox). */
function workingDirectory(cwd: string | undefined): string {
  if (cwd === undefined) return Deno.cwd();
  try {
    Deno.mkdirSync(cwd, { recursive: true });
    Deno.chdir(cwd);
  } catch (error) {
    throw new Error(`Cannot use working directory "${cwd}": ${(error as Error).message}`);
  }
  return Deno.cwd();
}

if (import.meta.main) {
  const code = await main(Deno.args);
  // Keep-alive sockets and library timers must not hold the process open after the usage line.
  Deno.exit(code);
}
