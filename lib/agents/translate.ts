/**
 * From an agent CLI's own JSON events to the seeds' `AgenticMessage` lines.
 *
 * Translation runs on the host, in the driver, over the lines the agent prints inside the
 * sandbox: the agent's output is untrusted input here exactly as the worker's is, and every
 * message leaves through the same strict codec (`encodeMessage` then `decodeMessage`), so what a
 * consumer reads is the seeds' format whatever the agent printed. An event the translator does not
 * know (a new kind in a later version, a line that is not JSON) never breaks the stream: it is
 * handed to `onEvent` unknown, for the run log, and skipped.
 */
import {
  type AgenticMessage,
  type AgenticMessageInit,
  decodeMessage,
  encodeMessage,
} from "../run/protocol.ts";

export type JsonObject = Record<string, unknown>;

/** One agent's event grammar. A translator lives for one run. */
export interface EventTranslator {
  /** Messages for one event, and whether the event was one this translator knows. */
  event(event: JsonObject): { messages: AgenticMessageInit[]; known: boolean };
  /** Messages once the agent's output has ended: a result held back until then, the usage. */
  end(): AgenticMessageInit[];
}

export interface TranslateHooks {
  /** Every line the agent printed, with whether it was understood (for the run log). */
  onEvent?: (line: string, known: boolean) => void | Promise<void>;
}

/** Messages from an agent's stdout lines. */
export async function* translateAgentLines(
  lines: AsyncIterable<string>,
  translator: EventTranslator,
  hooks: TranslateHooks = {},
): AsyncGenerator<AgenticMessage> {
  for await (const line of lines) {
    if (line.trim() === "") continue;
    let event: unknown;
    try {
      event = JSON.parse(line);
    } catch {
      event = undefined;
    }
    if (!isObject(event)) {
      await hooks.onEvent?.(line, false);
      continue;
    }
    const { messages, known } = translator.event(event);
    await hooks.onEvent?.(line, known);
    for (const message of messages) yield toWire(message);
  }
  for (const message of translator.end()) yield toWire(message);
}

/** Through the codec: every field present, `tool_output` cut to size, the schema checked. */
function toWire(message: AgenticMessageInit): AgenticMessage {
  return decodeMessage(encodeMessage(message));
}

export function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function str(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}

/** A non-negative integer count, or undefined (never a guess). */
export function count(value: unknown): number | undefined {
  return typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : undefined;
}

/** A sum of counts where any reported one counts; undefined when none was reported. */
export function sum(...values: (number | undefined)[]): number | undefined {
  const reported = values.filter((v): v is number => v !== undefined);
  return reported.length === 0 ? undefined : reported.reduce((a, b) => a + b, 0);
}

/** Text of a tool result's content: a string, or the text of its blocks (other blocks named). */
export function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) {
    return content === undefined || content === null ? "" : JSON.stringify(content);
  }
  return content.map((block) => {
    if (typeof block === "string") return block;
    if (isObject(block) && typeof block.text === "string") return block.text;
    return isObject(block) && typeof block.type === "string" ? `[${block.type}]` : "";
  }).join("\n");
}
