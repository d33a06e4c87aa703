/**
 * `sandbox cp SRC DST`: files between the host and a sandbox, in either direction, through the
 * provider's `copyIn`/`copyOut` (Docker: tar-streamed through `docker exec`; nothing is bind-mounted).
 *
 * One side names the sandbox, like `docker cp`: `:PATH` is in the profile's sandbox (`-p P`;
 * relative to /workspace), `RUN_ID:PATH` in a run's working directory (relative to it). A colon
 * before any slash marks the sandbox side; a host path holding one is written `./a:b`.
 */
import type { Command } from "commander";
import { cliName } from "../lib/cli_name.ts";
import { SandboxError } from "../lib/errors.ts";
import type { ProfileSandbox } from "../lib/sandbox/provider.ts";
import { note, sandboxByName, signal } from "./context.ts";
import { profileOption } from "./options.ts";

type Side =
  | { kind: "host"; path: string }
  | { kind: "sandbox"; run?: string; path: string };

/** `RUN_ID:path` or `:path` (a prefix without a slash, then a colon); anything else is a host path. */
export function parseSide(arg: string): Side {
  const match = /^([^/:]*):(.*)$/s.exec(arg);
  if (!match) return { kind: "host", path: arg };
  return match[1] === ""
    ? { kind: "sandbox", path: match[2] }
    : { kind: "sandbox", run: match[1], path: match[2] };
}

const RUN_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

interface SandboxTarget {
  provider: ProfileSandbox;
  /** Absolute path in the sandbox. */
  path: string;
  /** For messages: `sandbox-P:/workspace/x`. */
  label: string;
}

function usage(message: string, detail?: string): SandboxError {
  return new SandboxError("usage", message, { detail });
}

function basename(path: string): string {
  return path.replace(/\/+$/, "").split("/").pop() || path;
}

function dirname(path: string): string {
  const trimmed = path.replace(/\/+$/, "");
  const slash = trimmed.lastIndexOf("/");
  return slash === -1 ? "." : trimmed.slice(0, slash) || "/";
}

/** The sandbox and directory a sandbox-side argument points into. */
async function resolveSandbox(
  side: Extract<Side, { kind: "sandbox" }>,
  command: Command,
  profileName?: string,
): Promise<SandboxTarget> {
  const { readRun } = await import("../lib/run/run_log.ts");
  let name = profileName;
  /** The directory a relative path is in, given the sandbox's workspace. */
  let base = (workspace: string) => workspace;
  /** A run's own container, when the side is RUN_ID:PATH. */
  let run: string | undefined;
  if (side.run !== undefined) {
    const meta = RUN_ID.test(side.run) ? await readRun(side.run) : undefined;
    if (!meta) {
      throw usage(
        `No run "${side.run}"`,
        `List runs with: ${cliName()} runs (the sandbox side is :PATH or RUN_ID:PATH)`,
      );
    }
    if (profileName !== undefined && profileName !== meta.profile) {
      throw usage(
        `Run "${side.run}" is of profile "${meta.profile}", not "${profileName}"`,
        "Leave out -p: a run names its own profile",
      );
    }
    const extra = meta.extra ?? {};
    const workdir = typeof extra.workdir === "string" ? extra.workdir : undefined;
    if (meta.sandbox === "none") {
      throw usage(
        `Run "${meta.id}" ran on this host (sandbox mode "none"): its files are in ${
          workdir ?? "its working directory"
        }`,
      );
    }
    // A run's sandbox is its own, removed when it ends unless kept.
    if (typeof extra.container !== "string" || (meta.status !== "running" && extra.kept !== true)) {
      throw usage(
        `Run "${meta.id}" left nothing to copy: its sandbox was removed when it ended`,
        [
          "A repository run's work comes back as a branch; --keep-worktree keeps a run's sandbox",
          `(remove it with: ${cliName()} down -p ${meta.profile})`,
        ].join("\n"),
      );
    }
    name = meta.profile;
    base = (workspace) => workdir ?? `${workspace}/runs/${meta.id}`;
    run = extra.container;
  }
  const provider = await sandboxByName(command, name, { existing: run });
  const profile = provider.profile.name;
  const status = await provider.status({ signal });
  if (status.state === "missing") {
    throw usage(
      `Sandbox "${provider.containerName}" does not exist`,
      `Start it with: ${cliName()} start -p ${profile}`,
    );
  }
  if (status.state !== "running") {
    throw usage(
      `Sandbox "${provider.containerName}" is ${status.state}`,
      `Start it with: ${cliName()} start -p ${profile}`,
    );
  }
  const dir = base(status.workspacePath);
  const relative = side.path.replace(/^\.\/?/, "");
  const path = side.path.startsWith("/") ? side.path : relative ? `${dir}/${relative}` : dir;
  return { provider, path, label: `${provider.containerName}:${path}` };
}

