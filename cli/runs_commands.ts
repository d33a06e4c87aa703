/**
 * `sandbox runs`, `sandbox logs` and `sandbox prune`: past and live runs, from the durable run
 * logs and their index.
 */
import { type Command, Option } from "commander";
import { SandboxError } from "../lib/errors.ts";
import { cliName } from "../lib/cli_name.ts";
import { table } from "../lib/output.ts";
import { formatBytes } from "../lib/units.ts";
import type { IndexRebuild } from "../lib/run/run_index.ts";
import { parseAge, type PruneReport, type RetentionPolicy } from "../lib/run/retention.ts";
import type { ImagePruneReport } from "../lib/sandbox/image_prune.ts";
import { cliState, configFor, type Invocation, note, signal, stdout } from "./context.ts";
import { jsonOption } from "./options.ts";

/** A whole number of at least `min`, for `--limit` and `--keep`; a usage error otherwise. */
function count(flag: string, min: number): (text: string) => number {
  return (text) => {
    if (!/^\d{1,9}$/.test(text) || Number(text) < min) {
      throw new SandboxError(
        "usage",
        `Invalid ${flag} "${text}": expected a whole number${min > 0 ? ` above ${min - 1}` : ""}`,
      );
    }
    return Number(text);
  };
}

/** Said on stderr when `sandbox runs` found its index missing or unreadable. */
function noteRebuild(rebuild: IndexRebuild): void {
  const why = rebuild.reason === "missing"
    ? "was missing"
    : `could not be read (moved to ${rebuild.movedTo})`;
  note(`the index of runs ${why}; rebuilt from ${rebuild.runs} run directories`);
}

