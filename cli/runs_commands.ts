/** `sandbox runs` and `sandbox logs`: past and live runs, from the durable run logs. */
import { type Command, Option } from "commander";
import { SandboxError } from "../lib/errors.ts";
import { cliName } from "../lib/cli_name.ts";
import { table } from "../lib/output.ts";
import { cliState, signal, stdout } from "./context.ts";
import { jsonOption } from "./options.ts";

export function registerRunsCommands(program: Command): void {
  program.command("runs")
    .description("past and live runs: id, profile, status, started, duration, tokens, exit, branch")
    .addOption(jsonOption())
    .action(async (opts: { json?: boolean }) => {
      const [{ listRuns }, { describeRecovery }] = await Promise.all([
        import("../lib/run/run_log.ts"),
        import("../lib/run/recovery.ts"),
      ]);
      const runs = await listRuns();
      if (opts.json) return void await stdout.json(runs);
      if (runs.length === 0) {
        return void await stdout.line(
          `no runs yet (start one with: ${cliName()} run agentic --prompt-file FILE)`,
        );
      }
      await stdout.line(table(
        ["RUN", "PROFILE", "MODE", "STATUS", "STARTED", "DURATION", "TOKENS", "EXIT", "BRANCH"],
        runs.map((r) => [
          r.id,
          r.profile,
          r.mode,
          r.storeError
            ? `${r.status} (log incomplete)`
            : describeRecovery(r.extra?.recovery)
            ? `${r.status} (${describeRecovery(r.extra?.recovery)})`
            : r.status,
          r.startedAt.replace("T", " ").slice(0, 19),
          r.durationMs === null ? "-" : `${(r.durationMs / 1000).toFixed(1)}s`,
          r.usage ? `${r.usage.input_tokens ?? 0}/${r.usage.output_tokens ?? 0}` : "-",
          r.exitCode === null ? "-" : String(r.exitCode),
          typeof r.extra?.branch === "string" ? r.extra.branch : "-",
        ]),
      ));
    });

  program.command("logs")
    .description("replay a run's events; --follow tails a live run")
    .argument("<run-id>", "as listed by sandbox runs")
    .option("-f, --follow", "keep reading until the run ends")
    .addOption(
      new Option("--format <format>", "output format (default: pretty on a terminal, else ndjson)")
        .choices(["ndjson", "pretty"]),
    )
    .action(async (id: string, opts: { follow?: boolean; format?: string }) => {
      const [{ readEventBatches, readRun }, { decodeMessage }, { renderMessage }] = await Promise
        .all([
          import("../lib/run/run_log.ts"),
          import("../lib/run/protocol.ts"),
          import("../lib/run/transcript.ts"),
        ]);
      if (!await readRun(id)) {
        throw new SandboxError("usage", `No run "${id}"`, {
          detail: `List runs with: ${cliName()} runs`,
        });
      }
      const pretty = (opts.format ?? (Deno.stdout.isTerminal() ? "pretty" : "ndjson")) === "pretty";
      for await (const lines of readEventBatches(id, { follow: opts.follow, signal })) {
        const text = pretty ? lines.map((line) => renderMessage(decodeMessage(line))) : lines;
        await stdout.write(text.join("\n") + "\n");
        if (stdout.closed) break;
      }
      if (signal.aborted) cliState.endedBySignal = true;
    });
}
