/** Commands that manage sandboxes: up, down, status/ls, exec, stats, teardown, image build. */
// The engine's modules are imported by the action that needs them (`await import(...)`), so that
// starting the CLI loads only what the command it runs uses.
import { type Command, Option } from "commander";
import type { Profile } from "../lib/config.ts";
import { ConfigError, SandboxError } from "../lib/errors.ts";
import type { TeardownReport } from "../lib/sandbox/provider.ts";
import { cliName } from "../lib/cli_name.ts";
import { AGENT_CLIS, type AgentCliName } from "../lib/agents/packages.ts";
import { table } from "../lib/output.ts";
import { formatAge, formatBytes } from "../lib/units.ts";
import {
  collect,
  type Invocation,
  note,
  profileFor,
  profileToRemove,
  sandboxByName,
  signal,
  stdout,
} from "./context.ts";
import { jsonOption, profileOption } from "./options.ts";
import { progress } from "./progress.ts";
import type { ExecFlags } from "./exec_action.ts";

/**
 * The repository whose own sandbox a command uses (mode devcontainer: whose devcontainer it runs);
 * for `image build`, only the devcontainer's.
 */
const repoOption = (devcontainerOnly = false) =>
  new Option(
    "--repo <path>",
    devcontainerOnly
      ? "sandbox mode devcontainer: the local repository whose devcontainer is built (default: the current directory's)"
      : "the repository whose own sandbox to use (its development sandbox, or for up its runs' pool); mode devcontainer: whose devcontainer is built (default: the current directory's)",
  );

export function registerSandboxCommands(program: Command): void {
  registerUp(program);
  registerDown(program);
  registerSnapshot(program);
  registerStop(program);
  registerStart(program);
  registerStatus(program);
  registerExec(program);
  registerStats(program);
  registerTeardown(program);
  registerImagePush(registerImageBuild(program));
}

/** `up`: fills the profile's warm pool. */
function registerUp(program: Command): void {
  program.command("up")
    .description(
      "fill the profile's warm pool: sandbox.pool fresh sandboxes started ahead, one per run",
    )
    .addOption(profileOption()).addOption(jsonOption()).addOption(repoOption())
    .addOption(
      new Option("--agent <name>", "the pool for runs of this agent CLI").choices([...AGENT_CLIS]),
    )
    .action(
      async (
        opts: { profile?: string; json?: boolean; repo?: string; agent?: AgentCliName },
        command: Command,
      ) => {
        const profile = await profileFor(command, opts.profile);
        const { poolFor } = await import("../lib/run/run_pool.ts");
        const pool = await poolFor(profile, {
          repo: opts.repo,
          agent: opts.agent,
          onProgress: progress,
          signal,
        });
        // Human output on stdout, like every command's; progress (image builds) went to stderr.
        if (opts.json) await stdout.json(pool);
        else {
          for (const name of pool.reaped) {
            await stdout.line(`removed ${name} (its run's process is gone)`);
          }
          for (const each of pool.ready) {
            await stdout.line(`sandbox ${each} is ready (profile ${profile.name})`);
          }
          if (profile.sandbox.pool === 0) {
            await stdout.line(`profile ${profile.name} keeps no pool (sandbox.pool is 0)`);
          }
        }
      },
    );
}

/** `down`: removes the profile's containers (and with --volumes its workspace volume). */
function registerDown(program: Command): void {
  program.command("down")
    .description(
      "stop and remove the profile's sandbox containers (development sandboxes, the warm pool, kept runs)",
    )
    .addOption(profileOption()).addOption(jsonOption())
    .option("--volumes", "also remove its workspace volume (the sandbox's copy of your repos)")
    .action(
      async (opts: { profile?: string; json?: boolean; volumes?: boolean }, command: Command) => {
        const onCluster = await kubernetesProfile(command, opts.profile, true);
        const name = onCluster?.name ?? await profileToRemove(command, opts.profile);
        // Every sandbox of the profile: its shared one, one per repository, per-run ones, and
        // its agent CLIs' (sandbox-PROFILE-AGENT…): all carry the profile's label.
        const { removeProfileSandboxes } = await import("../lib/sandbox/manage.ts");
        const report = await removeProfileSandboxes(name, onCluster, {
          volumes: opts.volumes,
          signal,
        });
        // A cluster's NetworkPolicies go unnamed: its pods are what the user made.
        const removed = onCluster
          ? report.containers
          : [...report.containers, ...report.networks, ...report.volumes];
        if (opts.json) await stdout.json(report);
        else if (report.containers.length === 0) {
          await stdout.line(`no sandbox for profile ${name}`);
        } else await stdout.line(`removed ${removed.join(", ")}`);
      },
    );
}

