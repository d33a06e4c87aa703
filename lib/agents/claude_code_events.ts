/**
 * Claude Code's `--output-format stream-json --verbose` events as `AgenticMessage`s.
 *
 * The grammar (checked against 2.1.330's output):
 * - `{"type":"system","subtype":"init", session_id, model, tools, ...}` first; other system
 *   subtypes (status, compaction, hooks) carry nothing for the wire.
 * - `{"type":"assistant","message":{content:[blocks]}}`: `text` becomes `thinking` (as the
 *   worker sends assistant text), `thinking` too, `tool_use` becomes `tool_call` (name, input, id).
 * - `{"type":"user","message":{content:[{type:"tool_result", tool_use_id, content, is_error}]}}`:
 *   each becomes a `tool_result` with the id and name of its call.
 * - `{"type":"result", subtype, is_error, result, total_cost_usd, usage, num_turns, duration_ms}`
 *   last: the one `result`, then `usage` (input tokens counting the cached ones, as the worker
 *   counts them; the cost is Claude Code's own figure).
 * Sub-agent (Task) steps carry `parent_tool_use_id` and are translated the same way: their ids
 * are unique within the session.
 */
import type { AgenticMessageInit } from "../run/protocol.ts";
import {
  contentText,
  count,
  type EventTranslator,
  isObject,
  type JsonObject,
  str,
  sum,
} from "./translate.ts";

export interface ClaudeCodeTranslatorOptions {
  /** The model asked for; the init event's model replaces it when given. */
  model?: string;
  /** Tool names as the wire reports them (e.g. the seeds' normalised names). */
  toolName?: (raw: string) => string;
}

export class ClaudeCodeTranslator implements EventTranslator {
  #model: string | null;
  #session: string | null = null;
  readonly #toolNames = new Map<string, string>();
  readonly #normalise: (raw: string) => string;
  #resultSent = false;

  constructor(options: ClaudeCodeTranslatorOptions = {}) {
    this.#model = options.model ?? null;
    this.#normalise = options.toolName ?? ((raw) => raw);
  }

  event(event: JsonObject): { messages: AgenticMessageInit[]; known: boolean } {
    switch (event.type) {
      case "system":
        if (event.subtype === "init") {
          this.#session = str(event.session_id) ?? this.#session;
          this.#model = str(event.model) ?? this.#model;
        }
        return { messages: [], known: event.subtype === "init" };
      case "assistant":
        return this.#assistant(event);
      case "user":
        return this.#user(event);
      case "result":
        return this.#result(event);
      default:
        return { messages: [], known: false };
    }
  }

  end(): AgenticMessageInit[] {
    // No result event: the CLI died. The driver reports that with its exit code and stderr.
    return [];
  }

  #common(): Pick<AgenticMessageInit, "session_id" | "model"> {
    return { session_id: this.#session, model: this.#model };
  }

  #assistant(event: JsonObject): { messages: AgenticMessageInit[]; known: boolean } {
    const message = event.message;
    if (!isObject(message) || !Array.isArray(message.content)) {
      return { messages: [], known: false };
    }
    const messages: AgenticMessageInit[] = [];
    let known = true;
    for (const block of message.content) {
      if (!isObject(block)) continue;
      if (block.type === "text" && typeof block.text === "string" && block.text.trim() !== "") {
        messages.push({ type: "thinking", content: block.text, ...this.#common() });
      } else if (
        block.type === "thinking" && typeof block.thinking === "string" &&
        block.thinking.trim() !== ""
      ) {
        messages.push({ type: "thinking", content: block.thinking, ...this.#common() });
      } else if (
        (block.type === "tool_use" || block.type === "server_tool_use") &&
        typeof block.id === "string"
      ) {
        const name = this.#normalise(str(block.name) ?? "unknown");
        this.#toolNames.set(block.id, name);
        messages.push({
          type: "tool_call",
          tool_name: name,
          tool_input: isObject(block.input) ? block.input : {},
          tool_call_id: block.id,
          ...this.#common(),
        });
      } else if (
        typeof block.type === "string" && block.type.endsWith("_tool_result") &&
        typeof block.tool_use_id === "string"
      ) {
        // A server-side tool's result arrives in the assistant's own message.
        messages.push(this.#toolResult(block));
      } else if (
        block.type !== "redacted_thinking" && block.type !== "text" && block.type !== "thinking"
      ) {
        known = false;
      }
    }
    return { messages, known };
  }

  #user(event: JsonObject): { messages: AgenticMessageInit[]; known: boolean } {
    const message = event.message;
    if (!isObject(message)) return { messages: [], known: false };
    // A plain user turn (the prompt, a replayed message) has string content: nothing to send.
    if (!Array.isArray(message.content)) return { messages: [], known: true };
    const messages = message.content
      .filter((block): block is JsonObject =>
        isObject(block) && block.type === "tool_result" && typeof block.tool_use_id === "string"
      )
      .map((block) => this.#toolResult(block));
    return { messages, known: true };
  }

  #toolResult(block: JsonObject): AgenticMessageInit {
    const id = block.tool_use_id as string;
    return {
      type: "tool_result",
      tool_name: this.#toolNames.get(id) ?? null,
      tool_output: contentText(block.content),
      tool_call_id: id,
      is_error: block.is_error === true,
      ...this.#common(),
    };
  }

  #result(event: JsonObject): { messages: AgenticMessageInit[]; known: boolean } {
    // Exactly one result per run: a second one (a resumed turn) stays in the run log only.
    if (this.#resultSent) return { messages: [], known: false };
    this.#resultSent = true;
    this.#session = str(event.session_id) ?? this.#session;
    const isError = event.is_error === true ||
      (typeof event.subtype === "string" && event.subtype.startsWith("error"));
    const content = str(event.result) ?? errorText(event);
    const usage = isObject(event.usage) ? event.usage : {};
    const cacheRead = count(usage.cache_read_input_tokens);
    const cacheCreation = count(usage.cache_creation_input_tokens);
    const cost = event.total_cost_usd;
    return {
      known: true,
      messages: [
        { type: "result", content, is_error: isError, ...this.#common() },
        {
          type: "usage",
          model: this.#model,
          usage: {
            // Anthropic counts cached input apart; the wire counts it in, as the worker does.
            input_tokens: sum(count(usage.input_tokens), cacheRead, cacheCreation) ?? null,
            output_tokens: count(usage.output_tokens) ?? null,
            cache_read_tokens: cacheRead ?? null,
            cache_creation_tokens: cacheCreation ?? null,
            cost_usd: typeof cost === "number" && Number.isFinite(cost) && cost >= 0 ? cost : null,
            duration_ms: typeof event.duration_ms === "number" && event.duration_ms >= 0
              ? event.duration_ms
              : null,
            num_turns: count(event.num_turns) ?? null,
            model: this.#model,
          },
        },
      ],
    };
  }
}

/** What an error result without a `result` text says (max turns, an execution error). */
function errorText(event: JsonObject): string {
  const errors = Array.isArray(event.errors)
    ? event.errors.filter((e) => typeof e === "string")
    : [];
  const subtype = str(event.subtype) ?? "error";
  return [`Claude Code ended with ${subtype}`, ...errors].join(": ");
}
