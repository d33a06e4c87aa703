/**
 * JSON Schema for `worker generate --schema`: loading the schema file and checking the model's
 * output against it (with @cfworker/json-schema: no code generation, no network, drafts 4, 7,
 * 2019-09 and 2020-12, chosen by `$schema`, 2020-12 when absent).
 */
import { type Schema, type SchemaDraft, Validator } from "@cfworker/json-schema";

/** How many validation problems a failure message lists. */
const MAX_LISTED_PROBLEMS = 5;
const WRAPPER_KEYWORDS = new Set(["properties", "items", "prefixItems", "allOf", "$ref", "false"]);

export interface JsonSchema {
  /** The file it came from, for messages. */
  file: string;
  schema: Schema;
  /** A name for the provider's `response_format` (letters, digits, `_`, `-`). */
  name: string;
}

export type JsonCheck = { ok: true; value: unknown } | { ok: false; problem: string };

/** Read and parse a JSON Schema file. Raises `Error` with a message naming the file. */
export async function loadJsonSchema(file: string): Promise<JsonSchema> {
  let text: string;
  try {
    text = await Deno.readTextFile(file);
  } catch (error) {
    throw new Error(`Cannot read schema "${file}": ${(error as Error).message}`);
  }
  return parseJsonSchema(text, file);
}

/** Parse the text of the JSON Schema file `file`. Raises `Error` with a message naming the file. */
export function parseJsonSchema(text: string, file: string): JsonSchema {
  let schema: unknown;
  try {
    schema = JSON.parse(text);
  } catch (error) {
    throw new Error(`Schema "${file}" is not valid JSON: ${(error as Error).message}`);
  }
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
    throw new Error(`Schema "${file}" is not a JSON Schema object`);
  }
  const title = (schema as { title?: unknown }).title;
  const base = typeof title === "string" && title
    ? title
    : file.replace(/^.*\//, "").replace(/\.json$/, "");
  const name = base.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 64) || "result";
  return { file, schema: schema as Schema, name };
}

/** Parse `text` as JSON (a single surrounding Markdown code fence is tolerated) and validate it. */
export function checkJson(text: string, schema: JsonSchema): JsonCheck {
  const unfenced = text.trim().replace(/^```(?:json)?\s*\n([\s\S]*?)\n?```$/, "$1");
  let value: unknown;
  try {
    value = JSON.parse(unfenced);
  } catch (error) {
    return { ok: false, problem: `Model output is not valid JSON: ${(error as Error).message}` };
  }
  const validator = new Validator(schema.schema, draftOf(schema.schema), false);
  const outcome = validator.validate(value);
  if (outcome.valid) return { ok: true, value };
  // Errors of container keywords only say "a child failed"; the child's own error is listed too.
  const leaves = outcome.errors.filter((e) => !WRAPPER_KEYWORDS.has(e.keyword));
  const problems = (leaves.length ? leaves : outcome.errors)
    .slice(0, MAX_LISTED_PROBLEMS)
    .map((e) => `${e.instanceLocation}: ${e.error.replace(/\.$/, "")}`);
  return {
    ok: false,
    problem: `Model output does not match the schema "${schema.file}": ${problems.join("; ")}`,
  };
}

function draftOf(schema: Schema): SchemaDraft {
  const id = schema.$schema ?? "";
  if (id.includes("draft-04")) return "4";
  if (id.includes("draft-06") || id.includes("draft-07")) return "7";
  if (id.includes("2019-09")) return "2019-09";
  return "2020-12";
}