/** `snapshot`: saves (or with --drop forgets) the image the profile's runs start from. */
function registerSnapshot(program: Command): void {
  program.command("snapshot")
    .description(
      "save the profile's development sandbox (its /workspace and home) as the image its runs start from",
    )
    .addOption(profileOption()).addOption(jsonOption())
    .option("--drop", "forget the profile's snapshot: its runs start from the image as built again")
    .action(
      async (opts: { profile?: string; json?: boolean; drop?: boolean }, command: Command) => {
        const provider = await sandboxByName(command, opts.profile);
        const { snapshotSandbox, dropSnapshot } = await import("../lib/sandbox/snapshot.ts");
        if (opts.drop) {
          const dropped = await dropSnapshot(provider);
          if (opts.json) await stdout.json({ dropped });
          else {await stdout.line(
              dropped
                ? `profile ${provider.profile.name}: snapshot dropped`
                : `profile ${provider.profile.name} has no snapshot`,
            );}
          return;
        }
        const record = await snapshotSandbox(provider, { signal, onProgress: progress });
        if (opts.json) await stdout.json(record);
        else {await stdout.line(
            `profile ${provider.profile.name}: runs start from ${record.tag} (built on ${record.base}); refill the pool with: ${cliName()} up -p ${provider.profile.name}`,
          );}
      },
    );
}

/** `stop`: stops the development sandbox, keeping its workspace. */
function registerStop(program: Command): void {
  program.command("stop")
    .description(
      "stop the profile's sandbox without removing it (its workspace stays; start resumes it)",
    )
    .argument(
      "[session-id]",
      "stop this session (a shell, or a run) instead: its program and sandbox end",
    )
    .addOption(profileOption()).addOption(jsonOption())
    .action(
      async (
        session: string | undefined,
        opts: { profile?: string; json?: boolean },
        command: Command,
      ) => {
        if (session !== undefined) {
          const { stopSession } = await import("./attach_command.ts");
          // Stopped: its program's own exit code is the session's record, not this command's.
          return void await stopSession(session);
        }
        const provider = await sandboxByName(command, opts.profile);
        const status = await provider.stop({ signal });
        if (opts.json) await stdout.json(status);
        else {await stdout.line(
            `sandbox ${status.name} is ${status.state} (profile ${provider.profile.name}; its workspace is kept)`,
          );}
      },
    );
}

/** `start`: starts the development sandbox, making it when missing. */
function registerStart(program: Command): void {
  program.command("start")
    .description(
      "start the profile's development sandbox (exec, cp; runs never use it), making it if missing",
    )
    .addOption(profileOption()).addOption(jsonOption())
    .action(
      async (opts: { profile?: string; json?: boolean }, command: Command) => {
        const provider = await sandboxByName(command, opts.profile);
        const missing = (await provider.status({ signal })).state === "missing";
        const status = missing
          ? await provider.ensureRunning({ signal })
          : await provider.start({ signal });
        if (opts.json) await stdout.json(status);
        else {await stdout.line(
            `sandbox ${status.name} is ${status.state} (profile ${provider.profile.name}, image ${status.image})`,
          );}
      },
    );
}