export function registerRunsCommands(program: Command): void {
  program.command("runs")
    .description("past and live runs: id, profile, status, started, duration, tokens, exit, branch")
    .addOption(jsonOption())
    .option("-n, --limit <n>", "only the newest N runs", count("--limit", 1))
    .option("-p, --profile <name>", "only runs of this profile")
    .action(async (opts: { json?: boolean; limit?: number; profile?: string }) => {
      const [{ listRuns }, { describeRecovery, describeUnreaped }] = await Promise.all([
        import("../lib/run/run_log.ts"),
        import("../lib/run/recovery.ts"),
      ]);
      const runs = await listRuns({
        limit: opts.limit,
        profile: opts.profile,
        onRebuild: noteRebuild,
      });
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
          statusOf(r, describeRecovery(r.extra?.recovery) ?? describeUnreaped(r)),
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
    .option(
      "--from <seq|time>",
      "from the event store: from event number SEQ, or the first at or after TIME",
    )
    .addOption(
      new Option("--format <format>", "output format (default: pretty on a terminal, else ndjson)")
        .choices(["ndjson", "pretty"]),
    )
    .action(async (id: string, opts: { follow?: boolean; format?: string; from?: string }) => {
      const { logsFromStore } = await import("./store_logs.ts");
      if (await logsFromStore(id, opts)) return;
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

  registerPruneCommand(program);
}

function registerPruneCommand(program: Command): void {
  program.command("prune")
    .description(
      "remove finished runs' logs and metadata (never a running run's); with an age, old build and access logs too",
    )
    .option("--older-than <age>", 'runs that ended longer ago than this, like "30d", "12h", "2w"')
    .option("--keep <n>", "keep the newest N finished runs, whatever their age", count("--keep", 0))
    .option(
      "--images",
      "also remove sandbox-runtime and sandbox-agent images no profile's current configuration uses and no container was created from, mode local's agent files no current pin names, and worker and relay bundles of other sources",
    )
    .option("--dry-run", "say what would be removed, remove nothing")
    .addOption(jsonOption())
    .action(async (opts: PruneOptions, command: Invocation) => {
      const { pruneRuns } = await import("../lib/run/retention.ts");
      const policy = prunePolicy(opts);
      const report = policy === undefined ? undefined : await pruneRuns(policy, opts);
      // Files first (mode local's agent files, the worker and relay bundles): they need no Docker
      // engine, which a local user may lack.
      // Not while a sandbox of mode local lives: each of its commands binds those files again.
      const live = opts.images ? await liveLocalSandboxNames() : [];
      const files = live.length === 0 ? [] : [
        `kept agent files and bundles: mode local sandboxes are running (${live.join(", ")}); ` +
        "prune again once they have ended",
      ];
      const agents = opts.images && live.length === 0
        ? await pruneAgentFiles(opts.dryRun)
        : undefined;
      const bundles = opts.images && live.length === 0
        ? await pruneBundleFiles(opts.dryRun)
        : undefined;
      if (agents) files.push(filesSummary(agents, "agent files", "agent directory", opts.dryRun));
      if (bundles) files.push(filesSummary(bundles, "bundle", "bundle", opts.dryRun));
      const images = opts.images
        ? await pruneStaleImages(command, opts.dryRun).catch(async (error) => {
          if (!opts.json) await stdout.line(files.join("\n"));
          throw error;
        })
        : undefined;
      if (opts.json) {
        const kept = live.length > 0 ? { keptForLocalSandboxes: live } : {};
        return void await stdout.json({ ...report, images, agents, bundles, ...kept });
      }
      const lines = [
        ...(report ? [pruneSummary(report)] : []),
        ...(images ? [imagesSummary(images, opts.dryRun)] : []),
        ...files,
      ];
      await stdout.line(lines.join("\n"));
    });
}

interface PruneOptions {
  olderThan?: string;
  keep?: number;
  images?: boolean;
  dryRun?: boolean;
  json?: boolean;
}

/** The runs' policy the flags name; undefined with `--images` alone; a usage error with nothing. */
function prunePolicy(opts: PruneOptions): RetentionPolicy | undefined {
  const policy: RetentionPolicy = { keep: opts.keep };
  if (opts.olderThan !== undefined) {
    policy.olderThanMs = parseAge(opts.olderThan);
    if (policy.olderThanMs === undefined) {
      throw new SandboxError(
        "usage",
        `Invalid --older-than "${opts.olderThan}": expected an age like "30d", "12h" or "2w"`,
      );
    }
  }
  if (policy.olderThanMs !== undefined || policy.keep !== undefined) return policy;
  if (opts.images) return undefined;
  throw new SandboxError("usage", "Nothing to prune by: name --older-than, --keep or both", {
    detail: `For example: ${cliName()} prune --older-than 30d --dry-run`,
  });
}

async function pruneStaleImages(
  command: Invocation,
  dryRun: boolean | undefined,
): Promise<ImagePruneReport> {
  const { currentImageTags, pruneImages } = await import("../lib/sandbox/image_prune.ts");
  const keep = await currentImageTags((await configFor(command)).config);
  return await pruneImages({ keep, dryRun, signal });
}

/** Mode local's unpacked agent CLIs that no current pin names (lib/agents/host_agent.ts). */
async function pruneAgentFiles(
  dryRun: boolean | undefined,
): Promise<{ removed: { name: string; bytes: number }[] }> {
  const { pruneHostAgents } = await import("../lib/agents/host_agent.ts");
  return await pruneHostAgents({ dryRun });
}

/** The local sandboxes alive now (lib/sandbox/local/local_sandbox.ts). */
async function liveLocalSandboxNames(): Promise<string[]> {
  const { liveLocalSandboxes } = await import("../lib/sandbox/local/local_sandbox.ts");
  return await liveLocalSandboxes();
}

/** The worker and relay bundles this CLI would not use (lib/sandbox/worker_bundle.ts). */
async function pruneBundleFiles(
  dryRun: boolean | undefined,
): Promise<{ removed: { name: string; bytes: number }[] }> {
  const { pruneBundles } = await import("../lib/sandbox/worker_bundle.ts");
  return await pruneBundles({ dryRun });
}

/** One line per removed file or directory (`what NAME (SIZE)`), then the count of `unit`s. */
function filesSummary(
  report: { removed: { name: string; bytes: number }[] },
  what: string,
  unit: string,
  dryRun: boolean | undefined,
): string {
  const verb = dryRun ? "would remove" : "removed";
  const count = report.removed.length;
  const plural = count === 1 ? unit : unit.endsWith("y") ? `${unit.slice(0, -1)}ies` : `${unit}s`;
  return [
    ...report.removed.map((file) => `${verb} ${what} ${file.name} (${formatBytes(file.bytes)})`),
    `${verb} ${count} ${plural}`,
  ].join("\n");
}

function imagesSummary(report: ImagePruneReport, dryRun: boolean | undefined): string {
  const verb = dryRun ? "would remove" : "removed";
  return [
    ...report.removed.map((image) => `${verb} image ${image.tag} (${image.size})`),
    ...report.inUse.map((tag) => `kept image ${tag}: a container was created from it`),
    ...report.failed.map(({ tag, reason }) => `could not remove image ${tag}: ${reason}`),
    `${verb} ${report.removed.length} image${report.removed.length === 1 ? "" : "s"}`,
  ].join("\n");
}

function pruneSummary(report: PruneReport): string {
  const runs = `${report.runs} run${report.runs === 1 ? "" : "s"}`;
  const verb = report.dryRun ? "would remove" : "removed";
  const lines = report.removed.map((run) =>
    `${report.dryRun ? "would remove" : "removed"} ${run.id} (${run.status}, ${
      formatBytes(run.bytes)
    })`
  );
  lines.push(`${verb} ${runs}, ${formatBytes(report.bytes)}; ${report.kept} kept`);
  for (const log of report.buildLogs) {
    lines.push(`${verb} build log ${log.name} (${formatBytes(log.bytes)})`);
  }
  if (report.accessLog.entries > 0) {
    lines.push(
      `${verb} ${report.accessLog.entries} access log entries (${
        formatBytes(report.accessLog.bytes)
      })`,
    );
  }
  return lines.join("\n");
}

/** A run's STATUS cell: its status, with what became of its work or its log when there is more. */
function statusOf(
  meta: { status: string; storeError?: unknown },
  more: string | undefined,
): string {
  if (meta.storeError) return `${meta.status} (log incomplete)`;
  return more ? `${meta.status} (${more})` : meta.status;
}
