/**
 * Codex's `codex exec --json` events as `AgenticMessage`s.
 *
 * The grammar (codex-rs/exec/src/exec_events.rs, checked against 0.169.0's output):
 * - `thread.started {thread_id}` (the session), `turn.started`, `turn.completed {usage}`,
 *   `turn.failed {error: {message}}`, and `error {message}`, which Codex also uses for
 *   recoverable trouble ("Reconnecting... 2/5"), so it ends nothing by itself.
 * - `item.started` / `item.updated` / `item.completed {item: {id, type, ...}}` with item types:
 *   `agent_message {text}` and `reasoning {text}` (sent as `thinking`, as the worker sends
 *   assistant text), `command_execution {command, aggregated_output, exit_code, status}`,
 *   `file_change {changes: [{path, kind}], status}`, `mcp_tool_call {server, tool, arguments,
 *   result, error, status}`, `web_search {query}`, `collab_tool_call {tool, prompt, status}`
 *   (each a `tool_call` when it starts and a `tool_result` with the same id when it completes),
 *   `todo_list {items: [{text, completed}]}` and `plan {text}` (sent as `thinking`), and
 *   `error {message}` (a warning: a diagnostic, not a message).
 * The result is the last agent message of a completed turn (or the failure of a failed one),
 * sent when the output ends, with the usage summed over the turns after it.
 */
import type { AgenticMessageInit, DriverUsage } from "../run/protocol.ts";
import { count, type EventTranslator, isObject, type JsonObject, str, sum } from "./translate.ts";
import { costOf, roundUsd } from "../run/prices.ts";

/** Tool names on the wire for Codex's item types, in the seeds' vocabulary where it has one. */
export const CODEX_TOOL_NAMES: Readonly<Record<string, string>> = {
  command_execution: "run_shell_command",
  file_change: "apply_patch",
  web_search: "web_search",
};

export interface CodexTranslatorOptions {
  /** The model Codex was told to use (its events do not name it). */
  model?: string;
  /** Codex's warnings (non-fatal error items and events), for stderr. */
  onDiagnostic?: (message: string) => void;
  /** The clock, for the usage's duration (tests pass a fake). */
  now?: () => number;
}

export class CodexTranslator implements EventTranslator {
  readonly #model: string | null;
  readonly #onDiagnostic: (message: string) => void;
  readonly #now: () => number;
  readonly #started: number;
  #session: string | null = null;
  /** Items whose `tool_call` went out, so a completion without a start still pairs up. */
  readonly #called = new Set<string>();
  #lastMessage: string | null = null;
  #completedTurns = 0;
  #failure: string | null = null;
  #lastError: string | null = null;
  #input: number | undefined;
  #cached: number | undefined;
  #cacheWrite: number | undefined;
  #output: number | undefined;

  constructor(options: CodexTranslatorOptions = {}) {
    this.#model = options.model ?? null;
    this.#onDiagnostic = options.onDiagnostic ?? (() => {});
    this.#now = options.now ?? (() => performance.now());
    this.#started = this.#now();
  }

  event(event: JsonObject): { messages: AgenticMessageInit[]; known: boolean } {
    switch (event.type) {
      case "thread.started":
        this.#session = str(event.thread_id) ?? this.#session;
        return { messages: [], known: true };
      case "turn.started":
        return { messages: [], known: true };
      case "turn.completed":
        this.#completedTurns++;
        this.#addUsage(event.usage);
        return { messages: [], known: true };
      case "turn.failed": {
        const error = isObject(event.error) ? str(event.error.message) : undefined;
        this.#failure = error ?? this.#lastError ?? "the turn failed";
        return { messages: [], known: true };
      }
      case "error": {
        const message = str(event.message);
        if (message) {
          this.#lastError = message;
          this.#onDiagnostic(message);
        }
        return { messages: [], known: true };
      }
      case "item.started":
      case "item.updated":
      case "item.completed":
        return isObject(event.item) && typeof event.item.id === "string"
          ? this.#item(event.type, event.item)
          : { messages: [], known: false };
      default:
        return { messages: [], known: false };
    }
  }