/** `status` and its alias `ls`: the table of every sandbox this tool owns. */
function registerStatus(program: Command): void {
  const listAction = async (opts: { json?: boolean; profile?: string }, command: Command) => {
    const onCluster = opts.profile ? await kubernetesProfile(command, opts.profile) : undefined;
    const { listAllSandboxes } = await import("../lib/sandbox/manage.ts");
    const sandboxes = await listAllSandboxes(onCluster, signal);
    if (opts.json) return void await stdout.json(sandboxes);
    if (sandboxes.length === 0) {
      return void await stdout.line(
        `no sandboxes (start one with: ${cliName()} start, or fill the warm pool with: ${cliName()} up)`,
      );
    }
    await stdout.line(table(
      ["PROFILE", "CONTAINER", "REPO", "IMAGE", "STATE", "HEALTH", "AGE"],
      sandboxes.map((
        s,
      ) => [
        s.profile,
        s.name,
        s.repo ?? "-",
        s.image,
        s.state,
        s.health,
        formatAge(Date.now() - Date.parse(s.createdAt)),
      ]),
    ));
  };
  program.command("status")
    .description(
      "list every sandbox this tool owns (with -p of a profile in mode kubernetes: the pods in its namespace)",
    )
    .addOption(jsonOption()).addOption(clusterOption()).action(listAction);
  program.command("ls").description("same as status").addOption(jsonOption())
    .addOption(clusterOption()).action(listAction);
}

/** `-p` of `status` and `teardown`: a profile in mode kubernetes. */
const clusterOption = () =>
  new Option(
    "-p, --profile <name>",
    "a profile in mode kubernetes: its cluster's namespace instead of this machine's Docker",
  );

/** `exec`: one command inside the sandbox (the work is in exec_action.ts). */
function registerExec(program: Command): void {
  program.command("exec")
    .description("run a command inside the sandbox, streaming its output; exits with its exit code")
    .addOption(profileOption()).addOption(repoOption())
    .option("--cwd <dir>", "working directory inside the sandbox", "/workspace")
    .option("-e, --env <KEY=VALUE>", "set a variable for this command (repeatable)", collect, [])
    .option(
      "--timeout <duration>",
      "kill the command after this long (default: the profile's resources.timeout)",
    )
    .option(
      "-d, --detach",
      "start the command in the background, recorded, and print its id (attach ID follows it, stop ID ends it)",
    )
    .option("--json", "with --detach: print the id as JSON")
    .argument("<command...>", "the command and its arguments (after --)")
    .passThroughOptions()
    .action(async (argv: string[], opts: ExecFlags, command: Command) => {
      const { execAction } = await import("./exec_action.ts");
      await execAction(argv, opts, command);
    });
}

/** `stats`: memory, CPU and processes of the running sandboxes. */
function registerStats(program: Command): void {
  program.command("stats")
    .description("memory, CPU and processes of each running sandbox")
    .addOption(jsonOption())
    .action(async (opts: { json?: boolean }) => {
      const { statsOfAll } = await import("../lib/sandbox/manage.ts");
      const stats = await statsOfAll(signal);
      if (opts.json) return void await stdout.json(stats);
      if (stats.length === 0) return void await stdout.line("no running sandboxes");
      await stdout.line(table(
        ["PROFILE", "CONTAINER", "MEMORY", "LIMIT", "CPU", "PIDS"],
        stats.map((
          s,
        ) => [
          s.profile,
          s.name,
          formatBytes(s.memoryBytes),
          formatBytes(s.memoryLimitBytes),
          `${s.cpuPercent.toFixed(1)}%`,
          `${s.pids}/${s.pidsLimit}`,
        ]),
      ));
    });
}

/** `teardown --all`: removes everything this tool created, by label. */
function registerTeardown(program: Command): void {
  program.command("teardown")
    .description(
      "remove every container, network and volume this tool created (by label), and nothing else",
    )
    .requiredOption("--all", "confirm: remove all of them, including orphans of crashed runs")
    .addOption(jsonOption()).addOption(clusterOption())
    .action(async (opts: { json?: boolean; profile?: string }, command: Command) => {
      const onCluster = opts.profile ? await kubernetesProfile(command, opts.profile) : undefined;
      const { teardownEverything } = await import("../lib/sandbox/manage.ts");
      const report = await teardownEverything(onCluster, signal);
      if (opts.json) return void await stdout.json(report);
      await printRemoved(report);
    });
}

/** `image build`: builds the sandbox image, a devcontainer's, or an agent CLI's layer. */
function registerImageBuild(program: Command): Command {
  const image = program.command("image").description("manage the sandbox image");
  image.command("build")
    .description("build (or rebuild) the sandbox image for a profile")
    .addOption(profileOption()).addOption(jsonOption()).addOption(repoOption(true))
    .addOption(
      new Option(
        "--agent <agent>",
        "build (or rebuild) an agent CLI's layer on the sandbox image instead",
      )
        .choices([...AGENT_CLIS]),
    )
    .action(imageBuildAction);
  return image;
}

