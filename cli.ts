/**
 * The `sandbox` command's entry. A plain foreground `sandbox run` first starts the process that
 * holds the run (cli/supervise_first.ts) and waits for it, before anything else loads; every other
 * command line is cli/main.ts.
 */
import { superviseRunFirst, supervisesRun } from "./cli/supervise_first.ts";

if (import.meta.main) {
  // A run's supervisor: the run's modules start loading now, beside the CLI's own (cli/run_action.ts
  // imports the same ones when it needs them). Only here: in a bundle (scripts/bundle_start.ts)
  // these imports would be copies of the bundle's modules.
  if (supervisesRun(Deno.args)) {
    for (
      const loading of [
        import("./lib/run/run.ts"),
        import("./lib/run/protocol.ts"),
        import("./lib/run/transcript.ts"),
      ]
    ) loading.catch(() => {}); // run_action.ts imports them again, and reports a failure there
  }
  const code = await superviseRunFirst(Deno.args);
  // As cli/main.ts's `exitSoon`: the exit on the next turn, once this module's evaluation is done.
  if (code !== undefined) setTimeout(() => Deno.exit(code), 0);
  else await (await import("./cli/main.ts")).start(Deno.args);
}
