/**
 * Sandbox mode `devcontainer`: the repository's devcontainer image, run by the Docker provider.
 *
 * Everything after the image is the Docker provider's, unchanged: the same hardened `docker run`
 * (no capabilities, no-new-privileges, read-only root, limits, no host path, the profile's
 * network), the same exec wrapper, the repository in as git objects and out as a branch. What the
 * devcontainer adds is the image it runs, the environment it sets, and the commands that prepare
 * each run's workspace — never anything it asks of `docker run`.
 */
import type { Profile } from "../../config.ts";
import { DockerCli } from "../docker.ts";
import { type DockerProviderOptions, DockerSandboxProvider } from "../docker_provider.ts";
import type { SandboxProvider } from "../provider.ts";
import { SandboxError } from "../../errors.ts";
import { resolveLocalRepo } from "../../repo/local.ts";
import { type DevcontainerConfig, readDevcontainerConfig } from "./config.ts";
import { type DevcontainerImage, ensureDevcontainerImage } from "./image.ts";
import { prepareWorkspace } from "./lifecycle.ts";
import { type DevcontainerRuntime, resolveRuntime, userFor } from "./runtime.ts";

export interface OpenDevcontainerOptions {
  /** A local repository (any directory inside its checkout). */
  repo: string;
  /** The commit whose configuration is used (default HEAD): the one the run receives. */
  base?: string;
  docker?: DockerCli;
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
  /** Host environment for `${localEnv:…}` (default: the process environment). */
  hostEnv?: (name: string) => string | undefined;
  /** Rebuild the image even when it is current. */
  force?: boolean;
}

/** A repository's devcontainer, built and resolved: what a run needs to use it. */
export interface Devcontainer {
  config: DevcontainerConfig;
  image: DevcontainerImage;
  runtime: DevcontainerRuntime;
  /** The profile the Docker provider runs: mode container, the devcontainer's image and environment. */
  profile: Profile;
}

/**
 * Read the repository's devcontainer configuration (committed, at `base`), build its image when it
 * changed, and warn once on stderr about every key that is never applied.
 */
export async function openDevcontainer(
  profile: Profile,
  options: OpenDevcontainerOptions,
): Promise<Devcontainer> {
  if (profile.sandbox.mode !== "devcontainer") {
    throw new TypeError(
      `openDevcontainer needs sandbox mode "devcontainer", not "${profile.sandbox.mode}"`,
    );
  }
  const settings = profile.sandbox.devcontainer;
  const repo = await resolveLocalRepo(options.repo, options.base);
  if (repo.uncommitted > 0) {
    options.onProgress?.(
      `note: the devcontainer is built from ${repo.baseName} (${
        repo.base.slice(0, 12)
      }) as committed; uncommitted changes are not used`,
    );
  }
  const config = await readDevcontainerConfig(repo.path, repo.base, {
    config: settings.config,
    workspaceFolder: settings.workspace_folder,
    hostEnv: options.hostEnv,
  });
  // Root asked for by the configuration itself is refused before anything is built; the image's
  // metadata (features, base image) is checked again once it exists.
  userFor(config, [], "", settings.allow_root);
  const docker = options.docker ?? new DockerCli();
  const image = await ensureDevcontainerImage(docker, config, {
    onProgress: options.onProgress,
    signal: options.signal,
    force: options.force,
    userFor: (metadata, imageUser) => userFor(config, metadata, imageUser, settings.allow_root),
  });
  const runtime = resolveRuntime(config, image, {
    allowRoot: settings.allow_root,
    imageUser: image.imageUser,
  });
  for (const warning of runtime.warnings) options.onProgress?.(`warning: ${warning}`);
  const sandbox = profile.sandbox;
  return {
    config,
    image,
    runtime,
    profile: {
      ...profile,
      sandbox: {
        ...sandbox,
        mode: "container",
        image: image.tag,
        // The profile's own settings win over what the repository asks for.
        environment: {
          ...sandbox.environment,
          set: { ...runtime.env, ...sandbox.environment.set },
        },
      },
    },
  };
}

/** The Docker provider for an opened devcontainer. */
export function devcontainerProvider(
  devcontainer: Devcontainer,
  options: DockerProviderOptions = {},
): DockerSandboxProvider {
  return new DockerSandboxProvider(devcontainer.profile, options);
}

/**
 * Ready a run's worktree as the devcontainer's workspace: the workspace folder points at it and
 * the lifecycle commands run there. Returns the directory the agent works in.
 */
export async function prepareDevcontainerWorkspace(
  provider: SandboxProvider,
  devcontainer: Devcontainer,
  options: {
    worktree: string;
    env: Record<string, string>;
    timeoutMs: number;
    signal?: AbortSignal;
    onProgress?: (line: string) => void;
  },
): Promise<string> {
  return await prepareWorkspace(provider, {
    ...options,
    subdir: devcontainer.config.workspaceSubdir,
    workspaceFolder: devcontainer.config.workspaceFolder,
    lifecycle: devcontainer.runtime.lifecycle,
  });
}

/** Mode devcontainer takes a local repository; say so clearly for anything else. */
export function requireLocalRepo(repo: string | undefined, isRemote: boolean): void {
  if (isRemote) {
    throw new SandboxError("usage", 'Sandbox mode "devcontainer" works on a local repository', {
      detail:
        "Its image is built from the repository's committed devcontainer configuration on this machine: clone it and pass --repo PATH",
    });
  }
  if (repo === undefined) {
    throw new SandboxError("usage", 'Sandbox mode "devcontainer" needs --repo', {
      detail: "The sandbox image is built from that repository's devcontainer configuration",
    });
  }
}
