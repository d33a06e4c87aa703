/** Choosing the `SandboxProvider` implementation for a profile's sandbox mode. */
import type { Profile } from "../config.ts";
import { type DockerProviderOptions, DockerSandboxProvider } from "./docker_provider.ts";
import { SandboxError } from "../errors.ts";
import type { SandboxProvider } from "./provider.ts";

/** The provider for `profile`, or a usage error for modes that have no container to manage. */
export function createProvider(profile: Profile, options: DockerProviderOptions = {}): SandboxProvider & {
  readonly containerName: string;
} {
  switch (profile.sandbox.mode) {
    case "container":
      return new DockerSandboxProvider(profile, options);
    case "none":
      throw new SandboxError("usage", `Profile "${profile.name}" uses sandbox mode "none": there is no sandbox to manage`, {
        detail: 'Set profiles.' + profile.name + '.sandbox.mode to "container"',
      });
    case "devcontainer":
      throw new SandboxError("unsupported", `Sandbox mode "devcontainer" (profile "${profile.name}") is not implemented yet`, {
        detail: 'Use mode "container" with sandbox.image set to your devcontainer\'s base image',
      });
  }
}
