/**
 * The commands that act on every sandbox of a kind rather than on one (`down`, `status`/`ls`,
 * `stats`, `teardown --all`, `image build`, `image push`), chosen here by the profile's mode so
 * that the CLI asks by mode and never reaches Docker itself. Mode kubernetes's are its cluster's
 * (kubernetes/manage.ts); every other mode's are this machine's Docker objects, found by label,
 * whatever the configuration says (a removed profile's containers are still removed).
 */
import type { AgentCliName } from "../agents/packages.ts";
import type { AgentImageInfo } from "../agents/agent_image.ts";
import { bareProfile, type Profile } from "../config.ts";
import { DockerCli } from "./docker.ts";
import { listSandboxes, statsAll, teardownAll, teardownProfile } from "./docker_provider.ts";
import type { ImageInfo } from "./image.ts";
import type { PushedImage } from "./image_push.ts";
import type { SandboxStats, SandboxStatus, TeardownReport } from "./provider.ts";

/** True when `profile`'s sandboxes are pods on a cluster, not this machine's containers. */
function onCluster(profile: Profile | undefined): profile is Profile {
  return profile?.sandbox.mode === "kubernetes";
}

/**
 * Remove profile `name`'s sandboxes (its development ones, its pool, its kept runs); with `volumes`
 * also their workspaces. `profile` is its configuration when it could be read (mode kubernetes:
 * its pods are on its cluster); without it, the Docker containers carrying its label.
 */
export async function removeProfileSandboxes(
  name: string,
  profile: Profile | undefined,
  options: { volumes?: boolean; signal?: AbortSignal } = {},
): Promise<TeardownReport> {
  if (onCluster(profile)) {
    const { teardownCluster } = await import("./kubernetes/manage.ts");
    return await teardownCluster(profile);
  }
  // A name no profile could have (`../x`) is a usage error, not a label to look for.
  return await teardownProfile(new DockerCli(), bareProfile(name).name, options);
}

/** Every sandbox this tool owns: on this machine, or with a profile in mode kubernetes, its pods. */
export async function listAllSandboxes(
  profile: Profile | undefined,
  signal?: AbortSignal,
): Promise<SandboxStatus[]> {
  if (onCluster(profile)) {
    const { clusterSandboxes } = await import("./kubernetes/manage.ts");
    return await clusterSandboxes(profile);
  }
  return await listSandboxes(new DockerCli(), signal);
}

/** Memory, CPU and processes of each running sandbox on this machine. */
export async function statsOfAll(signal?: AbortSignal): Promise<SandboxStats[]> {
  return await statsAll(new DockerCli(), signal);
}

/**
 * Remove everything this tool created (by label), and nothing else: on this machine (with the
 * firewall chains older versions made), or with a profile in mode kubernetes, on its cluster.
 */
export async function teardownEverything(
  profile: Profile | undefined,
  signal?: AbortSignal,
): Promise<TeardownReport> {
  if (onCluster(profile)) {
    const { teardownCluster } = await import("./kubernetes/manage.ts");
    return await teardownCluster(profile, { all: true });
  }
  const { removeLegacyFirewall } = await import("./legacy_cleanup.ts");
  const report = await teardownAll(new DockerCli(), signal);
  // Chains older versions made (root only; nothing to do for anyone else).
  await removeLegacyFirewall();
  // Lock files that killed holders left; a lock held now stays (lib/lock.ts).
  const { removeFreeLocks } = await import("../lock.ts");
  await removeFreeLocks();
  return report;
}

export interface BuildImageOptions {
  /** Only this agent CLI's layer, rebuilt on the profile's image. */
  agent?: AgentCliName;
  /** Mode devcontainer: the local repository whose devcontainer is built. */
  repo?: string;
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
}

/** What `buildProfileImage` built. */
export type BuiltImage =
  | { kind: "agent"; base: string; layer: AgentImageInfo }
  | { kind: "devcontainer"; image: ImageInfo; devcontainer: string; file: string }
  | { kind: "sandbox"; image: ImageInfo };

/**
 * Build the profile's image (in mode devcontainer, the devcontainer's first), or with `agent`
 * only that agent CLI's layer on it.
 */
export async function buildProfileImage(
  profile: Profile,
  options: BuildImageOptions = {},
): Promise<BuiltImage> {
  const [{ ensureImage }, { ensureAgentImage }] = await Promise.all([
    import("./image.ts"),
    import("../agents/agent_image.ts"),
  ]);
  const { agent, onProgress, signal } = options;
  const docker = new DockerCli();
  // With an agent only the layer is rebuilt: a rebuilt sandbox image would make it stale again.
  const layer = async (base: string): Promise<BuiltImage> => ({
    kind: "agent",
    base,
    layer: await ensureAgentImage(docker, base, agent!, { force: true, onProgress, signal }),
  });
  if (profile.sandbox.mode === "devcontainer") {
    const { openDevcontainer } = await import("./devcontainer/provider.ts");
    const devcontainer = await openDevcontainer(profile, {
      repo: options.repo ?? Deno.cwd(),
      force: !agent,
      onProgress,
      signal,
    });
    const image = await ensureImage(docker, devcontainer.profile.sandbox.image, {
      force: !agent,
      onProgress,
      signal,
    });
    if (agent) return await layer(image.tag);
    return {
      kind: "devcontainer",
      image,
      devcontainer: devcontainer.image.tag,
      file: devcontainer.config.file,
    };
  }
  const image = await ensureImage(docker, profile.sandbox.image, {
    force: !agent,
    onProgress,
    signal,
  });
  return agent ? await layer(image.tag) : { kind: "sandbox", image };
}

/** Tag and push the profile's sandbox image and the agent CLI layers built on it to `registry`. */
export async function pushProfileImagesTo(
  profile: Profile,
  registry: string,
  options: { onProgress?: (line: string) => void; signal?: AbortSignal } = {},
): Promise<PushedImage[]> {
  const { pushProfileImages } = await import("./image_push.ts");
  return await pushProfileImages(new DockerCli(), profile.sandbox.image, registry, options);
}
