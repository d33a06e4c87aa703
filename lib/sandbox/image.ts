/**
 * The sandbox image: built from the embedded Dockerfile on top of the profile's base image,
 * tagged by a hash of what it is built from, rebuilt only when that changes.
 */
import { IMAGE_CONTEXT, BUILD_BASE_IMAGE_SCRIPT } from "./assets.ts";
import { DEFAULT_BASE_IMAGE } from "../config.ts";
import { type DockerCli, LABEL, labelArgs, OWNER } from "./docker.ts";
import { CommandExitError, SandboxError, tail } from "../errors.ts";
import { run } from "../process.ts";
import { sha256Hex } from "../hash.ts";
import { denoBinaryPath, workerBundlePath, workerIdentity } from "./worker_bundle.ts";

export const IMAGE_REPOSITORY = "sandbox-runtime";

export interface ImageOptions {
  /** Each line of build output, for progress on stderr. */
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
  /** Rebuild even when an image with the right content hash exists. */
  force?: boolean;
}

export interface ImageInfo {
  /** `sandbox-runtime:<hash>`. */
  tag: string;
  /** Hash of the base image id and every build-context file. */
  contentHash: string;
  built: boolean;
}

/**
 * The image tag for a base: a pure function of the base's name and the context files, so that
 * the fast path (container already up) needs no docker call to know which image it wants.
 */
export async function imageTagFor(baseImage: string): Promise<string> {
  return `${IMAGE_REPOSITORY}:${(await contextHash(baseImage)).slice(0, 16)}`;
}

/**
 * Hash of everything the image is built from: the embedded context files, the worker bundle and
 * the deno runtime (identified by version and size: hashing 100 MB on every start would cost more
 * than it could catch), plus `extra` (base name and id).
 */
async function contextHash(...extra: string[]): Promise<string> {
  const parts = Object.keys(IMAGE_CONTEXT).sort().map((name) => `${name}\0${IMAGE_CONTEXT[name]}`);
  const deno = `deno ${Deno.version.deno} ${(await Deno.stat(denoBinaryPath())).size}`;
  return await sha256Hex([...extra, ...parts, `worker ${await workerIdentity()}`, deno].join("\0\0"));
}

/** Id of a local image, or undefined when absent. */
async function imageId(docker: DockerCli, ref: string, signal?: AbortSignal): Promise<string | undefined> {
  const result = await docker.run(["image", "inspect", "--format", "{{.Id}}", ref], { signal });
  return result.exitCode === 0 ? result.stdout.trim() : undefined;
}

async function imageLabel(docker: DockerCli, ref: string, label: string): Promise<string | undefined> {
  const result = await docker.run(["image", "inspect", "--format", `{{index .Config.Labels "${label}"}}`, ref]);
  return result.exitCode === 0 ? result.stdout.trim() : undefined;
}

/**
 * Make sure the base image exists: pull it, or for the default base (which no registry serves
 * here) build it from Debian packages with the embedded bootstrap script, once.
 */
export async function ensureBaseImage(
  docker: DockerCli,
  baseImage: string,
  options: ImageOptions = {},
): Promise<string> {
  const existing = await imageId(docker, baseImage, options.signal);
  if (existing) return existing;
  if (baseImage === DEFAULT_BASE_IMAGE) {
    options.onProgress?.(`Building base image ${baseImage} from Debian packages (about a minute, once)`);
    const script = await Deno.makeTempFile({ prefix: "sandbox-build-base-", suffix: ".sh" });
    try {
      await Deno.writeTextFile(script, BUILD_BASE_IMAGE_SCRIPT);
      const result = await run(["bash", script, baseImage], {
        signal: options.signal,
        env: { DOCKER: docker.program },
        onStderrLine: options.onProgress,
      });
      if (result.exitCode !== 0) {
        throw new CommandExitError("image_build_failed", `Cannot build base image "${baseImage}"`, result, {
          detail: `${tail(result.stderr + result.stdout)}\nIt needs root (debootstrap) and Debian's package mirror`,
        });
      }
    } finally {
      await Deno.remove(script).catch(() => {});
    }
  } else {
    options.onProgress?.(`Pulling base image ${baseImage}`);
    const result = await docker.run(["pull", baseImage], { signal: options.signal, onStderrLine: options.onProgress });
    if (result.exitCode !== 0) {
      throw new CommandExitError("image_build_failed", `Cannot pull base image "${baseImage}"`, result, {
        detail: `${tail(result.stderr)}\nBuild or load it locally, or set sandbox.image to an image you have`,
      });
    }
  }
  const id = await imageId(docker, baseImage, options.signal);
  if (!id) throw new SandboxError("image_build_failed", `Base image "${baseImage}" is still missing after building it`);
  return id;
}

/**
 * Make sure the sandbox image for `baseImage` exists and was built from the current content
 * (base image id + context files). Builds it when missing or stale.
 */
export async function ensureImage(
  docker: DockerCli,
  baseImage: string,
  options: ImageOptions = {},
): Promise<ImageInfo> {
  const baseId = await ensureBaseImage(docker, baseImage, options);
  const tag = await imageTagFor(baseImage);
  const contentHash = await contextHash(baseImage, baseId);
  if (!options.force && (await imageLabel(docker, tag, LABEL.contentHash)) === contentHash) {
    return { tag, contentHash, built: false };
  }
  options.onProgress?.(`Building sandbox image ${tag} on ${baseImage}`);
  const dir = await Deno.makeTempDir({ prefix: "sandbox-image-" });
  try {
    for (const [name, content] of Object.entries(IMAGE_CONTEXT)) {
      await Deno.writeTextFile(`${dir}/${name}`, content);
    }
    await Deno.copyFile(await workerBundlePath(options.onProgress), `${dir}/worker.js`);
    await Deno.copyFile(denoBinaryPath(), `${dir}/deno`);
    const result = await docker.run([
      "build",
      "--build-arg",
      `BASE_IMAGE=${baseImage}`,
      ...labelArgs({ [LABEL.owner]: OWNER, [LABEL.contentHash]: contentHash }),
      "--tag",
      tag,
      dir,
    ], {
      signal: options.signal,
      // The legacy builder and BuildKit both write progress to either stream.
      onStderrLine: options.onProgress,
      env: { DOCKER_CLI_HINTS: "false" },
    });
    if (result.exitCode !== 0) {
      throw new CommandExitError("image_build_failed", `Cannot build sandbox image "${tag}"`, result, {
        detail: tail(result.stdout + result.stderr),
      });
    }
    for (const line of result.stdout.split("\n")) if (line.trim()) options.onProgress?.(line);
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  return { tag, contentHash, built: true };
}
