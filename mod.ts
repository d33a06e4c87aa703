/**
 * sandbox: run AI coding agents in isolated Docker containers — the library API.
 *
 * @module
 */
export {
  bareProfile,
  CONFIG_FILE_NAMES,
  DEFAULT_BASE_IMAGE,
  DEFAULT_PROFILE,
  findConfigFile,
  findProjectConfigFile,
  isSecretName,
  loadConfig,
  loadConfigOrThrow,
  parseConfig,
  profileNames,
  resolveProfile,
  secretValueIssues,
} from "./lib/config.ts";
export type {
  Config,
  ConfigLoadResult,
  ConfigSource,
  FindConfigOptions,
  IgnoredConfig,
  NetworkMode,
  Profile,
  SandboxConfig,
} from "./lib/config.ts";
export { listTrust, revokeTrust, trustContent, trustStateOf, trustStorePath } from "./lib/trust.ts";
export type { TrustEntry, TrustState } from "./lib/trust.ts";
export {
  assertNoSecrets,
  knownSecrets,
  registerSecret,
  secretNameRules,
} from "./lib/secret_guard.ts";
export type { KnownSecret, SandboxInput } from "./lib/secret_guard.ts";

export {
  DockerSandboxProvider,
  listSandboxes,
  sandboxNames,
  statsAll,
  teardownAll,
} from "./lib/sandbox/docker_provider.ts";
export type { DockerProviderOptions } from "./lib/sandbox/docker_provider.ts";
export { DockerCli, LABEL } from "./lib/sandbox/docker.ts";
export {
  createProvider,
  openProvider,
  relayTransportFor,
  sandboxLifecycle,
} from "./lib/sandbox/providers.ts";
export type { OpenProviderOptions } from "./lib/sandbox/providers.ts";
export {
  openDevcontainer,
  prepareDevcontainerWorkspace,
} from "./lib/sandbox/devcontainer/provider.ts";
export type { Devcontainer, OpenDevcontainerOptions } from "./lib/sandbox/devcontainer/provider.ts";
export { ensureImage, imageTagFor } from "./lib/sandbox/image.ts";
export type { ImageInfo, ImageOptions } from "./lib/sandbox/image.ts";

export type {
  EnsureRunningOptions,
  ExecOptions,
  ExecResult,
  ExecStream,
  ExecStreamOutcome,
  ProfileSandbox,
  RunSandbox,
  SandboxHealth,
  SandboxKind,
  SandboxLifecycle,
  SandboxProvider,
  SandboxRelayTransport,
  SandboxRequest,
  SandboxState,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
  Terminal,
  TerminalRequest,
  WindowSize,
} from "./lib/sandbox/provider.ts";

export {
  CommandExitError,
  ConfigError,
  EXIT,
  exitCodeFor,
  ResourceLimitError,
  SandboxError,
} from "./lib/errors.ts";
export type { ConfigIssue, SandboxErrorCode } from "./lib/errors.ts";

export { ContainerDriver, PROMPT_ROOT, WORKER_COMMAND } from "./lib/run/container_driver.ts";
export type {
  AgenticOptions,
  ContainerDriverOptions,
  GenerateOptions,
} from "./lib/run/container_driver.ts";
export { AGENT_CLIS, AGENT_PACKAGES, AGENTS } from "./lib/agents/packages.ts";
export type { AgentCliName, AgentName } from "./lib/agents/packages.ts";
export { agentCli } from "./lib/agents/agent_cli.ts";
export type { AgentCli } from "./lib/agents/agent_cli.ts";
export { agentImageTagFor, ensureAgentImage } from "./lib/agents/agent_image.ts";
export type { AgentImageInfo, AgentImageOptions } from "./lib/agents/agent_image.ts";
export { HostLifecycle, HostProvider } from "./lib/sandbox/host_provider.ts";
export { openSession, startHostProxies } from "./lib/proxy/session.ts";
export type { HostProxies, SandboxSession, SessionOptions } from "./lib/proxy/session.ts";
export { startCredentialProxy, TokenRegistry } from "./lib/proxy/credential_proxy.ts";
export type {
  CredentialProxy,
  CredentialProxyOptions,
  ProxyGrant,
  UpstreamProvider,
} from "./lib/proxy/credential_proxy.ts";
export type { LlmPolicy } from "./lib/proxy/llm_policy.ts";
export { startEgressProxy } from "./lib/proxy/egress_proxy.ts";
export type { EgressProxy, EgressProxyOptions } from "./lib/proxy/egress_proxy.ts";
export { KeyStore } from "./lib/keys.ts";
export type { KeySource } from "./lib/keys.ts";
export { Redactor } from "./lib/redact.ts";
export { AccessLog } from "./lib/proxy/access_log.ts";
export type { AccessLogEntry } from "./lib/proxy/access_log.ts";
export { runAgent } from "./lib/run/run.ts";
export type { RunOutcome, RunRequest } from "./lib/run/run.ts";
export { listRuns, readEvents, readRun, RunLog } from "./lib/run/run_log.ts";
export type { RunMeta, RunStatus } from "./lib/run/run_log.ts";
export {
  agenticMessage,
  AgenticMessageSchema,
  decodeMessage,
  decodeMessages,
  decodeMessageStream,
  DriverUsageSchema,
  encodeMessage,
  ProtocolError,
} from "./lib/run/protocol.ts";
export type { AgenticMessage, DriverUsage } from "./lib/run/protocol.ts";
export { loadRecording, startRecorder, startReplayUpstream } from "./lib/run/replay.ts";
export type { Recording } from "./lib/run/replay.ts";