  end(): AgenticMessageInit[] {
    // Neither completed nor failed: Codex died mid-turn. The driver reports that with its exit
    // code and stderr, which say more than anything here could.
    if (this.#completedTurns === 0 && this.#failure === null) return [];
    const result: AgenticMessageInit = this.#failure !== null
      ? {
        type: "result",
        content: `Codex failed: ${this.#failure}`,
        is_error: true,
        ...this.#common(),
      }
      : { type: "result", content: this.#lastMessage ?? "", ...this.#common() };
    return [result, { type: "usage", model: this.#model, usage: this.#usage() }];
  }

  #common(): Pick<AgenticMessageInit, "session_id" | "model"> {
    return { session_id: this.#session, model: this.#model };
  }

  #addUsage(usage: unknown): void {
    if (!isObject(usage)) return;
    this.#input = sum(this.#input, count(usage.input_tokens));
    this.#cached = sum(this.#cached, count(usage.cached_input_tokens));
    this.#cacheWrite = sum(this.#cacheWrite, count(usage.cache_write_input_tokens));
    this.#output = sum(this.#output, count(usage.output_tokens));
  }

  #usage(): Partial<DriverUsage> {
    return {
      // OpenAI counts cached input within input_tokens, as the wire does.
      input_tokens: this.#input ?? null,
      output_tokens: this.#output ?? null,
      cache_read_tokens: this.#cached ?? null,
      cache_creation_tokens: this.#cacheWrite ?? null,
      // Codex reports no cost: the price table's, for the model it was told to use (null when the
      // table does not know it, never a guess).
      cost_usd: this.#cost(),
      duration_ms: Math.max(0, Math.round(this.#now() - this.#started)),
      // Codex does not say how many model calls a turn took.
      num_turns: null,
      model: this.#model,
    };
  }

  #cost(): number | null {
    if (this.#input === undefined || this.#output === undefined) return null;
    const tokens = {
      input: this.#input,
      output: this.#output,
      cacheRead: this.#cached,
      cacheWrite: this.#cacheWrite,
    };
    const cost = costOf(this.#model, tokens);
    return cost === null ? null : roundUsd(cost);
  }

  #item(phase: string, item: JsonObject): { messages: AgenticMessageInit[]; known: boolean } {
    const id = item.id as string;
    const completed = phase === "item.completed";
    switch (item.type) {
      case "agent_message": {
        const text = str(item.text);
        if (!completed || text === undefined) return { messages: [], known: true };
        this.#lastMessage = text;
        return {
          messages: text.trim() ? [{ type: "thinking", content: text, ...this.#common() }] : [],
          known: true,
        };
      }
      case "reasoning":
      case "plan": {
        const text = str(item.text);
        if (!completed || !text?.trim()) return { messages: [], known: true };
        return { messages: [{ type: "thinking", content: text, ...this.#common() }], known: true };
      }
      case "todo_list": {
        // The plan as it stands when set or changed; its completion (at the turn's end) repeats it.
        if (completed || !Array.isArray(item.items)) return { messages: [], known: true };
        const lines = item.items.filter(isObject).map((t) =>
          `- [${t.completed === true ? "x" : " "}] ${str(t.text) ?? ""}`
        );
        return {
          messages: [{
            type: "thinking",
            content: `Plan:\n${lines.join("\n")}`,
            ...this.#common(),
          }],
          known: true,
        };
      }
      case "error": {
        const message = str(item.message);
        if (completed && message) this.#onDiagnostic(message);
        return { messages: [], known: true };
      }
      case "command_execution":
      case "file_change":
      case "mcp_tool_call":
      case "web_search":
      case "collab_tool_call":
        return { messages: this.#tool(id, item, completed, phase === "item.updated"), known: true };
      default:
        return { messages: [], known: false };
    }
  }

  /** A tool item: its call when first seen, its result when completed. */
  #tool(id: string, item: JsonObject, completed: boolean, update: boolean): AgenticMessageInit[] {
    const messages: AgenticMessageInit[] = [];
    const name = toolName(item);
    if (!this.#called.has(id) && (!update || completed)) {
      this.#called.add(id);
      messages.push({
        type: "tool_call",
        tool_name: name,
        tool_input: toolInput(item),
        tool_call_id: id,
        ...this.#common(),
      });
    }
    if (completed) {
      const { output, isError } = toolOutcome(item);
      messages.push({
        type: "tool_result",
        tool_name: name,
        tool_output: output,
        tool_call_id: id,
        is_error: isError,
        ...this.#common(),
      });
    }
    return messages;
  }
}

function toolName(item: JsonObject): string {
  if (item.type === "mcp_tool_call") {
    return `mcp__${str(item.server) ?? "unknown"}__${str(item.tool) ?? "unknown"}`;
  }
  if (item.type === "collab_tool_call") return str(item.tool) ?? "collab_tool_call";
  return CODEX_TOOL_NAMES[item.type as string] ?? String(item.type);
}

function toolInput(item: JsonObject): Record<string, unknown> {
  switch (item.type) {
    case "command_execution":
      return { command: str(item.command) ?? "" };
    case "file_change":
      return { changes: Array.isArray(item.changes) ? item.changes : [] };
    case "mcp_tool_call":
      return isObject(item.arguments) ? item.arguments : { arguments: item.arguments ?? null };
    case "web_search":
      return { query: str(item.query) ?? "" };
    default:
      return { prompt: str(item.prompt) ?? null };
  }
}

function toolOutcome(item: JsonObject): { output: string; isError: boolean } {
  const failed = item.status === "failed" || item.status === "declined";
  switch (item.type) {
    case "command_execution": {
      const exit = typeof item.exit_code === "number" ? item.exit_code : null;
      return {
        output: str(item.aggregated_output) ?? "",
        isError: failed || (exit !== null && exit !== 0),
      };
    }
    case "file_change": {
      const changes = Array.isArray(item.changes) ? item.changes.filter(isObject) : [];
      const lines = changes.map((c) => `${str(c.kind) ?? "change"} ${str(c.path) ?? ""}`);
      return { output: `${failed ? "Failed" : "Applied"}: ${lines.join(", ")}`, isError: failed };
    }
    case "mcp_tool_call": {
      const error = isObject(item.error) ? str(item.error.message) : undefined;
      if (error !== undefined) return { output: error, isError: true };
      const result = isObject(item.result) ? item.result : {};
      const content = Array.isArray(result.content) ? result.content : [];
      const text = content.map((
        b,
      ) => (isObject(b) && typeof b.text === "string" ? b.text : JSON.stringify(b))).join("\n");
      return { output: text || JSON.stringify(result.structured_content ?? null), isError: failed };
    }
    case "web_search":
      return { output: JSON.stringify(item.action ?? null), isError: failed };
    default:
      return { output: JSON.stringify(item.agents_states ?? null), isError: failed };
  }
}
