/**
 * A sandbox in use: the host-side services that exist while something runs in it.
 *
 * Opening a session starts, in this process, the credential proxy (LLM calls, key attached here)
 * and the egress proxy (allowlisted outbound traffic), listening on loopback and on the host's
 * address on the sandbox's own network only, opens exactly their ports in the host firewall, and
 * issues a per-session token. Closing it revokes the token, closes the ports and stops both.
 */
import { AccessLog } from "./access_log.ts";
import { userStateDir, type Profile } from "../config.ts";
import { startCredentialProxy, TokenRegistry, type UpstreamProvider } from "./credential_proxy.ts";
import type { DockerSandboxProvider, SandboxNetwork } from "../sandbox/docker_provider.ts";
import { startEgressProxy } from "./egress_proxy.ts";
import { type GitRemote, startGitProxy } from "./git_proxy.ts";
import { openProxyPorts } from "../sandbox/host_firewall.ts";
import { KeyStore } from "../keys.ts";
import { llmTarget } from "./llm_providers.ts";
import { Redactor } from "../redact.ts";
import { parseSize } from "../units.ts";

export interface SessionOptions {
  runId?: string | null;
  /** NDJSON access log (default: `<state dir>/access.ndjson`). */
  accessLogPath?: string;
  /** Each access log entry as it is written (e.g. for `--json` progress). */
  onAccess?: (entry: import("./access_log.ts").AccessLogEntry) => void;
  /** Shared across sessions of one process, so a key command runs once. */
  keys?: KeyStore;
  redactor?: Redactor;
  signal?: AbortSignal;
  /** Serve this upstream instead of the profile's (a replay or a recorder in front of it). */
  upstream?: UpstreamProvider;
  /** Model name for the worker instead of the profile's. */
  model?: string;
  /** Serve the git proxy for this remote too (runs on a remote repository). */
  gitRemote?: GitRemote;
}

export interface SandboxSession extends AsyncDisposable {
  /** Variables for commands in the sandbox: proxy URLs and the session token. No key. */
  readonly env: Record<string, string>;
  readonly token: string;
  readonly network: SandboxNetwork;
  readonly model: string;
  readonly redactor: Redactor;
  /** The git proxy's URL as the sandbox reaches it, when a remote was given. */
  readonly gitUrl?: string;
  close(): Promise<void>;
}

/** Default location of the access log shared by every session on this host. */
export function defaultAccessLogPath(): string {
  return `${userStateDir()}/access.ndjson`;
}

/** The two proxies of one profile, started on the given addresses. */
export interface HostProxies extends AsyncDisposable {
  readonly token: string;
  readonly model: string;
  readonly redactor: Redactor;
  /** TCP ports the proxies listen on (credential proxy first). */
  readonly ports: number[];
  /** OpenAI-style base URL of the credential proxy at `hostname`. */
  llmUrl(hostname: string): string;
  /** The git proxy's URL at `hostname`, when a remote was given. */
  gitUrl(hostname: string): string | undefined;
  /** Egress proxy URL at `hostname`; undefined in network mode full. */
  egressUrl(hostname: string): string | undefined;
  /** Variables for a sandbox reaching the proxies at `hostname`. */
  envFor(hostname: string): Record<string, string>;
  close(): Promise<void>;
}

/**
 * Start the credential proxy and (unless the network mode is full) the egress proxy for `profile`
 * on `hostnames`, and issue a token for them.
 */
