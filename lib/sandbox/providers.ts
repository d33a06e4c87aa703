/**
 * The one place where a profile's sandbox mode chooses its implementations of the seam
 * (provider.ts): the `SandboxProvider` of a profile's own sandbox, the `SandboxLifecycle` of its
 * runs' sandboxes, and the `SandboxRelayTransport` of a sandbox a session serves.
 */
import { bareProfile, type Profile } from "../config.ts";
import { DockerCli } from "./docker.ts";
import {
  type DockerProviderOptions,
  DockerSandboxProvider,
  type SandboxRepo,
  sandboxRepo,
} from "./docker_provider.ts";
import { SandboxError } from "../errors.ts";
import type {
  ProfileSandbox,
  SandboxLifecycle,
  SandboxProvider,
  SandboxRelayTransport,
} from "./provider.ts";
import { DockerRelayTransport } from "./docker_relay.ts";
import { HostLifecycle } from "./host_provider.ts";

/** The provider for `profile`, or a usage error for modes that have no container to manage. */
export function createProvider(
  profile: Profile,
  options: DockerProviderOptions = {},
): SandboxProvider & {
  readonly containerName: string;
} {
  switch (profile.sandbox.mode) {
    case "container":
      return new DockerSandboxProvider(profile, options);
    case "none":
      throw new SandboxError(
        "usage",
        `Profile "${profile.name}" uses sandbox mode "none": there is no sandbox to manage`,
        {
          detail: "Set profiles." + profile.name + '.sandbox.mode to "container"',
        },
      );
    case "local":
      throw new SandboxError(
        "usage",
        `Profile "${profile.name}" uses sandbox mode "local": its sandboxes live for one run or command`,
        { detail: "Use sandboxLifecycle(profile).acquire(...) (docs/local.md)" },
      );
    case "devcontainer":
      throw new SandboxError(
        "usage",
        `Profile "${profile.name}" uses sandbox mode "devcontainer": its provider is opened on a repository`,
        {
          detail:
            "Use openProvider(profile, {repo}) (it builds the repository's devcontainer image first)",
        },
      );
    case "kubernetes":
      throw new SandboxError(
        "unsupported",
        `Profile "${profile.name}" uses sandbox mode "kubernetes": it has only runs' pods, no sandbox of its own`,
        { detail: "sandbox exec, cp and shell need a profile in mode container" },
      );
  }
}

export interface OpenProviderOptions extends DockerProviderOptions {
  /**
   * The repository whose own sandbox to use (a path or URL; see `DockerProviderOptions.repository`).
   * Mode devcontainer: the local repository whose devcontainer is built (default: the current
   * directory's), and whose sandbox it is.
   */
  repo?: string;
  signal?: AbortSignal;
  /** Mode devcontainer: rebuild its image even when current. */
  force?: boolean;
}

/** The provider for `profile`; in mode devcontainer, after building the repository's image if it changed. */
export async function openProvider(
  profile: Profile,
  options: OpenProviderOptions = {},
): Promise<ProfileSandbox> {
  const { repo, signal, force, ...rest } = options;
  if (profile.sandbox.mode !== "devcontainer") {
    const repository = repo === undefined ? undefined : await repositoryOf(repo);
    return createProvider(profile, { ...rest, repository }) as DockerSandboxProvider;
  }
  // Loaded only in this mode: its modules (jsonc-parser among them) cost every other command time.
  const { devcontainerProvider, openDevcontainer } = await import("./devcontainer/provider.ts");
  const devcontainer = await openDevcontainer(profile, {
    repo: repo ?? Deno.cwd(),
    docker: new DockerCli(options.docker),
    onProgress: options.onProgress,
    hostEnv: options.hostEnv,
    signal,
    force,
  });
  return devcontainerProvider(devcontainer, {
    ...rest,
    repository: await repositoryOf(repo ?? Deno.cwd()),
  });
}

/**
 * The profile's own sandbox, found by its name (`sandbox-P`; with `existing`, that run's sandbox
 * of the profile): what exists is acted on, nothing is built (mode devcontainer's image included).
 * Modes without one are a usage error naming the mode.
 */
export function namedSandbox(
  profile: Profile,
  options: { existing?: string } = {},
): ProfileSandbox {
  switch (profile.sandbox.mode) {
    case "container":
      return new DockerSandboxProvider(profile, options);
    case "devcontainer":
      return new DockerSandboxProvider(bareProfile(profile.name), options);
    case "none":
      throw new SandboxError(
        "usage",
        `Profile "${profile.name}" uses sandbox mode "none": there is no sandbox`,
        { detail: `Set profiles.${profile.name}.sandbox.mode to "container"` },
      );
    case "local":
    case "kubernetes":
      throw new SandboxError(
        "usage",
        `Profile "${profile.name}" uses sandbox mode "${profile.sandbox.mode}": its sandboxes live for one run, with no sandbox of the profile's own`,
        { detail: "stop, start, cp and snapshot need a profile in mode container or devcontainer" },
      );
  }
}

/**
 * The sandbox identity of a repository path or URL (as runs on it name their container). Its
 * modules are loaded only here: a command without a repository (most `sandbox exec`s) is spared
 * them (~4 ms).
 */
async function repositoryOf(repo: string): Promise<SandboxRepo> {
  const [{ resolveLocalRepo }, { isRemoteUrl, resolveRemoteRepo }] = await Promise.all([
    import("../repo/local.ts"),
    import("../repo/remote.ts"),
  ]);
  return await sandboxRepo(
    isRemoteUrl(repo) ? (await resolveRemoteRepo(repo)).key : (await resolveLocalRepo(repo)).key,
  );
}

/**
 * The sandboxes of `profile`'s runs. Mode devcontainer's profile is the one its opened
 * devcontainer gives (`openDevcontainer(...).profile`, mode container): asked for the
 * devcontainer profile itself, this is a usage error, as in `createProvider`.
 */
export async function sandboxLifecycle(profile: Profile): Promise<SandboxLifecycle> {
  switch (profile.sandbox.mode) {
    case "container": {
      // Loaded only here: the pool's modules cost commands that use no run's sandbox time.
      const { DockerLifecycle } = await import("./docker_lifecycle.ts");
      return new DockerLifecycle(profile);
    }
    case "none":
      return new HostLifecycle(profile.name);
    case "local": {
      // Loaded only here: commands in other modes are spared its modules.
      const { LocalLifecycle } = await import("./local/lifecycle.ts");
      return new LocalLifecycle(profile);
    }
    case "devcontainer":
      throw new SandboxError(
        "usage",
        `Profile "${profile.name}" uses sandbox mode "devcontainer": its runs' sandboxes come from its opened devcontainer`,
        { detail: "Use sandboxLifecycle(openDevcontainer(profile, {repo}).profile)" },
      );
    case "kubernetes": {
      // Loaded only here: the Kubernetes client costs every other mode's commands time.
      const { KubernetesLifecycle } = await import("./kubernetes/lifecycle.ts");
      return new KubernetesLifecycle(profile);
    }
  }
}

/** How a session reaches the relay in `provider`'s sandbox; only an isolated sandbox has one. */
export function relayTransportFor(provider: SandboxProvider): SandboxRelayTransport {
  if (provider instanceof DockerSandboxProvider) return new DockerRelayTransport(provider);
  // A run's pod comes with its transport (RunSandbox.relay): sessions are opened with it.
  throw new SandboxError("unsupported", "This sandbox has no relay: it is not isolated", {
    detail: 'Sandbox mode "none" reaches the proxies on loopback TCP (startHostProxies)',
  });
}
