/** `sandbox doctor`: attack a throwaway sandbox of the profile and say which defences hold. */
import { type Command, Option } from "commander";
import { SandboxError } from "../lib/errors.ts";
import { table } from "../lib/output.ts";
import type { DoctorReport } from "../lib/doctor/doctor.ts";
import type { LocalFacts } from "../lib/doctor/local.ts";
import { profileFor, signal, stdout } from "./context.ts";
import { progress } from "./progress.ts";
import { jsonOption, profileOption } from "./options.ts";

const STATUS = { held: "HELD", broken: "BROKEN", not_applicable: "NOT APPLICABLE" } as const;

export function registerDoctorCommand(program: Command): void {
  program.command("doctor")
    .description(
      "attack a throwaway sandbox of the profile and report which defences hold on this machine",
    )
    .addOption(profileOption()).addOption(jsonOption())
    .addOption(
      new Option(
        "--repo <path>",
        "sandbox mode devcontainer: the local repository whose devcontainer is checked (default: the current directory's)",
      ),
    )
    .action(async (opts: { profile?: string; json?: boolean; repo?: string }, command: Command) => {
      const { runDoctor } = await import("../lib/doctor/doctor.ts");
      const profile = await profileFor(command, opts.profile);
      const report = await runDoctor(profile, {
        signal,
        repo: opts.repo,
        onProgress: (line) => progress(`doctor: ${line}`),
      });
      progress(`doctor: done in ${(report.durationMs / 1000).toFixed(1)}s`);
      if (opts.json) await stdout.json(report);
      else await printReport(report);
      if (report.broken.length > 0) {
        throw new SandboxError(
          "defence_broken",
          `${report.broken.length} defence(s) of profile "${report.profile}" that should hold are broken: ${
            report.broken.join(", ")
          }`,
        );
      }
    });
}

async function printReport(report: DoctorReport): Promise<void> {
  const env = report.environment;
  if (env) {
    const yesNo = (value: boolean | null) => value === null ? "unknown" : value ? "yes" : "no";
    await stdout.line(table(["ENVIRONMENT", "VALUE"], [
      ["engine", env.engineVersion ?? "unknown"],
      ["rootless", yesNo(env.rootless)],
      ["cgroup", env.cgroupVersion === null ? "unknown" : `v${env.cgroupVersion}`],
      ["storage", env.storage ?? "unknown"],
      [
        "resources.disk",
        env.diskQuota === null
          ? "unknown"
          : env.diskQuota
          ? "kernel quota"
          : "no quota: the container's init reports sizes",
      ],
      ["userns-remap", yesNo(env.usernsRemap)],
      ["host user namespaces", yesNo(env.hostUserNamespaces)],
      ["seccomp", env.seccomp ?? "off"],
      ["other security options", env.securityOptions.join(", ") || "none"],
    ]));
    await stdout.line("");
  }
  const kube = report.kubernetes;
  if (kube) {
    const enforces = kube.enforcesNetworkPolicy;
    await stdout.line(table(["ENVIRONMENT", "VALUE"], [
      ["API server", `${kube.server} (${kube.apiServerVersion ?? "version unknown"})`],
      ["namespace", kube.namespace],
      ["network plugin", kube.networkPlugins.join(", ") || "unknown"],
      ["enforces NetworkPolicy", enforces === null ? "unknown" : enforces ? "yes" : "no"],
    ]));
    await stdout.line("");
  }
  if (report.local) await printLocal(report.local);
  await stdout.line(
    `profile "${report.profile}": sandbox mode ${report.mode}, network mode ${report.network}`,
  );
  if (report.devcontainer) {
    await stdout.line(
      `devcontainer ${report.devcontainer.config}: image ${report.devcontainer.image}, sandbox image ${report.image}`,
    );
  }
  await stdout.line(table(
    ["DEFENCE", "STATUS", "REASON / EVIDENCE"],
    report.checks.map((c) => [
      c.defence,
      STATUS[c.status],
      [c.reason, ...c.evidence].join(" | "),
    ]),
  ));
}

/** Mode local: what bubblewrap and this host give, and what holds each limit. */
async function printLocal(local: LocalFacts): Promise<void> {
  const namespaces = local.maxUserNamespaces;
  await stdout.line(table(["ENVIRONMENT", "VALUE"], [
    ["bubblewrap", local.bwrap ?? "unknown"],
    [
      "user namespaces",
      namespaces === null ? "unknown" : `user.max_user_namespaces ${namespaces}`,
    ],
    ["cgroup", local.cgroupVersion === null ? "unknown" : `v${local.cgroupVersion}`],
    ["limits held by", local.limits],
    ["resources.memory", local.memory],
    ["resources.cpus", local.cpu],
    ["resources.pids", local.pids],
    ["seccomp", local.seccomp],
    ["landlock", local.landlock],
  ]));
  await stdout.line("");
}
