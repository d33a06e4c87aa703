/**
 * The `sandbox` command's entry. A plain foreground `sandbox run` first starts the process that
 * holds the run (cli/supervise_first.ts) and waits for it, before anything else loads; every other
 * command line is cli/main.ts.
 */
import { superviseRunFirst } from "./cli/supervise_first.ts";

if (import.meta.main) {
  const code = await superviseRunFirst(Deno.args);
  // As cli/main.ts's `exitSoon`: the exit on the next turn, once this module's evaluation is done.
  if (code !== undefined) setTimeout(() => Deno.exit(code), 0);
  else await (await import("./cli/main.ts")).start(Deno.args);
}
