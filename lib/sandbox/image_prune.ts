/**
 * Stale images of the tool's own repositories, for `sandbox prune --images`: tags of
 * `sandbox-runtime` and `sandbox-agent` that no profile's current configuration builds and that no
 * container (running or stopped) was created from. Nothing outside those two repositories is ever
 * considered: not the base image, not a registry's copy (`REG/sandbox-runtime:…`), not a
 * devcontainer image. Removal is by tag and never forced, so the engine itself refuses an image
 * a container created meanwhile uses.
 */
import type { Config } from "../config.ts";
import { DockerCli } from "./docker.ts";
import { SandboxError } from "../errors.ts";
import { IMAGE_REPOSITORY, imageTagFor } from "./image.ts";
import { AGENT_IMAGE_REPOSITORY, agentImageTagFor } from "../agents/agent_image.ts";
import { AGENT_CLIS } from "../agents/packages.ts";
import { profileNames, resolveProfile } from "../config.ts";

export interface ImagePruneOptions {
  /** Tags a current configuration uses: never removed. */
  keep: ReadonlySet<string>;
  dryRun?: boolean;
  /** Only tags this accepts are considered (a test limits it to the tags it made). */
  only?: (tag: string) => boolean;
  docker?: DockerCli;
  signal?: AbortSignal;
}

export interface ImagePruneReport {
  /** Each removed (or, dry, removable) image: its tag, id and size as the engine prints it. */
  removed: { tag: string; id: string; size: string }[];
  /** Stale tags kept because a container was created from them. */
  inUse: string[];
  /** Tags the engine refused to remove, with its reason. */
  failed: { tag: string; reason: string }[];
}

/**
 * The image tags the profiles of `config` use as configured now: each profile's sandbox image,
 * and its agent layer for every agent CLI (a run may pick any with `--agent`).
 */
export async function currentImageTags(config: Config): Promise<Set<string>> {
  const tags = new Set<string>();
  for (const name of profileNames(config)) {
    const runtime = await imageTagFor(resolveProfile(config, name).sandbox.image);
    tags.add(runtime);
    for (const agent of AGENT_CLIS) tags.add(await agentImageTagFor(runtime, agent));
  }
  return tags;
}

/** Remove (or, dry, list) the stale images of the tool's own repositories. */
export async function pruneImages(options: ImagePruneOptions): Promise<ImagePruneReport> {
  const docker = options.docker ?? new DockerCli();
  const { signal } = options;
  const images: { tag: string; id: string; size: string }[] = [];
  for (const repository of [IMAGE_REPOSITORY, AGENT_IMAGE_REPOSITORY]) {
    const listed = await docker.ok(
      [
        "image",
        "ls",
        "--no-trunc",
        "--format",
        "{{.Repository}}:{{.Tag}}\t{{.ID}}\t{{.Size}}",
        repository,
      ],
      "docker_failed",
      `Cannot list the images of "${repository}"`,
      { signal },
    );
    for (const line of listed.split("\n").filter(Boolean)) {
      const [tag, id, size] = line.split("\t");
      // `docker image ls REPO` matches the repository exactly; checked again all the same.
      if (tag.startsWith(`${repository}:`) && !tag.endsWith(":<none>")) {
        images.push({ tag, id, size });
      }
    }
  }
  const used = await imagesInUse(docker, signal);
  const report: ImagePruneReport = { removed: [], inUse: [], failed: [] };
  for (const image of images) {
    if (options.keep.has(image.tag) || !(options.only?.(image.tag) ?? true)) continue;
    if (used.has(image.id)) {
      report.inUse.push(image.tag);
      continue;
    }
    if (!options.dryRun) {
      const removed = await docker.run(["image", "rm", image.tag], { signal });
      if (removed.exitCode !== 0) {
        report.failed.push({ tag: image.tag, reason: removed.stderr.trim() });
        continue;
      }
    }
    report.removed.push(image);
  }
  return report;
}

/** The ids of the images every container, running or not, was created from. */
async function imagesInUse(docker: DockerCli, signal?: AbortSignal): Promise<Set<string>> {
  const ids = (await docker.ok(
    ["ps", "-aq", "--no-trunc"],
    "docker_failed",
    "Cannot list containers",
    { signal },
  )).split("\n").filter(Boolean);
  if (ids.length === 0) return new Set();
  // A container removed between the two calls makes inspect fail: what it printed still counts.
  const inspected = await docker.run(["container", "inspect", "--format", "{{.Image}}", ...ids], {
    signal,
  });
  if (inspected.exitCode !== 0 && inspected.stdout.trim() === "") {
    throw new SandboxError(
      "docker_failed",
      `Cannot tell which images containers use: ${inspected.stderr.trim()}`,
    );
  }
  return new Set(inspected.stdout.split("\n").map((line) => line.trim()).filter(Boolean));
}
