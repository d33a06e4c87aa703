/**
 * A sandbox in use: the host-side services that exist while something runs in it.
 *
 * Opening a session starts, in this process, the credential proxy (LLM calls, key attached here),
 * the egress proxy (allowlisted outbound traffic) and, for a remote repository, the git proxy —
 * each on a Unix socket in a directory only this user can enter, so the host opens no port — and
 * issues a per-session token. The sandbox reaches them through a relay inside it (relay_host.ts):
 * loopback ports there, carried over the stdio of one exec the sandbox's relay transport starts
 * (`SandboxRelayTransport`, lib/sandbox/provider.ts). That works with no network in the sandbox.
 * Where the transport has a socket directory bound into the sandbox (a local Docker engine:
 * lib/sandbox/proxy_mount.ts), the sockets go there and the relay connects to them directly when
 * it can (`relay.transport`); `SANDBOX_RELAY_TRANSPORT=stream` (or `relayTransport: "stream"`)
 * keeps to the exec stream. Closing the session stops the relay, revokes the token, stops the
 * proxies and removes the sockets.
 */
import { AccessLog } from "./access_log.ts";
import { type Profile, userStateDir } from "../config.ts";
import {
  PROXY_PATH_PREFIX,
  startCredentialProxy,
  TokenRegistry,
  type UpstreamProvider,
} from "./credential_proxy.ts";
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
  type RelayHost,
  type RelayService,
  startRelay,
} from "./relay_host.ts";
import {
  awaitSpareRelay,
  type ClaimedSpare,
  claimSpareRelay,
  hasSpareRelay,
  passOnSpareRelay,
  type ServingSpare,
  type SocketMount,
  startSpareRelay,
} from "./spare_relay.ts";
import {
  makeSessionSocketDir,
  MAX_SOCKET_PATH,
  type SessionSocketDir,
  sweepStaleSessionDirs,
} from "../sandbox/proxy_mount.ts";
import type { SandboxRelayTransport } from "../sandbox/provider.ts";
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
 * A spare relay for the first session of a sandbox of `profile`, which `up` has just made or
 * started (a session leaves one only as it ends), reached by `transport`: on the first ports,
 * serving what a session without a remote serves. Only where the sandbox has its socket
 * directory bound in; best effort, as every spare.
 */
export async function readySpareRelay(
  profile: Profile,
  transport: SandboxRelayTransport,
  signal?: AbortSignal,
): Promise<void> {
  const mount = await transport.socketMount({ confirm: true, signal });
  if (!mount) return;
  await startSpareRelay(
    transport,
    mount,
    portsFor(sessionServices(profile), DEFAULT_RELAY_BASE_PORT),
  );
}

/** What every proxy of one session shares: the access log, the token registry, the upstream. */
interface ProxyContext {
  redactor: Redactor;
  log: AccessLog;
  tokens: TokenRegistry;
  token: string;
  target: { upstream: UpstreamProvider; model: string };
}

/** Open the access log and issue the session's token for `profile`'s upstream (or the given one). */
async function proxyContext(profile: Profile, options: SessionOptions): Promise<ProxyContext> {
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
  return { redactor, log, tokens, token, target };
}

/**
 * Start the session's services, each at `at(service)`, pushing each one's close onto
 * `cleanups` as soon as it listens (so that a later failure closes what was started).
 */
async function startServices(
  profile: Profile,
  context: ProxyContext,
  at: (service: RelayService) => { hostnames: string[]; path?: string },
  options: SessionOptions,
  cleanups: (() => Promise<void>)[],
): Promise<Pick<StartedProxies, "credentials" | "egress" | "git">> {
  const { log, redactor, tokens, token } = context;
  const runId = options.runId ?? null;
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
  const egress = !sessionServices(profile).includes("egress") ? undefined : await startEgressProxy({
    ...at("egress"),
    mode,
    allow,
    hosts,
    log,
    profile: profile.name,
    runId,
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
      runId,
      signal: options.signal,
    })
    : undefined;
  if (git) cleanups.push(() => git.close());
  return { credentials, egress, git };
}

/**
 * Start the credential proxy, the egress proxy (unless the network mode is full) and the git
 * proxy (with a remote) for `profile`, and issue a token for them. Closing revokes the token
 * first, so that nothing is served with it while the proxies stop.
 */
