/**
 * A readable rendering of agent messages, for a terminal (`--format pretty`, `logs`).
 *
 * Everything in a message is the agent's (or its tools') text, and a terminal obeys control
 * sequences in what it prints: `ESC ]0;…BEL` retitles the window, `ESC [2J` clears it, a bare CR
 * overwrites a line, OSC 52 writes the clipboard. So the rendering shows every control character
 * as a visible escape and keeps only newline and tab meaningful.
 */
import type { AgenticMessage } from "./protocol.ts";

const MAX_SHOWN = 2_000;

function clip(text: string): string {
  return text.length > MAX_SHOWN
    ? `${text.slice(0, MAX_SHOWN)}… (${text.length - MAX_SHOWN} more characters)`
    : text;
}

function indent(text: string): string {
  return text.split("\n").map((line) => `    ${line}`).join("\n");
}

const NAMED: Record<string, string> = {
  "\0": "\\0",
  "\x07": "\\a",
  "\b": "\\b",
  "\v": "\\v",
  "\f": "\\f",
  "\r": "\\r",
  "\x1b": "\\e",
};

/**
 * `text` with every C0 control (except newline and tab), DEL, C1 control (U+0080–U+009F, which
 * some terminals obey like `ESC`-sequences) and explicit-direction formatting character
 * (U+202A–U+202E, U+2066–U+2069, which can make shown text read differently from what ran)
 * replaced by a visible escape: `\e`, `\a`, `\r`, `\x7f`, `\u009b`, `\u202e`. CRLF line ends
 * become plain newlines.
 */
export function escapeControls(text: string): string {
  return text.replace(/\r\n/g, "\n").replace(
    // deno-lint-ignore no-control-regex -- finding control characters is the point
    /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/g,
    (c) => {
      const code = c.charCodeAt(0);
      return NAMED[c] ??
        (code < 0x80
          ? `\\x${code.toString(16).padStart(2, "0")}`
          : `\\u${code.toString(16).padStart(4, "0")}`);
    },
  );
}

/** One message as a few lines of text, control characters escaped. */
export function renderMessage(message: AgenticMessage): string {
  return escapeControls(renderRaw(message));
}

function renderRaw(message: AgenticMessage): string {
  switch (message.type) {
    case "thinking":
      return `· ${clip(message.content ?? "")}`;
    case "tool_call":
      return `→ ${message.tool_name}(${clip(JSON.stringify(message.tool_input ?? {}))})`;
    case "tool_result":
      return `${message.is_error ? "✗" : "←"} ${message.tool_name ?? "result"}\n${
        indent(clip(message.tool_output ?? ""))
      }`;
    case "result":
      return `${message.is_error ? "✗ failed" : "✓ done"}: ${clip(message.content ?? "")}`;
    case "usage": {
      const u = message.usage;
      if (!u) return "usage: unknown";
      return `usage: ${u.input_tokens ?? "?"} in / ${u.output_tokens ?? "?"} out tokens, ${
        u.num_turns ?? "?"
      } turns, ${u.duration_ms === null ? "?" : `${(u.duration_ms / 1000).toFixed(1)} s`}${
        u.model ? `, ${u.model}` : ""
      }`;
    }
  }
}
