/**
 * A worker's job as the host hands it over on `worker serve`'s input: one JSON line holding the
 * prompt (so it never touches argv or a file), the run's variables (the session token among them:
 * a waiting worker holds none until its job arrives) and the options the argv form takes as flags.
 *
 * ```json
 * {"mode":"agentic","prompt":"…","env":{"SANDBOX_LLM_TOKEN":"…"},"cwd":"/workspace/runs/x"}
 * {"mode":"generate","prompt":"…","env":{…},"schema":{"name":"answer","file":"answer.json","schema":{…}}}
 * ```
 */
import type { JsonSchema } from "./json_schema.ts";

export interface WorkerJob {
  mode: "agentic" | "generate";
  prompt: string;
  /** Variables for this run: the LLM connection (see llm.ts) and what the agent's commands get. */
  env: Record<string, string>;
  /** agentic: the working directory (created when missing). */
  cwd?: string;
  /** agentic: extra system instructions. */
  instructions?: string;
  model?: string;
  /** agentic: stop with an error result after this many LLM calls. */
  maxTurns?: number;
  /** generate: the JSON Schema the result must satisfy (`file` names it in messages). */
  schema?: JsonSchema;
}

/** The longest job line accepted: a prompt, instructions and a schema, with room to spare. */
export const MAX_JOB_BYTES = 64 * 1024 * 1024;

/** The job in one JSON line; raises `TypeError` saying what is wrong. */
export function parseJob(line: string): WorkerJob {
  let raw: unknown;
  try {
    raw = JSON.parse(line);
  } catch (error) {
    throw new TypeError(`The job is not JSON: ${(error as Error).message}`);
  }
  if (!isObject(raw)) throw new TypeError("The job is not a JSON object");
  const { mode, prompt, env, cwd, instructions, model, maxTurns, schema } = raw;
  if (mode !== "agentic" && mode !== "generate") {
    throw new TypeError(
      `The job's mode is ${JSON.stringify(mode)}: expected "agentic" or "generate"`,
    );
  }
  if (typeof prompt !== "string") throw new TypeError("The job has no prompt");
  if (!isObject(env) || !Object.values(env).every((value) => typeof value === "string")) {
    throw new TypeError("The job's env is not an object of strings");
  }
  for (const [name, value] of Object.entries({ cwd, instructions, model })) {
    if (value !== undefined && value !== null && typeof value !== "string") {
      throw new TypeError(`The job's ${name} is not a string`);
    }
  }
  if (
    maxTurns !== undefined && maxTurns !== null &&
    !(Number.isInteger(maxTurns) && (maxTurns as number) >= 1)
  ) {
    throw new TypeError(
      `The job's maxTurns is ${JSON.stringify(maxTurns)}: expected a positive integer`,
    );
  }
  if (schema !== undefined && schema !== null) {
    if (
      !isObject(schema) || typeof schema.name !== "string" || typeof schema.file !== "string" ||
      !isObject(schema.schema)
    ) {
      throw new TypeError("The job's schema is not {name, file, schema}");
    }
  }
  const text = (value: unknown) => typeof value === "string" ? value : undefined;
  return {
    mode,
    prompt,
    env: env as Record<string, string>,
    cwd: text(cwd),
    instructions: text(instructions),
    model: text(model),
    maxTurns: typeof maxTurns === "number" ? maxTurns : undefined,
    schema: isObject(schema) ? schema as unknown as JsonSchema : undefined,
  };
}

/** The job as the line the host sends (newline included). */
export function encodeJob(job: WorkerJob): string {
  return JSON.stringify(job) + "\n";
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
