/**
 * The `sandbox` command's entry. A plain foreground `sandbox run` first starts the process that
 * holds the run (cli/supervise_first.ts) and waits for it, before anything else loads; every other
 * command line is cli/main.ts.
 */
import { superviseRunFirst, supervisesRun } from "./cli/supervise_first.ts";

/**
 * Import a module of this checkout by a specifier Deno cannot read ahead. A literal `import("…")`
 * makes Deno prepare that module's whole graph — all of the CLI, through its own lazy imports —
 * before this module runs (~15 ms), even in a process that never loads it: the foreground CLI of
 * a run, which only starts its supervisor and waits.
 */
function importLater(path: string): Promise<Record<string, unknown>> {
  return import(new URL(path, import.meta.url).href);
}

if (import.meta.main) {
  // A run's supervisor: the run's modules start loading now, beside the CLI's own (cli/run_action.ts
  // imports the same ones when it needs them). Only here: in a bundle (scripts/bundle_start.ts)
  // these imports would be copies of the bundle's modules.
  if (supervisesRun(Deno.args)) {
    for (
      const loading of [
        importLater("./lib/run/run.ts"),
        importLater("./lib/run/protocol.ts"),
        importLater("./lib/run/transcript.ts"),
      ]
    ) loading.catch(() => {}); // run_action.ts imports them again, and reports a failure there
  }
  const code = await superviseRunFirst(Deno.args);
  // As cli/main.ts's `exitSoon`: the exit on the next turn, once this module's evaluation is done.
  if (code !== undefined) setTimeout(() => Deno.exit(code), 0);
  else {
    const main = await importLater("./cli/main.ts") as typeof import("./cli/main.ts");
    await main.start(Deno.args);
  }
}
