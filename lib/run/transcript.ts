/** A readable rendering of agent messages, for a terminal (`--format pretty`). */
import type { AgenticMessage } from "./protocol.ts";

const MAX_SHOWN = 2_000;

function clip(text: string): string {
  return text.length > MAX_SHOWN ? `${text.slice(0, MAX_SHOWN)}… (${text.length - MAX_SHOWN} more characters)` : text;
}

function indent(text: string): string {
  return text.split("\n").map((line) => `    ${line}`).join("\n");
}

/** One message as a few lines of text. */
export function renderMessage(message: AgenticMessage): string {
  switch (message.type) {
    case "thinking":
      return `· ${clip(message.content ?? "")}`;
    case "tool_call":
      return `→ ${message.tool_name}(${clip(JSON.stringify(message.tool_input ?? {}))})`;
    case "tool_result":
      return `${message.is_error ? "✗" : "←"} ${message.tool_name ?? "result"}\n${indent(clip(message.tool_output ?? ""))}`;
    case "result":
      return `${message.is_error ? "✗ failed" : "✓ done"}: ${clip(message.content ?? "")}`;
    case "usage": {
      const u = message.usage;
      if (!u) return "usage: unknown";
      return `usage: ${u.input_tokens ?? "?"} in / ${u.output_tokens ?? "?"} out tokens, ${u.num_turns ?? "?"} turns, ${
        u.duration_ms === null ? "?" : `${(u.duration_ms / 1000).toFixed(1)} s`
      }${u.model ? `, ${u.model}` : ""}`;
    }
  }
}
