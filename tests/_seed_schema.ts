/**
 * The seeds' wire format, written out by hand (not taken from lib/protocol.ts), so that tests check
 * the code against the contract rather than against itself.
 */

/** Every key of an AgenticMessage, in wire order; all present on every line, null when absent. */
export const MESSAGE_KEYS: readonly string[] = [
  "type",
  "content",
  "tool_name",
  "tool_input",
  "tool_output",
  "tool_call_id",
  "session_id",
  "is_error",
  "model",
  "usage",
];

/** Every key of a DriverUsage. */
export const USAGE_KEYS: readonly string[] = [
  "input_tokens",
  "output_tokens",
  "cache_read_tokens",
  "cache_creation_tokens",
  "cost_usd",
  "duration_ms",
  "num_turns",
  "model",
];