/** `image push`: the profile's images, tagged and pushed to a registry a cluster can pull from. */
function registerImagePush(image: Command): void {
  image.command("push")
    .description(
      "tag and push the profile's sandbox image (and the agent CLI layers built on it) to a registry",
    )
    .requiredOption(
      "--registry <host[:port][/path]>",
      "the registry, e.g. registry.example.com/team",
    )
    .addOption(profileOption()).addOption(jsonOption())
    .action(imagePushAction);
}

/** Pushes, then names each reference; the sandbox image's is the one for `kubernetes.image`. */
async function imagePushAction(
  opts: { registry: string; profile?: string; json?: boolean },
  command: Command,
): Promise<void> {
  const [{ parseRegistry }, { pushProfileImagesTo }] = await Promise.all([
    import("../lib/sandbox/image_push.ts"),
    import("../lib/sandbox/manage.ts"),
  ]);
  // A malformed registry is refused before the profile is read or anything is built.
  parseRegistry(opts.registry);
  const profile = await profileFor(command, opts.profile);
  const pushed = await pushProfileImagesTo(profile, opts.registry, {
    onProgress: progress,
    signal,
  });
  if (opts.json) return await stdout.json({ profile: profile.name, images: pushed });
  for (const each of pushed) await stdout.line(`pushed ${each.reference} (${each.digest})`);
  await stdout.line(
    `set profiles.${profile.name}.sandbox.kubernetes.image to ${pushed[0].reference}`,
  );
}

interface ImageBuildFlags {
  profile?: string;
  json?: boolean;
  repo?: string;
  agent?: AgentCliName;
}

/**
 * Builds the profile's image (in mode devcontainer, the devcontainer's first), or with --agent only
 * the agent CLI's layer on it.
 */
async function imageBuildAction(opts: ImageBuildFlags, command: Command): Promise<void> {
  const { buildProfileImage } = await import("../lib/sandbox/manage.ts");
  const profile = await profileFor(command, opts.profile);
  const built = await buildProfileImage(profile, {
    agent: opts.agent,
    repo: opts.repo,
    onProgress: progress,
    signal,
  });
  switch (built.kind) {
    case "agent":
      if (opts.json) return await stdout.json(built.layer);
      return await stdout.line(
        `built ${built.layer.tag} (${opts.agent} ${built.layer.version} on ${built.base})`,
      );
    case "devcontainer":
      if (opts.json) return await stdout.json({ ...built.image, devcontainer: built.devcontainer });
      return note(`built ${built.image.tag} (on ${built.devcontainer}, from ${built.file})`);
    case "sandbox":
      if (opts.json) return await stdout.json(built.image);
      return await stdout.line(
        `built ${built.image.tag} (on ${profile.sandbox.image}; log: ${built.image.log})`,
      );
  }
}

/**
 * The profile `down`, `status -p` and `teardown --all -p` act on when it is in mode kubernetes
 * (its sandboxes are pods on its cluster); undefined for every other mode. For `down` without a
 * usable configuration (`lenient`), undefined as well: its Docker containers are removed by name.
 */
async function kubernetesProfile(
  command: Invocation,
  name: string | undefined,
  lenient = false,
): Promise<Profile | undefined> {
  try {
    const profile = await profileFor(command, name);
    return profile.sandbox.mode === "kubernetes" ? profile : undefined;
  } catch (error) {
    // `down` removes a profile's containers whatever its configuration says (profileToRemove).
    if (lenient && (error instanceof ConfigError || error instanceof SandboxError)) {
      return undefined;
    }
    throw error;
  }
}

/** A teardown's report as lines: what was removed, by kind. */
async function printRemoved(report: TeardownReport): Promise<void> {
  const total = report.containers.length + report.networks.length + report.volumes.length;
  if (total === 0) return void await stdout.line("nothing to remove");
  for (const [kind, names] of Object.entries(report)) {
    if ((names as string[]).length > 0) {
      await stdout.line(`removed ${kind}: ${(names as string[]).join(", ")}`);
    }
  }
}
