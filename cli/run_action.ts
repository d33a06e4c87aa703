/**
 * What `sandbox run agentic|generate` does once its arguments are parsed (by commander, or by the
 * fast path that spares a run loading it: fast_path.ts).
 */
import { SandboxError } from "../lib/errors.ts";
import { MAX_PROMPT_BYTES, MAX_SCHEMA_BYTES, readInputText } from "../lib/input_file.ts";
import { cliName } from "../lib/cli_name.ts";
import type { JsonSchema } from "../worker/json_schema.ts";
import {
  configFor,
  type Invocation,
  note,
  parseTimeout,
  profileFor,
  signal,
  stdout,
} from "./context.ts";
import { progress } from "./progress.ts";
import { reportError } from "./report.ts";
import type { AgentName } from "../lib/agents/packages.ts";
import { type BudgetFlags, budgetFromFlags } from "./budget_flags.ts";

export interface RunFlags extends BudgetFlags {
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

const PROMPT = { what: "prompt file", stdin: "prompt on stdin", limitFor: "prompt" };
const INSTRUCTIONS = { what: "instructions file", stdin: "instructions on stdin" };

export async function runAction(
  mode: "agentic" | "generate",
  opts: RunFlags,
  command: Invocation,
): Promise<number> {
  // Loaded here, not at start-up (only the command that runs pays for its modules), while the
  // configuration and the prompt are read.
  const modules = Promise.all([
    import("../lib/run/run.ts"),
    import("../lib/run/protocol.ts"),
    import("../lib/run/transcript.ts"),
  ]);
  modules.catch(() => {}); // awaited below; a usage error first must not leave it unhandled
  const timeoutMs = parseTimeout(opts.timeout);
  const budget = budgetFromFlags(opts);
  if (!opts.repo && (opts.base || opts.branch || opts.keepWorktree || opts.push)) {
    throw new SandboxError("usage", "--base, --branch, --keep-worktree and --push need --repo");
  }
  const profile = await profileFor(command, opts.profile);
  const prompt = await readInputText(opts.promptFile, MAX_PROMPT_BYTES, PROMPT);
  const instructions = opts.instructionsFile
    ? await readInputText(opts.instructionsFile, MAX_PROMPT_BYTES, INSTRUCTIONS)
    : undefined;
  let schema: JsonSchema | undefined;
  if (opts.schema) {
    const text = await readInputText(opts.schema, MAX_SCHEMA_BYTES, { what: "schema" });
    try {
      const { parseJsonSchema } = await import("../worker/json_schema.ts");
      schema = parseJsonSchema(text, opts.schema);
    } catch (error) {
      throw new SandboxError("usage", (error as Error).message);
    }
  }
  const [{ runAgent }, { encodeMessage }, { renderMessage }] = await modules;
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
    budget,
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
  if (outcome.storeError) reportError(outcome.storeError);
  await applyRetention(command);
  return outcome.exitCode;
}

/** `state.retention`, when configured: finished runs past it go once this run has ended. */
async function applyRetention(command: Invocation): Promise<void> {
  const setting = (await configFor(command)).config.state?.retention;
  if (setting === undefined) return;
  // The run's output is complete before any time goes to pruning.
  await stdout.flush();
  try {
    const { pruneRuns, retentionPolicy } = await import("../lib/run/retention.ts");
    const report = await pruneRuns(retentionPolicy(setting));
    if (report.runs > 0) {
      const { formatBytes } = await import("../lib/units.ts");
      note(`state.retention removed ${report.runs} finished runs (${formatBytes(report.bytes)})`);
    }
  } catch (error) {
    // The run's own outcome stands; the records stay for the next run or `sandbox prune`.
    note(`warning: state.retention could not prune: ${(error as Error).message}`);
  }
}
