/**
 * The worker's wire protocol: one `AgenticMessage` JSON object per line (NDJSON), wire-compatible
 * with the Python orchestrator's `AgenticMessage` / `DriverUsage` models.
 *
 * - Writing: every field is serialized, absent values as `null` (never omitted), in a fixed order;
 *   `tool_output` is cut to `MAX_TOOL_OUTPUT_CHARS`.
 * - Reading: strict and fail-fast. A line that is not JSON, not an object, of an unknown `type`, or
 *   that fails the schema raises `ProtocolError` at once with its line number; no line is skipped
 *   and nothing after the bad line is read. Lenient only where the Python models are: a missing
 *   field reads as `null` (`is_error` as `false`) and unknown keys are dropped. A blank line
 *   (empty or whitespace only) carries no message and is passed over, as most NDJSON readers do;
 *   it still counts for line numbers.
 */
import { z } from "zod";
import { SandboxError } from "../errors.ts";
import { LineTooLongError, MAX_LINE_CHARS, readLines } from "../lines.ts";

/** `tool_output` is cut to this many characters when encoded. */
export const MAX_TOOL_OUTPUT_CHARS = 10_000;
/** How much of a bad line is quoted in a `ProtocolError`. */
const QUOTED_LINE_CHARS = 200;

/** The five message types, in the order a run typically produces them. */
export const MESSAGE_TYPES = ["thinking", "tool_call", "tool_result", "result", "usage"] as const;
export type AgenticMessageType = (typeof MESSAGE_TYPES)[number];

const count = z.number().int().nonnegative().nullable().default(null);

/** Usage of one run; every field is `null` when unknown. */
export const DriverUsageSchema = z.object({
  input_tokens: count,
  output_tokens: count,
  cache_read_tokens: count,
  cache_creation_tokens: count,
  cost_usd: z.number().nonnegative().nullable().default(null),
  duration_ms: z.number().nonnegative().nullable().default(null),
  num_turns: count,
  model: z.string().nullable().default(null),
});
export type DriverUsage = z.output<typeof DriverUsageSchema>;

const text = z.string().nullable().default(null);

/** One event of a run, as sent on the wire. */
export const AgenticMessageSchema = z.object({
  type: z.enum(MESSAGE_TYPES),
  content: text,
  tool_name: text,
  tool_input: z.record(z.string(), z.unknown()).nullable().default(null),
  tool_output: text,
  tool_call_id: text,
  session_id: text,
  is_error: z.boolean().default(false),
  model: text,
  usage: DriverUsageSchema.nullable().default(null),
});
export type AgenticMessage = z.output<typeof AgenticMessageSchema>;

/** What a producer gives `agenticMessage`: the type, plus any fields it knows. */
export type AgenticMessageInit =
  & { type: AgenticMessageType }
  & Partial<Omit<AgenticMessage, "type" | "usage">>
  & { usage?: Partial<DriverUsage> | null };

/** A complete `DriverUsage`, unknown fields as `null`. */
export function driverUsage(init: Partial<DriverUsage> = {}): DriverUsage {
  return {
    input_tokens: init.input_tokens ?? null,
    output_tokens: init.output_tokens ?? null,
    cache_read_tokens: init.cache_read_tokens ?? null,
    cache_creation_tokens: init.cache_creation_tokens ?? null,
    cost_usd: init.cost_usd ?? null,
    duration_ms: init.duration_ms ?? null,
    num_turns: init.num_turns ?? null,
    model: init.model ?? null,
  };
}

/** A complete `AgenticMessage`: absent fields `null`, `is_error` false, keys in wire order. */
export function agenticMessage(init: AgenticMessageInit): AgenticMessage {
  return {
    type: init.type,
    content: init.content ?? null,
    tool_name: init.tool_name ?? null,
    tool_input: init.tool_input ?? null,
    tool_output: init.tool_output ?? null,
    tool_call_id: init.tool_call_id ?? null,
    session_id: init.session_id ?? null,
    is_error: init.is_error ?? false,
    model: init.model ?? null,
    usage: init.usage ? driverUsage(init.usage) : null,
  };
}

