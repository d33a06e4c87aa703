/**
 * An agent CLI's image: one layer on top of the sandbox image (`sandbox-runtime:<hash>`) holding
 * the CLI's pinned native binary, built on demand and cached by content like the sandbox image.
 *
 * The tag is a pure function of what the layer is made of (the sandbox image's tag, itself a
 * content hash; the agent; its pinned package; the layer's Dockerfile), so the fast path needs no
 * docker call to know which image a run wants. The image's label adds the base image's id, so a
 * rebuilt sandbox image under the same tag rebuilds the layer too.
 *
 * Building needs the npm registry (or the tarball in the cache, see `npm_tarball.ts`). Without
 * it, the error says what is missing and how to build the layer elsewhere and bring it here.
 */
import type { DockerCli } from "../sandbox/docker.ts";
import { LABEL, labelArgs } from "../sandbox/docker.ts";
import { CommandExitError, SandboxError, tail } from "../errors.ts";
import { sha256Hex } from "../hash.ts";
import type { ProgressPhase } from "../sandbox/image.ts";
import {
  AGENT_PACKAGES,
  type AgentCliName,
  agentDir,
  type Architecture,
  type PlatformTarball,
} from "./packages.ts";
import {
  cachedTarballName,
  fetchTarball,
  npmCacheDir,
  RegistryError,
  unpackTarball,
} from "./npm_tarball.ts";

export const AGENT_IMAGE_REPOSITORY = "sandbox-agent";

export interface AgentImageOptions {
  /** Progress for stderr; a build is a phase, "begin" then "end" (as for the sandbox image). */
  onProgress?: (line: string, phase?: ProgressPhase) => void;
  signal?: AbortSignal;
  /** Rebuild even when an image with the right content exists. */
  force?: boolean;
  /** npm registry (default: `npm_config_registry`, else npmjs). */
  registry?: string;
  /** Tarball cache (default: `npmCacheDir()`). */
  cacheDir?: string;
}

export interface AgentImageInfo {
  /** `sandbox-agent:<agent>-<hash>`. */
  tag: string;
  agent: AgentCliName;
  /** The sandbox image it is layered on. */
  base: string;
  version: string;
  built: boolean;
}

/**
 * The layer's Dockerfile. No RUN step: the files are unpacked on the host and copied in, owned by
 * root and read-only for the sandbox user, so the agent cannot change its own program.
 */
export function agentDockerfile(agent: AgentCliName): string {
  return [
    "# An agent CLI's files on top of the sandbox image (built by sandbox, see lib/agents/).",
    "ARG BASE_IMAGE",
    "FROM ${BASE_IMAGE}",
    `COPY agent/ ${agentDir(agent)}/`,
    "",
  ].join("\n");
}

/** What the layer is made of, apart from the base image's id. */
function layerInputs(baseTag: string, agent: AgentCliName): string {
  const pkg = AGENT_PACKAGES[agent];
  const tarballs = Object.entries(pkg.tarballs).sort().map(([arch, t]) =>
    `${arch} ${t.spec} ${t.integrity} ${t.root}`
  );
  return [baseTag, agent, `${pkg.name}@${pkg.version}`, ...tarballs, agentDockerfile(agent)].join(
    "\0",
  );
}

/** The agent image's tag for a sandbox image tag. */
export async function agentImageTagFor(baseTag: string, agent: AgentCliName): Promise<string> {
  return `${AGENT_IMAGE_REPOSITORY}:${agent}-${
    (await sha256Hex(layerInputs(baseTag, agent))).slice(0, 16)
  }`;
}

/** The layer's content label: what it is made of, including the base image's id. */
export async function agentLayerContentHash(
  baseTag: string,
  agent: AgentCliName,
  baseId: string,
): Promise<string> {
  return await sha256Hex(`${layerInputs(baseTag, agent)}\0${baseId}`);
}

async function inspect(
  docker: DockerCli,
  ref: string,
  format: string,
  signal?: AbortSignal,
): Promise<string | undefined> {
  const result = await docker.run(["image", "inspect", "--format", format, ref], { signal });
  return result.exitCode === 0 ? result.stdout.trim() : undefined;
}

/**
 * Make sure the agent image for `baseTag` (an existing sandbox image) exists and was built from
 * the current content; build it when missing or stale.
 */
