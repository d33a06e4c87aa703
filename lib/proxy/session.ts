/**
 * A sandbox in use: the host-side services that exist while something runs in it.
 *
 * Opening a session starts, in this process, the credential proxy (LLM calls, key attached here),
 * the egress proxy (allowlisted outbound traffic) and, for a remote repository, the git proxy —
 * each on a Unix socket in a directory only this user can enter, so the host opens no port — and
 * issues a per-session token. The sandbox reaches them through a relay inside it (relay_host.ts):
 * loopback ports there, carried over the stdio of one `docker exec`. That works with no network
 * in the sandbox and with any engine the docker CLI reaches. On a local engine the sockets are in
 * the container's own directory, bind-mounted read-only into it (lib/sandbox/proxy_mount.ts), and
 * the relay connects to them directly when it can (`relay.transport`); `SANDBOX_RELAY_TRANSPORT=
 * stream` (or `relayTransport: "stream"`) keeps to the exec stream. Closing the session stops the
 * relay, revokes the token, stops the proxies and removes the sockets.
 */
import { AccessLog } from "./access_log.ts";
import { type Profile, userStateDir } from "../config.ts";
import {
  PROXY_PATH_PREFIX,
  startCredentialProxy,
  TokenRegistry,
  type UpstreamProvider,
} from "./credential_proxy.ts";
import { type DockerSandboxProvider, RELAY_USER } from "../sandbox/docker_provider.ts";
import { startEgressProxy } from "./egress_proxy.ts";
import type { RunBudget } from "./budget.ts";
import type { GitRemote } from "./git_proxy.ts";
import { KeyStore } from "../keys.ts";
import { llmTarget } from "./llm_providers.ts";
import { Redactor } from "../redact.ts";
import { parseSize } from "../units.ts";
import {
  adoptRelay,
  BASE_PORT_STEP,
  DEFAULT_RELAY_BASE_PORT,
  portsFor,
  relayArgv,
  type RelayHost,
  type RelayLauncher,
  type RelayService,
  spawnRelayProcess,
  startRelay,
} from "./relay_host.ts";
import {
  awaitSpareRelay,
  type ClaimedSpare,
  claimSpareRelay,
  hasSpareRelay,
  passOnSpareRelay,
  type ServingSpare,
  startSpareRelay,
} from "./spare_relay.ts";
import {
  makeSessionSocketDir,
  MAX_SOCKET_PATH,
  prepareProxyMountSource,
  type SessionSocketDir,
  sweepStaleSessionDirs,
} from "../sandbox/proxy_mount.ts";
import { SandboxError } from "../errors.ts";
import { trace } from "../trace.ts";

/** Names the relay transport to keep to: `stream`, or `auto` (the default). */
export const RELAY_TRANSPORT_ENV = "SANDBOX_RELAY_TRANSPORT";

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
  /** What the run may spend, held by its credential and egress proxies. */
  budget?: RunBudget;
  /** Serve this upstream instead of the profile's (a replay or a recorder in front of it). */
  upstream?: UpstreamProvider;
  /** Model name for the worker instead of the profile's. */
  model?: string;
  /** Serve the git proxy for this remote too (runs on a remote repository). */
  gitRemote?: GitRemote;
  /** Diagnostics of the session (a relay restart), for stderr. */
  onProgress?: (line: string) => void;
  /**
   * `stream`: the relay carries everything over the exec stream even where the sockets are
   * mounted; `auto` (default): the sockets when the relay can reach them. Default from
   * `$SANDBOX_RELAY_TRANSPORT`.
   */
  relayTransport?: "auto" | "stream";
}