async function startProxies(
  profile: Profile,
  listen: Listen,
  options: SessionOptions,
): Promise<StartedProxies> {
  const context = await proxyContext(profile, options);
  const at = (service: RelayService) =>
    "socketDir" in listen
      ? { hostnames: [], path: `${listen.socketDir}/${service}.sock` }
      : { hostnames: listen.hostnames };
  const cleanups: (() => Promise<void>)[] = [() => context.log.close()];
  const close = async () => {
    context.tokens.revoke(context.token);
    // Each close is independent: one that fails (a listener already gone) must not keep the
    // others from closing; the token is revoked above whatever happens here.
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
    cleanups.length = 0;
  };
  try {
    const started = await startServices(profile, context, at, options, cleanups);
    const sockets: Partial<Record<RelayService, string>> = {};
    if ("socketDir" in listen) {
      for (const service of ["llm", "egress", "git"] as const) {
        if (service === "llm" || started[service]) sockets[service] = at(service).path;
      }
    }
    return {
      token: context.token,
      model: context.target.model,
      redactor: context.redactor,
      upstreamKind: context.target.upstream.kind,
      ...started,
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
 * The sandbox's socket directory bound in, where a session's sockets go, unless the session keeps
 * to the stream or a socket path there would not fit. Where the sandbox has no such binding (an
 * older container, a remote engine), the relay finds nothing there and uses the stream.
 */
async function mountFor(
  transport: SandboxRelayTransport,
  choice = Deno.env.get(RELAY_TRANSPORT_ENV) || "auto",
): Promise<SocketMount | undefined> {
  if (choice !== "auto" && choice !== "stream") {
    throw new SandboxError(
      "config_invalid",
      `Invalid ${RELAY_TRANSPORT_ENV} "${choice}": use "auto" or "stream"`,
    );
  }
  if (choice === "stream") return undefined;
  return await transport.socketMount();
}

/**
 * The session's socket directory in the mounted one: the claimed spare relay's, else a new one
 * (none when it cannot be made: removed under us, say; the stream needs no such directory).
 */
async function mountedSocketDir(
  mount: SocketMount | undefined,
  claimed: ClaimedSpare | undefined,
): Promise<SessionSocketDir | undefined> {
  if (claimed) return { host: claimed.hostDir, sandbox: claimed.sandboxDir };
  // A directory that cannot be made leaves the session on the stream, which needs none.
  return mount ? await makeSessionSocketDir(mount.host).catch(() => undefined) : undefined;
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

/** Where a session's relay is reached and its sockets are, decided before its proxies start. */
interface SessionPlace {
  transport: SandboxRelayTransport;
  /** The sandbox's socket directory bound in; none when the session keeps to the stream. */
  mount?: SocketMount;
  /** The spare relay claimed for the session, and its answer (heard while the proxies start). */
  claimed?: ClaimedSpare;
  answering?: Promise<ServingSpare | undefined>;
  /** The session's socket directory in the mount, as host and sandbox see it. */
  mounted?: SessionSocketDir;
  /** The session's socket directory on the host: `mounted.host`, or a private 0700 one. */
  dir: string;
  /** Stale session directories being swept from the mount (awaited at close). */
  sweeping: Promise<void>;
}

async function placeSession(
  transport: SandboxRelayTransport,
  choice: SessionOptions["relayTransport"],
): Promise<SessionPlace> {
  const mount = await mountFor(transport, choice);
  // What sessions killed before closing left there goes while this one opens. Best effort: a
  // directory that stays is swept by a later session, or removed with the sandbox.
  const sweeping = mount ? sweepStaleSessionDirs(mount.host).catch(() => {}) : Promise.resolve();
  const claimed = mount ? await claimSpareRelay(transport, mount) : undefined;
  // The claimed spare is heard while the proxies start: it carries nothing before a command runs.
  const answering = claimed ? awaitSpareRelay(transport, claimed) : undefined;
  // Its failure is an answer: no spare (read where it is awaited).
  answering?.catch(() => {});
  const mounted = await mountedSocketDir(mount, claimed);
  const dir = mounted?.host ?? await sessionSocketDir();
  return { transport, mount, claimed, answering, mounted, dir, sweeping };
}

/**
 * A session's end: what it set up, undone in reverse order. Invariant: the spare relay serving
 * the session since its start is passed on to the sandbox's next session (unless the sandbox has
 * a spare already); any other claimed spare is stopped; the socket directory goes otherwise.
 */
class SessionEnd {
  readonly cleanups: (() => Promise<void>)[];
  /** The claimed spare, while it is the relay serving this session. */
  serving?: { spare: ServingSpare; relay: RelayHost };
  /** A spare relay being started for the sandbox's next session (`leaveSpareRelay`). */
  leavingSpare?: Promise<void>;
  #passing = false;

  constructor(readonly place: SessionPlace) {
    const { transport, mount, claimed, answering, dir, sweeping } = place;
    this.cleanups = [
      () =>
        this.#passing
          ? passOnSpareRelay(transport, mount!, claimed!).then(() => {})
          : Deno.remove(dir, { recursive: true }),
      () => sweeping,
      // A spare that answered but does not serve (the session failed to open, or serves other
      // services): closing its control ends it.
      async () => {
        // A spare that failed to answer was stopped by awaitSpareRelay: nothing to end here.
        const spare = await answering?.catch(() => undefined);
        if (spare && spare !== this.serving?.spare) await spare.stop();
      },
    ];
  }

  /** The spare still serves, as it has since the start (no relay was launched in its place). */
  spareServes(): boolean {
    return this.serving !== undefined && this.serving.relay.starts === 1;
  }

  async close(): Promise<void> {
    if (this.cleanups.length === 0) return;
    // Passed on unless the sandbox has a spare already (a concurrent session's).
    this.#passing = this.spareServes() && !await hasSpareRelay(this.place.mount!.host);
    if (this.#passing) this.serving!.spare.passOn();
    // Each step is independent and best effort: one that fails must not keep the others (the
    // proxies' close, which revokes the token) from running. What a failed one leaves (a
    // directory, a relay's exec) is swept by a later session or removed with the sandbox.
    for (const cleanup of this.cleanups.splice(0).reverse()) await cleanup().catch(() => {});
  }
}

/** The session's relay: the claimed spare when it answered and serves these services, else a new one. */
async function sessionRelay(
  end: SessionEnd,
  proxies: StartedProxies,
  options: SessionOptions,
): Promise<RelayHost> {
  const { transport, claimed, answering, mounted } = end.place;
  const relayOptions = {
    sockets: proxies.sockets,
    sandboxSocketDir: mounted?.sandbox,
    launch: (args: string[]) => transport.launchRelay(args, options.runId),
    sandboxName: transport.sandboxName,
    onEvent: (message: string) =>
      options.onProgress?.(`sandbox ${transport.sandboxName}: ${message}`),
  };
  // A spare that failed to answer is no spare (awaitSpareRelay stopped it).
  const spare = await answering?.catch(() => undefined);
  if (spare && sameServices(claimed!.record.ports, proxies.sockets)) {
    const relay = adoptRelay(relayOptions, claimed!.record.ports, spare);
    end.serving = { spare, relay };
    trace("session: spare relay claimed");
    return relay;
  }
  if (spare) await spare.stop();
  return await startRelay(relayOptions);
}

/** The session as its user sees it, once its relay listens. */
async function sessionOf(
  end: SessionEnd,
  proxies: StartedProxies,
  relay: RelayHost,
): Promise<SandboxSession> {
  const { transport, mount, mounted, dir } = end.place;
  const local = (port: number | undefined) =>
    port === undefined ? undefined : `http://127.0.0.1:${port}`;
  const gitUrl = relay.ports.git === undefined
    ? undefined
    : `${local(relay.ports.git)}${(await import("./git_proxy.ts")).GIT_PATH_PREFIX}`;
  const close = () => end.close();
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
      if (end.leavingSpare || !mount || relay.transport !== "socket" || end.spareServes()) return;
      // Best effort: without a spare, the next session starts its own relay.
      end.leavingSpare = startSpareRelay(transport, mount, otherPorts(relay.ports)).catch(
        () => {},
      );
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}

/**
 * Open a session for a running sandbox, whose relay `transport` reaches (a run's sandbox comes
 * with its own, `RunSandbox.relay`; a Docker container's is `relayTransportFor`): its proxies on
 * Unix sockets, a relay inside the sandbox that listens on loopback there and carries
 * connections to them, and the variables that point the sandbox's tools at the relay. Returns
 * once the relay listens.
 */
export async function openSession(
  profile: Profile,
  transport: SandboxRelayTransport,
  options: SessionOptions = {},
): Promise<SandboxSession> {
  const end = new SessionEnd(await placeSession(transport, options.relayTransport));
  try {
    const proxies = await startProxies(profile, { socketDir: end.place.dir }, options);
    end.cleanups.push(() => proxies.close());
    // The sandbox user is another uid: it may connect (the 0700 parent keeps everyone else out).
    if (end.place.mounted) {
      for (const socket of Object.values(proxies.sockets)) await Deno.chmod(socket, 0o666);
    }
    const relay = await sessionRelay(end, proxies, options);
    end.cleanups.push(() => relay.close());
    // The next session's relay, if one was asked for: this process must not end before the
    // sandbox has started it.
    end.cleanups.push(async () => await end.leavingSpare);
    trace(`session: relay ready (${relay.transport} path)`);
    return await sessionOf(end, proxies, relay);
  } catch (error) {
    await end.close();
    throw error;
  }
}
