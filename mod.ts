/**
 * sandbox: run AI coding agents in isolated Docker containers — the library API.
 *
 * @module
 */
export {
  CONFIG_FILE_NAMES,
  DEFAULT_BASE_IMAGE,
  DEFAULT_PROFILE,
  findConfigFile,
  isSecretName,
  loadConfig,
  loadConfigOrThrow,
  parseConfig,
  profileNames,
  resolveProfile,
} from "./lib/config.ts";
export type { Config, ConfigLoadResult, FindConfigOptions, NetworkMode, Profile, SandboxConfig } from "./lib/config.ts";

export { DockerSandboxProvider, listSandboxes, sandboxNames, statsAll, teardownAll } from "./lib/docker_provider.ts";
export type { DockerProviderOptions } from "./lib/docker_provider.ts";
export { DockerCli, LABEL } from "./lib/docker.ts";
export { createProvider } from "./lib/providers.ts";
export { ensureImage, imageTagFor } from "./lib/image.ts";
export type { ImageInfo, ImageOptions } from "./lib/image.ts";

export type {
  EnsureRunningOptions,
  ExecOptions,
  ExecResult,
  ExecStream,
  ExecStreamOutcome,
  SandboxHealth,
  SandboxProvider,
  SandboxState,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
} from "./lib/provider.ts";

export { CommandExitError, ConfigError, EXIT, exitCodeFor, SandboxError } from "./lib/errors.ts";
export type { ConfigIssue, SandboxErrorCode } from "./lib/errors.ts";
