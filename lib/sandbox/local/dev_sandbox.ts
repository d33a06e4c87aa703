/**
 * The development sandbox of a profile in mode local (`sandbox exec`): what persists between
 * commands is a workspace and a home of the profile's own, `<state>/local-dev/<profile>/`, bound
 * read-write at `/workspace` and `/home/sandbox` like a container's development sandbox keeps its
 * files. Everything else is made for each command and destroyed after it, as for a run: a fresh
 * holder (fresh namespaces), a fresh `/tmp`, its own socket directory and cgroup. No process of
 * one command meets the next; only the files it left in the workspace and home do.
 */
import type { Profile } from "../../config.ts";
import { userStateDir } from "../../paths.ts";
import { denoBinaryPath } from "../worker_bundle.ts";
import { LocalRunSandbox } from "./lifecycle.ts";
import { createLocalSandbox } from "./local_sandbox.ts";

/** The kept directories of `profile`'s development sandbox (its workspace and home). */
export function localDevDir(profile: string): string {
  return `${userStateDir()}/local-dev/${profile}`;
}

export interface LocalDevOptions {
  signal?: AbortSignal;
  onProgress?: (line: string, phase?: "begin" | "end") => void;
}

/**
 * A sandbox for one command of `profile`'s development sandbox, with its kept workspace and home
 * (made, 0700, on first use). The caller releases it after the command; the directories stay.
 */
export async function openLocalDevSandbox(
  profile: Profile,
  options: LocalDevOptions = {},
): Promise<LocalRunSandbox> {
  const dir = localDevDir(profile.name);
  const kept = { workspace: `${dir}/workspace`, home: `${dir}/home` };
  await Deno.mkdir(`${userStateDir()}/local-dev`, { recursive: true, mode: 0o700 });
  for (const path of [dir, kept.workspace, kept.home]) {
    await Deno.mkdir(path, { mode: 0o700 }).catch((error) => {
      // Made by an earlier command: kept, as it is for.
      if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
    });
  }
  const name = `local-dev-${profile.name.replace(/[^A-Za-z0-9_-]/g, "").slice(0, 20)}-${
    crypto.randomUUID().slice(0, 8)
  }`;
  const sandbox = await createLocalSandbox(profile, name, {
    programs: { deno: denoBinaryPath() },
    kept,
    signal: options.signal,
  });
  return new LocalRunSandbox(sandbox);
}