export interface SandboxSession extends AsyncDisposable {
  /** Variables for commands in the sandbox: proxy URLs and the session token. No key. */
  readonly env: Record<string, string>;
  readonly token: string;
  readonly model: string;
  readonly redactor: Redactor;
  /** The git proxy's URL as the sandbox reaches it, when a remote was given. */
  readonly gitUrl?: string;
  /** The relay carrying the proxies into the sandbox (its ports, its restarts). */
  readonly relay: RelayHost;
  /**
   * The directory of the proxies' Unix sockets (removed on close, or emptied when the spare relay
   * watching it is passed on to the next session): in the container's mounted
   * directory (mode 0711, under a 0700 parent), or, kept to the stream, a 0700 directory.
   */
  readonly socketDir: string;
  /** Where the sandbox sees `socketDir`, when it is in the container's mounted directory. */
  readonly sandboxSocketDir?: string;
  /**
   * Start, now and in the background, a relay for the container's next session (spare_relay.ts):
   * for a container that outlives the session (a shared one), on the mounted sockets only. It
   * waits on ports of its own; closing the session waits for it to be started. Nothing is
   * started when the session's own relay is a spare it claimed: closing passes that one on.
   */
  leaveSpareRelay(): void;
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

/** Where proxies listen: TCP addresses (`sandbox proxy`, mode none), or Unix sockets in a directory. */
type Listen = { hostnames: string[] } | { socketDir: string };

/** The proxies of one profile, however they listen, and the token they accept. */
interface StartedProxies {
  token: string;
  model: string;
  redactor: Redactor;
  upstreamKind: string;
  credentials: { port: number; url(hostname: string): string };
  egress?: { port: number; url(hostname: string): string };
  git?: { port: number; url(hostname: string): string };
  /** With `socketDir`: the socket of each service. */
  sockets: Partial<Record<RelayService, string>>;
  close(): Promise<void>;
}

/** The variables a sandbox needs to use the proxies at these URLs. No key: the token only. */
function sandboxEnv(
  proxies: StartedProxies,
  urls: { llm: string; egress?: string; git?: string; noProxy: string[] },
): Record<string, string> {
  const env: Record<string, string> = {
    SANDBOX_LLM_BASE_URL: urls.llm,
    SANDBOX_LLM_TOKEN: proxies.token,
    SANDBOX_LLM_API: proxies.upstreamKind,
    SANDBOX_LLM_MODEL: proxies.model,
    // Stock SDKs and tools work unchanged: the token is their "API key", the proxy their endpoint.
    OPENAI_BASE_URL: urls.llm,
    OPENAI_API_KEY: proxies.token,
    ANTHROPIC_BASE_URL: urls.llm.replace(/\/v1$/, ""),
    ANTHROPIC_API_KEY: proxies.token,
  };
  if (urls.git) env.SANDBOX_GIT_URL = urls.git;
  if (urls.egress) {
    for (const name of ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]) {
      env[name] = urls.egress;
    }
    const noProxy = [...new Set([...urls.noProxy, "localhost", "127.0.0.1"])].join(",");
    for (const name of ["NO_PROXY", "no_proxy"]) env[name] = noProxy;
  }
  return env;
}

/**
 * What a session of `profile` serves, each on its own socket and relay port: the LLM, egress
 * unless the network mode is full, and git with a remote (`startProxies`; a spare relay must
 * carry exactly these to be claimed).
 */
export function sessionServices(profile: Profile, options: { git?: boolean } = {}): RelayService[] {
  return [
    "llm",
    ...(profile.sandbox.network.mode === "full" ? [] : ["egress" as const]),
    ...(options.git ? ["git" as const] : []),
  ];
}

/**
 * A spare relay for the first session of `provider`'s container, which `up` has just made or
 * started (a session leaves one only as it ends): on the first ports, serving what a session
 * without a remote serves. Only where the container has the mounted socket directory; best
 * effort, as every spare.
 */
export async function readySpareRelay(
  provider: DockerSandboxProvider,
  signal?: AbortSignal,
): Promise<void> {
  if (!await provider.hasProxyMount(signal).catch(() => false)) return;
  const source = await prepareProxyMountSource(provider.containerName).catch(() => undefined);
  if (!source) return;
  await startSpareRelay(
    provider,
    source,
    portsFor(sessionServices(provider.profile), DEFAULT_RELAY_BASE_PORT),
  );
}

/**
 * Start the credential proxy, the egress proxy (unless the network mode is full) and the git
 * proxy (with a remote) for `profile`, and issue a token for them.
 */