/** What `test` says about a path in the sandbox: a directory, something else, or nothing. */
async function sandboxKind(target: SandboxTarget): Promise<"dir" | "file" | "none"> {
  const result = await target.provider.exec(
    [
      "sh",
      "-c",
      'if [ -d "$1" ]; then echo dir; elif [ -e "$1" ]; then echo file; else echo none; fi',
      "sh",
      target.path,
    ],
    { signal, timeoutMs: 30_000 },
  );
  const kind = result.stdout.trim();
  return kind === "dir" || kind === "file" ? kind : "none";
}

async function hostKind(path: string): Promise<"dir" | "file" | "none"> {
  try {
    return (await Deno.stat(path)).isDirectory ? "dir" : "file";
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return "none";
    throw usage(`Cannot read "${path}" on the host: ${(error as Error).message}`);
  }
}

export function registerCpCommand(program: Command): void {
  program.command("cp")
    .description(
      "copy files between the host and a sandbox: one of SRC and DST is :PATH (the profile's sandbox) or RUN_ID:PATH (a run's directory)",
    )
    .addOption(profileOption())
    .argument("<src>", "host path, :PATH or RUN_ID:PATH")
    .argument("<dst>", "host path, :PATH or RUN_ID:PATH")
    .addHelpText(
      "after",
      `
Examples:
  ${cliName()} cp RUN_ID:report.md .          the file report.md from a run's directory to here
  ${cliName()} cp -p work :project/dist ./out  /workspace/project/dist of profile work's sandbox to ./out
  ${cliName()} cp ./data :data                 a host directory into /workspace/data

A relative :PATH is under /workspace, a relative RUN_ID:PATH under the run's directory; a DST that
is an existing directory (or ends with /) receives SRC under its own name. Copies are owned by the
sandbox user inside and by you on the host.`,
    )
    .action(async (src: string, dst: string, opts: { profile?: string }, command: Command) => {
      const from = parseSide(src);
      const to = parseSide(dst);
      if ((from.kind === "sandbox") === (to.kind === "sandbox")) {
        throw usage(
          from.kind === "sandbox"
            ? "Both SRC and DST are in a sandbox"
            : "Neither SRC nor DST is in a sandbox",
          "One side is :PATH (the profile's sandbox) or RUN_ID:PATH (a run's directory); the other a host path",
        );
      }
      if (from.kind === "sandbox" && to.kind === "host") {
        const source = await resolveSandbox(from, command, opts.profile);
        if (await sandboxKind(source) === "none") {
          throw usage(`No such file or directory: ${source.label}`);
        }
        const into = to.path.endsWith("/") || await hostKind(to.path) === "dir";
        // A directory that cannot be made is reported by the check right below, with its name.
        if (into) await Deno.mkdir(to.path, { recursive: true }).catch(() => {});
        const target = into ? `${to.path.replace(/\/+$/, "")}/${basename(source.path)}` : to.path;
        if (await hostKind(dirname(target)) !== "dir") {
          throw usage(`Cannot copy to "${target}": no directory "${dirname(target)}" on the host`);
        }
        if (await hostKind(target) === "dir") {
          throw usage(
            `Cannot copy to "${target}": a directory of that name exists (remove it, or copy into it with a trailing /)`,
          );
        }
        await source.provider.copyOut(source.path, target, { signal });
        note(`copied ${source.label} to ${target}`);
      } else if (from.kind === "host" && to.kind === "sandbox") {
        if (await hostKind(from.path) === "none") {
          throw usage(`No such file or directory: "${from.path}"`);
        }
        const dest = await resolveSandbox(to, command, opts.profile);
        const into = to.path.endsWith("/") || await sandboxKind(dest) === "dir";
        const target = into
          ? { ...dest, path: `${dest.path.replace(/\/+$/, "")}/${basename(from.path)}` }
          : dest;
        if (into && await sandboxKind(target) === "dir") {
          throw usage(
            `Cannot copy to ${target.provider.containerName}:${target.path}: a directory of that name exists (remove it first)`,
          );
        }
        await dest.provider.copyIn(from.path, target.path, { signal });
        note(`copied ${from.path} to ${dest.provider.containerName}:${target.path}`);
      }
    });
}
