/**
 * `sandbox snapshot`: the profile's development sandbox (the one `sandbox exec` prepares: installed
 * dependencies, warmed caches) saved as the image its runs start from — the E2B template model.
 *
 * The development sandbox's root filesystem is read-only; what a user prepares there is in its
 * workspace volume and its home (a tmpfs). Both are copied out through the strict reader every
 * copy out of a sandbox uses (lib/tar_extract.ts: regular files, directories and links only, no
 * setuid bits), then built as one layer on the runs' image: `/workspace` (a run's fresh workspace
 * volume starts as a copy of it: the engine fills an empty volume from the image) and
 * `/opt/sandbox/snapshot-home` (the container's init copies it into the home tmpfs before anything
 * else runs). Runs never share a container: each starts from the snapshot, none from another run.
 *
 * The record (`<state>/snapshots/<profile>.json`) names the snapshot and the image it was built
 * on: when that image changes (a new build of the tool or of the profile's base image), the
 * snapshot no longer applies, and runs start from the image as built until the next snapshot.
 */
import { userStateDir } from "../paths.ts";
import { CommandExitError, SandboxError } from "../errors.ts";
import { randomHex } from "../hash.ts";
import type { DockerSandboxProvider } from "./docker_provider.ts";
import type { ProfileSandbox } from "./provider.ts";

export const SNAPSHOT_REPOSITORY = "sandbox-snapshot";
/** Where a snapshot's home lives in its image (scripts/sandbox-exec's init copies it). */
export const SNAPSHOT_HOME = "/opt/sandbox/snapshot-home";

export interface SnapshotRecord {
  /** The snapshot image. */
  tag: string;
  /** The image it was built on: it applies to runs while theirs is this one. */
  base: string;
  createdAt: string;
}

function recordPath(profile: string): string {
  return `${userStateDir()}/snapshots/${profile}.json`;
}

/** The profile's snapshot, if it has one. */
export async function readSnapshot(profile: string): Promise<SnapshotRecord | undefined> {
  try {
    return JSON.parse(await Deno.readTextFile(recordPath(profile))) as SnapshotRecord;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return undefined;
    throw error;
  }
}

/**
 * Save `dev` (a profile's running development sandbox, `namedSandbox`'s) as the image its runs
 * start from, built on the image a run of the profile would use now; a usage error for a sandbox
 * that is not a Docker container. Returns the record.
 */
export async function snapshotSandbox(
  sandbox: ProfileSandbox,
  options: { signal?: AbortSignal; onProgress?: (line: string) => void } = {},
): Promise<SnapshotRecord> {
  const dev = dockerSandbox(sandbox);
  return await takeSnapshot(dev, await dev.runImageTag(), options);
}

/**
 * `sandbox` as the Docker container a snapshot is made of, or a usage error. Told by its Docker
 * method, not `instanceof`: docker_provider.ts imports this module, and a value import back would
 * be a cycle of modules, which in the bundle wait for each other's start for ever.
 */
function dockerSandbox(sandbox: ProfileSandbox): DockerSandboxProvider {
  if ("runImageTag" in sandbox) return sandbox as DockerSandboxProvider;
  throw new SandboxError(
    "usage",
    `Sandbox "${sandbox.containerName}" is not a Docker container: only one has a snapshot`,
  );
}

/**
 * Save `dev` (a profile's running development sandbox) as the image its runs start from, built on
 * `base` (the image a run of the profile would use now). Returns the record.
 */
export async function takeSnapshot(
  dev: DockerSandboxProvider,
  base: string,
  options: { signal?: AbortSignal; onProgress?: (line: string) => void } = {},
): Promise<SnapshotRecord> {
  if (!await dev.isRunning(options.signal)) {
    throw new SandboxError(
      "usage",
      `Sandbox "${dev.containerName}" is not running: nothing to snapshot`,
      {
        detail:
          `Prepare it with: sandbox exec -p ${dev.profile.name} -- CMD (it starts it), then snapshot`,
      },
    );
  }
  const context = await Deno.makeTempDir({ prefix: "sandbox-snapshot-" });
  try {
    options.onProgress?.(`copying ${dev.containerName}'s /workspace and home out`);
    await dev.copyOut("/workspace", `${context}/workspace`, { signal: options.signal });
    await dev.copyOut("/home/sandbox", `${context}/home`, { signal: options.signal });
    await Deno.writeTextFile(
      `${context}/Dockerfile`,
      `FROM ${base}\nCOPY --chown=10001:10001 workspace/ /workspace/\nCOPY --chown=10001:10001 home/ ${SNAPSHOT_HOME}/\n`,
    );
    const tag = `${SNAPSHOT_REPOSITORY}:${dev.profile.name}-${randomHex(4)}`;
    options.onProgress?.(`building ${tag} on ${base}`);
    const built = await dev.docker.run(["build", "--quiet", "--tag", tag, context], {
      signal: options.signal,
    });
    if (built.exitCode !== 0) {
      throw new CommandExitError("image_build_failed", `Cannot build snapshot "${tag}"`, built);
    }
    const previous = await readSnapshot(dev.profile.name);
    const record: SnapshotRecord = { tag, base, createdAt: new Date().toISOString() };
    await Deno.mkdir(`${userStateDir()}/snapshots`, { recursive: true, mode: 0o700 });
    await Deno.writeTextFile(`${recordPath(dev.profile.name)}.tmp`, JSON.stringify(record), {
      mode: 0o600,
    });
    await Deno.rename(`${recordPath(dev.profile.name)}.tmp`, recordPath(dev.profile.name));
    // The one it replaces goes: its tag now, its layers once no container uses them.
    if (previous) await dev.docker.run(["image", "rm", "--force", previous.tag]);
    return record;
  } finally {
    await Deno.remove(context, { recursive: true }).catch(() => {}); // a temporary directory of ours
  }
}

/**
 * Forget the profile's snapshot and remove its tag (its layers go once no container uses them; a
 * pooled container made from it is replaced when next claimed); false when it had none.
 */
export async function dropSnapshot(sandbox: ProfileSandbox): Promise<boolean> {
  const dev = dockerSandbox(sandbox);
  const record = await readSnapshot(dev.profile.name);
  if (!record) return false;
  await Deno.remove(recordPath(dev.profile.name));
  await dev.docker.run(["image", "rm", "--force", record.tag]);
  return true;
}