async function startProxies(
  profile: Profile,
  listen: Listen,
  options: SessionOptions,
): Promise<StartedProxies> {
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
    budget: options.budget,
  });
  const at = (service: RelayService) =>
    "socketDir" in listen
      ? { hostnames: [], path: `${listen.socketDir}/${service}.sock` }
      : { hostnames: listen.hostnames };

  const cleanups: (() => Promise<void>)[] = [() => log.close()];
  const close = async () => {
    tokens.revoke(token);
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
    cleanups.length = 0;
  };
  try {
    const credentials = await startCredentialProxy({
      ...at("llm"),
      tokens,
      maxBodyBytes: parseSize(profile.llm.max_request_body),
      log,
      redactor,
      signal: options.signal,
    });
    cleanups.push(() => credentials.close());
    const { mode, allow, hosts } = profile.sandbox.network;
    const egress = !sessionServices(profile).includes("egress")
      ? undefined
      : await startEgressProxy({
        ...at("egress"),
        mode,
        allow,
        hosts,
        log,
        profile: profile.name,
        runId: options.runId ?? null,
        signal: options.signal,
        budget: options.budget,
      });
    if (egress) cleanups.push(() => egress.close());
    // The git proxy's modules are loaded only for a session with a remote (~4 ms of every other).
    const git = options.gitRemote
      ? await (await import("./git_proxy.ts")).startGitProxy({
        ...at("git"),
        grants: new Map([[token, options.gitRemote]]),
        log,
        redactor,
        profile: profile.name,
        runId: options.runId ?? null,
        signal: options.signal,
      })
      : undefined;
    if (git) cleanups.push(() => git.close());
    const sockets: Partial<Record<RelayService, string>> = {};
    if ("socketDir" in listen) {
      sockets.llm = at("llm").path;
      if (egress) sockets.egress = at("egress").path;
      if (git) sockets.git = at("git").path;
    }
    return {
      token,
      model: target.model,
      redactor,
      upstreamKind: target.upstream.kind,
      credentials,
      egress,
      git,
      sockets,
      close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}

/**
 * Start the credential proxy and (unless the network mode is full) the egress proxy for `profile`
 * on `hostnames` (loopback TCP: `sandbox proxy`, and runs in sandbox mode none), and issue a token
 * for them.
 */
export async function startHostProxies(
  profile: Profile,
  hostnames: string[],
  options: SessionOptions = {},
): Promise<HostProxies> {
  const proxies = await startProxies(profile, { hostnames }, options);
  const { credentials, egress, git } = proxies;
  return {
    token: proxies.token,
    model: proxies.model,
    redactor: proxies.redactor,
    ports: [credentials.port, ...(egress ? [egress.port] : []), ...(git ? [git.port] : [])],
    gitUrl: (hostname) => git?.url(hostname),
    llmUrl: (hostname) => credentials.url(hostname),
    egressUrl: (hostname) => egress?.url(hostname),
    envFor: (hostname) =>
      sandboxEnv(proxies, {
        llm: credentials.url(hostname),
        egress: egress?.url(hostname),
        git: git?.url(hostname),
        noProxy: [hostname],
      }),
    close: proxies.close,
    [Symbol.asyncDispose]: proxies.close,
  };
}

/**
 * A new directory for a session's sockets, mode 0700 (only this user can connect to what is in
 * it): in `$XDG_RUNTIME_DIR`, else the state directory, else the system's temporary directory —
 * the first where a socket path fits.
 */
async function sessionSocketDir(): Promise<string> {
  const bases = [Deno.env.get("XDG_RUNTIME_DIR"), `${userStateDir()}/run`].filter((
    b,
  ): b is string => Boolean(b));
  const fits = (dir: string) => `${dir}/egress.sock`.length <= MAX_SOCKET_PATH;
  for (const base of bases) {
    // The directory's name adds its prefix and 16 random characters.
    if (!fits(`${base}/sandbox-session-${"x".repeat(16)}`)) continue;
    try {
      await Deno.mkdir(base, { recursive: true, mode: 0o700 });
      const dir = await Deno.makeTempDir({ dir: base, prefix: "sandbox-session-" });
      if (fits(dir)) return dir;
      await Deno.remove(dir);
    } catch {
      // Not writable here: try the next place.
    }
  }
  return await Deno.makeTempDir({ prefix: "sandbox-session-" });
}

/**
 * The container's mounted directory, where a session's sockets go, unless the session keeps to
 * the stream or a socket path there would not fit. Where the container has no such mount (an
 * older one, a remote engine), the relay finds nothing there and uses the stream.
 */
async function mountSourceFor(
  containerName: string,
  transport = Deno.env.get(RELAY_TRANSPORT_ENV) || "auto",
): Promise<string | undefined> {
  if (transport !== "auto" && transport !== "stream") {
    throw new SandboxError(
      "config_invalid",
      `Invalid ${RELAY_TRANSPORT_ENV} "${transport}": use "auto" or "stream"`,
    );
  }
  if (transport === "stream") return undefined;
  return await prepareProxyMountSource(containerName).catch(() => undefined);
}

/**
 * The session's socket directory in the mounted one: the claimed spare relay's, else a new one
 * (none when it cannot be made: removed under us, say; the stream needs no such directory).
 */
async function mountedSocketDir(
  source: string | undefined,
  claimed: ClaimedSpare | undefined,
): Promise<SessionSocketDir | undefined> {
  if (claimed) return { host: claimed.hostDir, sandbox: claimed.sandboxDir };
  return source ? await makeSessionSocketDir(source).catch(() => undefined) : undefined;
}

/**
 * Ports for the next session's relay, while this one's holds `ports`: the default range, or the
 * one above it when this session has it (so spares and the sessions that claim them alternate).
 */
function otherPorts(
  ports: Partial<Record<RelayService, number>>,
): Partial<Record<RelayService, number>> {
  const services = Object.keys(ports) as RelayService[];
  const first = portsFor(services, DEFAULT_RELAY_BASE_PORT);
  return services.every((service) => ports[service] === first[service])
    ? portsFor(services, DEFAULT_RELAY_BASE_PORT + BASE_PORT_STEP)
    : first;
}

/** The spare serves exactly the session's services (a run on a remote repository adds git). */
function sameServices(
  ports: Partial<Record<RelayService, number>>,
  sockets: Partial<Record<RelayService, string>>,
): boolean {
  const a = Object.keys(ports).sort().join(",");
  return a === Object.keys(sockets).sort().join(",");
}

/**
 * Runs the relay in `provider`'s container: `docker exec -i` under the exec wrapper, as the relay's
 * own uid (not the sandbox user's: nothing the agent runs can ptrace, read or kill it).
 */
export function dockerRelayLauncher(
  provider: DockerSandboxProvider,
  runId?: string | null,
): RelayLauncher {
  return (args) => {
    // A run's relay is named after the run (its exec id, in traces and `ps`).
    const id = runId ? `relay-${runId}-${crypto.randomUUID()}` : `relay-${crypto.randomUUID()}`;
    return spawnRelayProcess([
      provider.docker.program,
      "exec",
      "--interactive",
      "--user",
      RELAY_USER,
      // (Its Deno cache is the image's, read-only: scripts/sandbox-exec.)
      provider.containerName,
      "sandbox-exec",
      id,
      ...relayArgv(args),
    ], {
      kill: () => provider.stopExec(id),
      // As every docker call: through the engine's API where it may (lib/sandbox/docker.ts).
      spawn: (argv, options) => provider.docker.spawn(argv.slice(1), options),
    });
  };
}

/**
 * Open a session for a running sandbox: its proxies on Unix sockets, a relay inside the sandbox
 * that listens on loopback there and carries connections to them, and the variables that point
 * the sandbox's tools at the relay. Returns once the relay listens.
 */
export async function openSession(
  profile: Profile,
  provider: DockerSandboxProvider,
  options: SessionOptions = {},
): Promise<SandboxSession> {
  const source = await mountSourceFor(provider.containerName, options.relayTransport);
  // What sessions killed before closing left there goes while this one opens (awaited at close).
  const sweeping = source ? sweepStaleSessionDirs(source).catch(() => {}) : Promise.resolve();
  const claimed = source ? await claimSpareRelay(provider, source) : undefined;
  // The claimed spare is heard while the proxies start: it carries nothing before a command runs.
  const answering = claimed ? awaitSpareRelay(provider, claimed) : undefined;
  answering?.catch(() => {});
  const mounted = await mountedSocketDir(source, claimed);
  const dir = mounted?.host ?? await sessionSocketDir();
  /** The claimed spare, while it is the relay serving this session (it is passed on at the end). */
  let serving: { spare: ServingSpare; relay: RelayHost } | undefined;
  let passing = false;
  const cleanups: (() => Promise<void>)[] = [
    () =>
      passing
        ? passOnSpareRelay(provider, source!, claimed!).then(() => {})
        : Deno.remove(dir, { recursive: true }),
    () => sweeping,
    // A spare that answered but does not serve (the session failed to open, or serves other
    // services): closing its control ends it.
    async () => {
      const spare = await answering?.catch(() => undefined);
      if (spare && spare !== serving?.spare) await spare.stop();
    },
  ];
  let leavingSpare: Promise<void> | undefined;
  /** The spare still serves, as it has since the start (no relay was launched in its place). */
  const spareServes = () => serving !== undefined && serving.relay.starts === 1;
  const close = async () => {
    if (cleanups.length === 0) return;
    // Passed on unless the container has a spare already (a concurrent session's).
    passing = spareServes() && !await hasSpareRelay(source!);
    if (passing) serving!.spare.passOn();
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
  };
  try {
    const proxies = await startProxies(profile, { socketDir: dir }, options);
    cleanups.push(() => proxies.close());
    // The sandbox user is another uid: it may connect (the 0700 parent keeps everyone else out).
    if (mounted) {
      for (const socket of Object.values(proxies.sockets)) await Deno.chmod(socket, 0o666);
    }
    const relayOptions = {
      sockets: proxies.sockets,
      sandboxSocketDir: mounted?.sandbox,
      launch: dockerRelayLauncher(provider, options.runId),
      sandboxName: provider.containerName,
      onEvent: (message: string) =>
        options.onProgress?.(`sandbox ${provider.containerName}: ${message}`),
    };
    let relay: RelayHost | undefined;
    const spare = await answering?.catch(() => undefined);
    if (spare && sameServices(claimed!.record.ports, proxies.sockets)) {
      relay = adoptRelay(relayOptions, claimed!.record.ports, spare);
      serving = { spare, relay };
      trace("session: spare relay claimed");
    } else if (spare) {
      await spare.stop();
    }
    relay ??= await startRelay(relayOptions);
    const carrying = relay;
    cleanups.push(() => carrying.close());
    // The next session's relay, if one was asked for: this process must not end before the
    // engine has started it.
    cleanups.push(async () => await leavingSpare);
    trace(`session: relay ready (${relay.transport} path)`);
    const local = (port: number | undefined) =>
      port === undefined ? undefined : `http://127.0.0.1:${port}`;
    const gitUrl = relay.ports.git === undefined
      ? undefined
      : `${local(relay.ports.git)}${(await import("./git_proxy.ts")).GIT_PATH_PREFIX}`;
    return {
      env: sandboxEnv(proxies, {
        llm: `${local(relay.ports.llm)}${PROXY_PATH_PREFIX}`,
        egress: local(relay.ports.egress),
        git: gitUrl,
        noProxy: [],
      }),
      gitUrl,
      token: proxies.token,
      model: proxies.model,
      redactor: proxies.redactor,
      relay,
      socketDir: dir,
      sandboxSocketDir: mounted?.sandbox,
      leaveSpareRelay: () => {
        // A spare that serves this session is passed on when it closes: nothing to start.
        if (leavingSpare || !source || carrying.transport !== "socket" || spareServes()) return;
        leavingSpare = startSpareRelay(provider, source, otherPorts(carrying.ports)).catch(
          () => {},
        );
      },
      close,
      [Symbol.asyncDispose]: close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}
