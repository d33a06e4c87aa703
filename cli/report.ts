/** How an error reaches the user: one line on stderr, its detail, and a stack only for our own bugs. */
import { ConfigError, SandboxError } from "../lib/errors.ts";
import { note } from "./context.ts";

export function reportError(error: unknown): void {
  if (error instanceof SandboxError) {
    note(`error: ${error.message}`);
    if (error.detail) { for (const line of error.detail.split("\n")) note(`  ${line}`); }
    if (error instanceof ConfigError) note("  (see README.md, Configuration)");
    if (Deno.env.get("SANDBOX_DEBUG")) console.error(error);
    return;
  }
  // Not one of ours: a bug, so the stack is worth showing.
  note(`internal error: ${error instanceof Error ? error.stack ?? error.message : String(error)}`);
}