/** One message as one JSON line (no trailing newline), every field present. */
export function encodeMessage(message: AgenticMessageInit): string {
  const full = agenticMessage(message);
  if (full.tool_output !== null) {
    full.tool_output = truncate(full.tool_output, MAX_TOOL_OUTPUT_CHARS);
  }
  return JSON.stringify(full);
}

/** `text` cut to at most `maxChars` UTF-16 units, never inside a surrogate pair. */
function truncate(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  const last = text.charCodeAt(maxChars - 1);
  const end = last >= 0xd800 && last <= 0xdbff ? maxChars - 1 : maxChars;
  return text.slice(0, end);
}

/** The worker's output broke the protocol. `lineNumber` is 1-based. */
export class ProtocolError extends SandboxError {
  override name = "ProtocolError";
  readonly lineNumber: number;
  /** The offending line, cut to a few hundred characters ("" for an overlong line). */
  readonly line: string;

  constructor(lineNumber: number, line: string, problem: string, options?: ErrorOptions) {
    const quoted = line.length > QUOTED_LINE_CHARS ? `${line.slice(0, QUOTED_LINE_CHARS)}…` : line;
    const shown = quoted ? `: ${quoted}` : "";
    super(
      "worker_failed",
      `Invalid worker message on line ${lineNumber}: ${problem}${shown}`,
      options,
    );
    this.lineNumber = lineNumber;
    this.line = quoted;
  }
}

/** Parse one line; raises `ProtocolError` naming `lineNumber` if it is not a valid message. */
export function decodeMessage(line: string, lineNumber = 1): AgenticMessage {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (error) {
    throw new ProtocolError(lineNumber, line, "not valid JSON", { cause: error });
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ProtocolError(lineNumber, line, "not a JSON object");
  }
  const type = (value as { type?: unknown }).type;
  if (typeof type !== "string") throw new ProtocolError(lineNumber, line, `missing "type"`);
  if (!(MESSAGE_TYPES as readonly string[]).includes(type)) {
    throw new ProtocolError(lineNumber, line, `unknown type ${JSON.stringify(type)}`);
  }
  const parsed = AgenticMessageSchema.safeParse(value);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ");
    throw new ProtocolError(lineNumber, line, issues, { cause: parsed.error });
  }
  return parsed.data;
}

export interface DecodeOptions {
  /** Cap on one line; a longer line raises `ProtocolError`. Default `MAX_LINE_CHARS`. */
  maxLineChars?: number;
}

/**
 * Messages from NDJSON lines, read one line at a time. Raises `ProtocolError` on the first bad
 * line without reading further.
 */
export async function* decodeMessages(
  lines: AsyncIterable<string> | Iterable<string>,
  options: DecodeOptions = {},
): AsyncGenerator<AgenticMessage> {
  const maxChars = options.maxLineChars ?? MAX_LINE_CHARS;
  let lineNumber = 0;
  try {
    for await (const line of lines) {
      lineNumber++;
      if (line.length > maxChars) {
        throw new ProtocolError(lineNumber, "", `line longer than ${maxChars} characters`);
      }
      if (line.trim() === "") continue;
      yield decodeMessage(line, lineNumber);
    }
  } catch (error) {
    if (error instanceof LineTooLongError) {
      throw new ProtocolError(lineNumber + 1, "", error.message.toLowerCase(), { cause: error });
    }
    throw error;
  }
}

/** Messages from a byte stream of NDJSON (UTF-8), with the line cap applied while reading. */
export function decodeMessageStream(
  bytes: ReadableStream<Uint8Array>,
  options: DecodeOptions = {},
): AsyncGenerator<AgenticMessage> {
  const maxChars = options.maxLineChars ?? MAX_LINE_CHARS;
  return decodeMessages(readLines(bytes, maxChars), { maxLineChars: maxChars });
}