export async function ensureAgentImage(
  docker: DockerCli,
  baseTag: string,
  agent: AgentCliName,
  options: AgentImageOptions = {},
): Promise<AgentImageInfo> {
  const pkg = AGENT_PACKAGES[agent];
  const tag = await agentImageTagFor(baseTag, agent);
  const info = { tag, agent, base: baseTag, version: pkg.version };
  const baseFacts = await inspect(docker, baseTag, "{{.Id}} {{.Architecture}}", options.signal);
  if (!baseFacts) {
    throw new SandboxError(
      "image_build_failed",
      `Cannot build the ${agent} image "${tag}": its base "${baseTag}" does not exist`,
    );
  }
  const [baseId, architecture] = baseFacts.split(" ");
  const contentHash = await agentLayerContentHash(baseTag, agent, baseId);
  if (
    !options.force &&
    await inspect(
        docker,
        tag,
        `{{index .Config.Labels "${LABEL.contentHash}"}}`,
        options.signal,
      ) === contentHash
  ) {
    return { ...info, built: false };
  }
  const tarball = pkg.tarballs[architecture as Architecture];
  if (!tarball) {
    throw new SandboxError(
      "image_build_failed",
      `Cannot build the ${agent} image "${tag}": ${pkg.name} has no build for architecture "${architecture}" here`,
      {
        detail: `Pinned builds: ${Object.keys(pkg.tarballs).join(", ")}`,
      },
    );
  }
  const path = await fetchPinned(tarball, agent, tag, options);
  const started = performance.now();
  options.onProgress?.(`Building ${agent} image ${tag} on ${baseTag}`, "begin");
  await buildLayer(docker, { agent, baseTag, tag, contentHash, tarball, path }, options);
  options.onProgress?.(
    `Built ${agent} image ${tag} in ${((performance.now() - started) / 1000).toFixed(1)}s`,
    "end",
  );
  return { ...info, built: true };
}

/** The pinned tarball's path in the npm cache, fetched when missing; offline help when it cannot be. */
async function fetchPinned(
  tarball: PlatformTarball,
  agent: AgentCliName,
  tag: string,
  options: AgentImageOptions,
): Promise<string> {
  try {
    return await fetchTarball(tarball, options);
  } catch (error) {
    if (!(error instanceof RegistryError)) throw error;
    throw new SandboxError(
      "image_build_failed",
      `Cannot build the missing ${agent} image "${tag}": ${
        error.message.replace(/^Cannot/, "cannot")
      }`,
      {
        cause: error,
        detail: offlineHelp(
          agent,
          tag,
          cachedTarballName(tarball),
          tarball.spec,
          options.cacheDir ?? npmCacheDir(),
        ),
      },
    );
  }
}

/** `docker build` of the agent's layer: the package unpacked into a context of its own. */
async function buildLayer(
  docker: DockerCli,
  layer: {
    agent: AgentCliName;
    baseTag: string;
    tag: string;
    contentHash: string;
    tarball: PlatformTarball;
    path: string;
  },
  options: AgentImageOptions,
): Promise<void> {
  const { agent, baseTag, tag, contentHash, tarball, path } = layer;
  const pkg = AGENT_PACKAGES[agent];
  const dir = await Deno.makeTempDir({ prefix: "sandbox-agent-image-" });
  try {
    await Deno.mkdir(`${dir}/agent`);
    await unpackTarball(tarball, path, `${dir}/agent`, options.signal);
    await Deno.stat(`${dir}/agent/${pkg.entrypoint}`).catch(() => {
      throw new SandboxError(
        "image_build_failed",
        `Cannot build the ${agent} image: ${tarball.spec} has no "${pkg.entrypoint}"`,
      );
    });
    await Deno.writeTextFile(`${dir}/Dockerfile`, agentDockerfile(agent));
    const result = await docker.run([
      "build",
      "--build-arg",
      `BASE_IMAGE=${baseTag}`,
      // Only the content hash: ownership labels belong on what the tool creates from an image,
      // never on the image itself, whose labels every container started from it inherits.
      ...labelArgs({ [LABEL.contentHash]: contentHash }),
      "--tag",
      tag,
      dir,
    ], { signal: options.signal, env: { DOCKER_CLI_HINTS: "false" } });
    if (result.aborted) {
      throw new SandboxError("interrupted", `Building the ${agent} image was interrupted`);
    }
    if (result.exitCode !== 0) {
      throw new CommandExitError(
        "image_build_failed",
        `Cannot build the ${agent} image "${tag}"`,
        result,
        {
          detail: tail(result.stdout + result.stderr),
        },
      );
    }
  } finally {
    // A temporary directory left behind costs disk space only; the build's outcome stands.
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

/** How to get the layer onto a machine that cannot reach the registry. */
function offlineHelp(
  agent: AgentCliName,
  tag: string,
  file: string,
  spec: string,
  cacheDir: string,
): string {
  return [
    "The agent's image layer is built once, from the npm registry, on top of the sandbox image. Either:",
    `- build it where the registry is reachable, with the same version of sandbox: sandbox image build --agent ${agent}`,
    `  then move it: docker save ${tag} | gzip > ${agent}-image.tar.gz, and here: docker load -i ${agent}-image.tar.gz`,
    `- or fetch the package elsewhere (npm pack ${spec}) and copy ${file} into ${cacheDir}/`,
    "- or point npm_config_registry at a registry mirror you can reach",
  ].join("\n");
}