export async function startHostProxies(
  profile: Profile,
  hostnames: string[],
  options: SessionOptions = {},
): Promise<HostProxies> {
  const redactor = options.redactor ?? new Redactor();
  const keys = options.keys ?? new KeyStore({ redactor });
  const logPath = options.accessLogPath ?? defaultAccessLogPath();
  await Deno.mkdir(logPath.replace(/\/[^/]*$/, ""), { recursive: true });
  const log = new AccessLog({ path: logPath, redactor, onEntry: options.onAccess });
  const tokens = new TokenRegistry({ redactor });
  const configured = llmTarget(profile.llm, keys);
  const target = {
    upstream: options.upstream ?? configured.upstream,
    model: options.model ?? configured.model,
  };
  const token = tokens.issue({
    profile: profile.name,
    runId: options.runId ?? null,
    provider: target.upstream,
    // The profile's rules hold whatever serves the requests (a replay or recorder included).
    policy: configured.policy,
  });

  const cleanups: (() => Promise<void>)[] = [() => log.close()];
  const close = async () => {
    tokens.revoke(token);
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
    cleanups.length = 0;
  };
  try {
    const credentials = await startCredentialProxy({
      hostnames,
      tokens,
      maxBodyBytes: parseSize(profile.llm.max_request_body),
      log,
      redactor,
      signal: options.signal,
    });
    cleanups.push(() => credentials.close());
    const { mode, allow, hosts } = profile.sandbox.network;
    const egress = mode === "full" ? undefined : await startEgressProxy({
      hostnames,
      mode,
      allow,
      hosts,
      log,
      profile: profile.name,
      runId: options.runId ?? null,
      signal: options.signal,
    });
    if (egress) cleanups.push(() => egress.close());
    const git = options.gitRemote
      ? await startGitProxy({
        hostnames,
        grants: new Map([[token, options.gitRemote]]),
        log,
        redactor,
        profile: profile.name,
        runId: options.runId ?? null,
        signal: options.signal,
      })
      : undefined;
    if (git) cleanups.push(() => git.close());

    const envFor = (hostname: string) => {
      const llmBase = credentials.url(hostname);
      const env: Record<string, string> = {
        SANDBOX_LLM_BASE_URL: llmBase,
        SANDBOX_LLM_TOKEN: token,
        SANDBOX_LLM_API: target.upstream.kind,
        SANDBOX_LLM_MODEL: target.model,
        // Stock SDKs and tools work unchanged: the token is their "API key", the proxy their endpoint.
        OPENAI_BASE_URL: llmBase,
        OPENAI_API_KEY: token,
        ANTHROPIC_BASE_URL: llmBase.replace(/\/v1$/, ""),
        ANTHROPIC_API_KEY: token,
      };
      if (git) env.SANDBOX_GIT_URL = git.url(hostname);
      if (egress) {
        const proxyUrl = egress.url(hostname);
        for (const name of ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]) env[name] = proxyUrl;
        const noProxy = [...new Set([hostname, "localhost", "127.0.0.1"])].join(",");
        for (const name of ["NO_PROXY", "no_proxy"]) env[name] = noProxy;
      }
      return env;
    };
    return {
      token,
      model: target.model,
      redactor,
      ports: [credentials.port, ...(egress ? [egress.port] : []), ...(git ? [git.port] : [])],
      gitUrl: (hostname) => git?.url(hostname),
      llmUrl: (hostname) => credentials.url(hostname),
      egressUrl: (hostname) => egress?.url(hostname),
      envFor,
      close,
      [Symbol.asyncDispose]: close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}

/**
 * Open a session for a running sandbox: its proxies on loopback and on the host's address on the
 * sandbox network, and (for isolated networks) exactly their ports open in the host firewall.
 */
export async function openSession(
  profile: Profile,
  provider: DockerSandboxProvider,
  options: SessionOptions = {},
): Promise<SandboxSession> {
  const network = await provider.networkInfo(options.signal);
  const proxies = await startHostProxies(profile, ["127.0.0.1", network.gateway], options);
  let opening: AsyncDisposable & { close(): Promise<void> } | undefined;
  try {
    if (network.internal) {
      opening = await openProxyPorts({ bridge: network.bridge, gateway: network.gateway, ports: proxies.ports });
    }
  } catch (error) {
    await proxies.close();
    throw error;
  }
  const close = async () => {
    await opening?.close();
    await proxies.close();
  };
  return {
    env: proxies.envFor(network.gateway),
    gitUrl: proxies.gitUrl(network.gateway),
    token: proxies.token,
    network,
    model: proxies.model,
    redactor: proxies.redactor,
    close,
    [Symbol.asyncDispose]: close,
  };
}
