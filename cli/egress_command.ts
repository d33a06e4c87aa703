/** `sandbox egress suggest RUN…`: the allowlist that would have let through what runs were denied. */
import type { Command } from "commander";
import { SandboxError } from "../lib/errors.ts";
import { table } from "../lib/output.ts";
import type { EgressSuggestion } from "../lib/proxy/egress_suggest.ts";
import { note, stdout } from "./context.ts";
import { jsonOption } from "./options.ts";

export function registerEgressCommands(program: Command): void {
  const egress = program.command("egress").description("the egress proxy's decisions");
  egress.command("suggest")
    .description(
      "the smallest network.allow that would have let through what the runs were denied (never applied)",
    )
    .argument("<run-id...>", "runs, as listed by sandbox runs")
    .addOption(jsonOption())
    .action(async (ids: string[], opts: { json?: boolean }) => {
      const [{ readRunAccess, suggestAllowlist }, { defaultAccessLogPath }] = await Promise.all([
        import("../lib/proxy/egress_suggest.ts"),
        import("../lib/proxy/session.ts"),
      ]);
      const path = defaultAccessLogPath();
      const { entries, missing } = await readRunAccess(path, ids);
      if (missing.length > 0) {
        throw new SandboxError(
          "usage",
          `No access log entries for run ${missing.map((id) => `"${id}"`).join(", ")} in "${path}"`,
          {
            detail:
              "Name runs as `sandbox runs` lists them; a run that reached nothing logs nothing",
          },
        );
      }
      const suggestion = suggestAllowlist(entries, ids);
      if (opts.json) return void await stdout.json(suggestion);
      await printSuggestion(suggestion);
    });
}

async function printSuggestion(suggestion: EgressSuggestion): Promise<void> {
  if (suggestion.denied === 0) {
    return void await stdout.line("nothing was denied: the allowlist needs no addition");
  }
  if (suggestion.domains.length > 0) {
    await stdout.line(table(
      ["DOMAIN", "PATTERN", "DENIED", "RUNS"],
      suggestion.domains.flatMap((group) =>
        group.patterns.map((p) => [group.domain, p.pattern, String(p.count), p.runs.join(",")])
      ),
    ));
    await stdout.line("");
    await stdout.line("network:\n  allow:");
    for (const pattern of suggestion.allow) await stdout.line(`    - ${JSON.stringify(pattern)}`);
  }
  for (const denial of suggestion.unlifted) {
    const what = denial.why === "internal_address"
      ? "resolved to an internal address: only a network.hosts entry (and allowing that name) reaches it"
      : 'denied by network mode "none": the profile allows no egress whatever its list says';
    note(`${denial.host}:${denial.port} (${denial.count}x) ${what}`);
  }
  note("a suggestion to review: nothing was changed; add what you trust to network.allow");
}
