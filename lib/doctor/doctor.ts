/**
 * `sandbox doctor`: prove on this machine, with this configuration, that the sandbox holds.
 *
 * How it works:
 * 1. A throwaway sandbox of the profile is made cold (its own name, `sandbox-<profile>-doctor…`,
 *    labelled as a run's, every docker call through `DoctorOptions.docker`), with a session
 *    (relay and proxies) whose LLM key is a canary made up here, so that "read the key" has
 *    something to look for. Mode devcontainer: of the profile its runs get (the repository's
 *    devcontainer image).
 * 2. The profile is the user's with only what the attacks need added: the host's loopback allowed
 *    by name (`localhost`, `127.0.0.1` on the listener's port) for the address guard to refuse,
 *    `doctor-twin.test` mapped to it in `network.hosts` for the twin, and `resources.disk` lowered
 *    to at most 64 MiB so that filling it past the limit takes seconds (same mechanism).
 * 3. The attacks run as the sandbox user with the session's environment (lib/doctor/probes.ts);
 *    the verdicts come from lib/doctor/verdicts.ts.
 * 4. The sandbox is destroyed whatever happens (an error, Ctrl-C), and the setsid child is looked
 *    for once more after it.
 * Modes kubernetes and local: lib/doctor/kubernetes.ts and lib/doctor/local.ts.
 */
import type { Profile } from "../config.ts";
import { SandboxError } from "../errors.ts";
import { randomHex } from "../hash.ts";
import { KeyStore } from "../keys.ts";
import { Redactor } from "../redact.ts";
import { openSession, type SandboxSession } from "../proxy/session.ts";
import { forget, holdOwn } from "../sandbox/pool_records.ts";
import { removeProxyMountSource } from "../sandbox/proxy_mount.ts";
import { DockerSandboxProvider } from "../sandbox/docker_provider.ts";
import { DockerRelayTransport } from "../sandbox/docker_relay.ts";
import { DockerCli } from "../sandbox/docker.ts";
import type { SandboxProvider } from "../sandbox/provider.ts";
import { type EnvironmentFacts, environmentFacts } from "./environment.ts";
import type { KubernetesFacts } from "./kubernetes.ts";
import type { LocalFacts } from "./local.ts";
import { type HostListeners, ordinaryReach, startListeners } from "./listeners.ts";
import {
  DENIED_HOST,
  fillScript,
  parseProbe,
  PROBE_ENV,
  PROBE_SCRIPT,
  SURVIVOR_CHECK,
  TWIN_HOST,
} from "./probes.ts";
import {
  brokenChecks,
  type DefenceCheck,
  DEFENCES,
  judgeDisk,
  judgeEscalation,
  judgeKey,
  judgeReach,
  judgeSurvivor,
  nothingIsolated,
} from "./verdicts.ts";

/** The workspace limit the disk attack fills past (or the profile's, when smaller). */
export const DOCTOR_DISK_BYTES = 64 * 1024 * 1024;
/** The variable the canary key is read from (in this process only, never the real environment). */
const CANARY_ENV = "SANDBOX_DOCTOR_CANARY_KEY";

export interface DoctorOptions {
  signal?: AbortSignal;
  /** Each step, for stderr. */
  onProgress?: (line: string) => void;
  /** Path of the docker CLI (default: `docker` on PATH). */
  docker?: string;
  /**
   * Mode devcontainer: the local repository whose devcontainer is checked (default: the current
   * directory's), as `up` and `exec` take it.
   */
  repo?: string;
}

/** What a devcontainer profile's sandbox is made from. */
export interface DoctorDevcontainer {
  /** Repository-relative path of its devcontainer.json. */
  config: string;
  /** The devcontainer's image (`sandbox-devcontainer:<hash>`), the sandbox layer on top of it. */
  image: string;
}

export interface DoctorReport {
  profile: string;
  mode: string;
  network: string;
  environment: EnvironmentFacts | null;
  /** The image the throwaway sandbox ran (null in mode none). */
  image: string | null;
  /** Mode devcontainer: the devcontainer whose image was checked. */
  devcontainer?: DoctorDevcontainer;
  /** Mode kubernetes: what the cluster gives (`environment` is then null). */
  kubernetes?: KubernetesFacts;
  /** Mode local: what bubblewrap and this host give (`environment` is then null). */
  local?: LocalFacts;
  checks: DefenceCheck[];
  /** The checks that should hold and do not; the command exits non-zero when there is any. */
  broken: string[];
  durationMs: number;
}

/** Run every attack against a throwaway sandbox of `profile` and judge what they did. */
export async function runDoctor(
  profile: Profile,
  options: DoctorOptions = {},
): Promise<DoctorReport> {
  const started = performance.now();
  let devcontainer: DoctorDevcontainer | undefined;
  const report = (
    environment: EnvironmentFacts | null,
    attacked: { image: string | null; checks: DefenceCheck[] },
  ): DoctorReport => ({
    profile: profile.name,
    mode: profile.sandbox.mode,
    network: profile.sandbox.network.mode,
    environment,
    image: attacked.image,
    ...(devcontainer ? { devcontainer } : {}),
    checks: attacked.checks,
    broken: brokenChecks(attacked.checks).map((c) => c.id),
    durationMs: Math.round(performance.now() - started),
  });
  if (profile.sandbox.mode === "none") {
    return report(null, { image: null, checks: nothingIsolated("none") });
  }
  if (profile.sandbox.mode === "kubernetes") {
    // Loaded only in this mode, as lib/sandbox/providers.ts loads the provider.
    const { attackPod } = await import("./kubernetes.ts");
    const progress = (line: string) => options.onProgress?.(line);
    const attacked = await attackPod(profile, { signal: options.signal, progress });
    return { ...report(null, attacked), kubernetes: attacked.facts };
  }
  if (profile.sandbox.mode === "local") {
    // Loaded only in this mode, as lib/sandbox/providers.ts loads the provider.
    const { attackLocal } = await import("./local.ts");
    const progress = (line: string) => options.onProgress?.(line);
    const attacked = await attackLocal(profile, { signal: options.signal, progress });
    return { ...report(null, { image: null, checks: attacked.checks }), local: attacked.facts };
  }
  let target = profile;
  if (profile.sandbox.mode === "devcontainer") {
    const opened = await openDevcontainerOf(profile, options);
    target = opened.profile;
    devcontainer = opened.devcontainer;
  }
  if (target.sandbox.mode !== "container") {
    throw new SandboxError(
      "unsupported",
      `Cannot check profile "${profile.name}": doctor checks sandbox modes "container", "devcontainer", "kubernetes", "local" and "none"`,
      { detail: `Its mode is "${profile.sandbox.mode}"` },
    );
  }
  const docker = new DockerCli(options.docker);
  const facts = environmentFacts(docker, options.signal);
  await using listeners = await startListeners(docker, options.signal);
  const attacked = await attackSandbox(
    target,
    listeners,
    options,
    (quota) => facts.then((f) => void (f.diskQuota = quota)),
  );
  return report(await facts, attacked);
}

/**
 * The profile a run of devcontainer profile `profile` runs (mode container, the repository's
 * devcontainer image, built when it changed), as `up` and `run` open it.
 */
async function openDevcontainerOf(
  profile: Profile,
  options: DoctorOptions,
): Promise<{ profile: Profile; devcontainer: DoctorDevcontainer }> {
  // Loaded only in this mode, as lib/sandbox/providers.ts does.
  const { openDevcontainer } = await import("../sandbox/devcontainer/provider.ts");
  options.onProgress?.("opening the repository's devcontainer (built when it changed)");
  const opened = await openDevcontainer(profile, {
    repo: options.repo ?? Deno.cwd(),
    docker: new DockerCli(options.docker),
    onProgress: options.onProgress,
    signal: options.signal,
  });
  return {
    profile: opened.profile,
    devcontainer: { config: opened.config.file, image: opened.image.tag },
  };
}

/** The profile the throwaway sandbox runs: the user's, plus what the attacks need. */
export function doctorProfile(profile: Profile, egressPort: number): Profile {
  const network = profile.sandbox.network;
  return {
    ...profile,
    llm: { ...profile.llm, key: { env: CANARY_ENV } },
    sandbox: {
      ...profile.sandbox,
      pool: 0,
      network: {
        ...network,
        allow: [
          ...network.allow,
          `localhost:${egressPort}`,
          `127.0.0.1:${egressPort}`,
          `${TWIN_HOST}:${egressPort}`,
        ],
        hosts: { ...network.hosts, [TWIN_HOST]: "127.0.0.1" },
      },
    },
    resources: {
      ...profile.resources,
      diskBytes: Math.min(profile.resources.diskBytes, DOCTOR_DISK_BYTES),
    },
  };
}

/** The canary key, in a key store that has read it as a run reads its key (from `CANARY_ENV`). */
export async function canaryKeys(): Promise<{
  canary: string;
  keys: KeyStore;
  redactor: Redactor;
}> {
  const canary = `sk-doctor-canary-${randomHex(24)}`;
  const redactor = new Redactor();
  const keys = new KeyStore({ redactor, env: (name) => name === CANARY_ENV ? canary : undefined });
  // Read now, as a run reads its key: from here on the key is in this process, as in a real run.
  await keys.resolve({ env: CANARY_ENV });
  return { canary, keys, redactor };
}

async function attackSandbox(
  user: Profile,
  listeners: HostListeners,
  options: DoctorOptions,
  onQuota: (quota: boolean) => Promise<void>,
): Promise<{ image: string; checks: DefenceCheck[] }> {
  const profile = doctorProfile(user, listeners.loopbackPort);
  const { canary, keys, redactor } = await canaryKeys();
  const progress = (line: string) => options.onProgress?.(line);
  progress(`starting a throwaway sandbox of profile "${user.name}"`);
  const sandbox = await throwawaySandbox(profile, options);
  const marker = `doctor-survivor-${randomHex(6)}`;
  let observed: Observed | undefined;
  const logDir = await Deno.makeTempDir({ prefix: "sandbox-doctor-" });
  try {
    await onQuota((await sandbox.workspaceQuota(options.signal)) !== undefined);
    await using session = await openSession(profile, new DockerRelayTransport(sandbox), {
      keys,
      redactor,
      signal: options.signal,
      runId: sandbox.containerName,
      // The doctor's own traffic stays out of the user's access log.
      accessLogPath: `${logDir}/access.ndjson`,
    });
    observed = await observe(sandbox, session, { canary, marker, listeners, progress, options });
  } finally {
    progress("destroying the throwaway sandbox");
    await destroyNow(sandbox);
    await Deno.remove(logDir, { recursive: true });
  }
  const afterDestroy = await survivesDestroy(sandbox, marker);
  return { image: observed?.image ?? "", checks: judgeAll(observed, afterDestroy, profile) };
}

/**
 * A run's cold container of `profile` (as lib/sandbox/pool.ts `coldSandbox` makes one: recorded as
 * held by this process, so that no reaping takes it), made through `options.docker`.
 */
async function throwawaySandbox(
  profile: Profile,
  options: DoctorOptions,
): Promise<DockerSandboxProvider> {
  const sandbox = new DockerSandboxProvider(profile, {
    instance: `doctor${randomHex(4)}`,
    pooled: false,
    docker: options.docker,
  });
  await holdOwn(sandbox.containerName);
  await sandbox.ensureRunning({ signal: options.signal });
  return sandbox;
}

interface Observed {
  /** The image the sandbox's container runs, as the engine says. */
  image: string;
  nonce: string;
  probe: Map<string, string[][]>;
  probeExit: number;
  survivorAfterCommand: string;
  hostTwin: string | undefined;
  disk: { twin: FillOutcome; attack: FillOutcome; limitBytes: number };
}

export interface FillOutcome {
  completed: boolean;
  stoppedBy: string;
  writtenBytes?: number;
}

interface ObserveContext {
  canary: string;
  marker: string;
  listeners: HostListeners;
  progress: (line: string) => void;
  options: DoctorOptions;
}

const base64 = (text: string) => btoa(text);

async function observe(
  sandbox: DockerSandboxProvider,
  session: SandboxSession,
  context: ObserveContext,
): Promise<Observed> {
  const { signal } = context.options;
  const { listeners } = context;
  // Half of the canary: enough to be unmistakable, and no value holding the whole key enters.
  const canaryPart = context.canary.slice(0, Math.ceil(context.canary.length / 2));
  context.progress("attacking: the key, escalation, the network, a setsid survivor");
  const { image } = await sandbox.status({ signal });
  const twin = listeners.gatewayTarget
    ? ordinaryReach(sandbox.docker, image, listeners.gatewayTarget, signal)
    : Promise.resolve(undefined);
  const result = await sandbox.exec(["bash", "-c", PROBE_SCRIPT], {
    env: {
      ...session.env,
      [PROBE_ENV.canary]: base64(canaryPart),
      [PROBE_ENV.token]: base64(session.token),
      [PROBE_ENV.marker]: context.marker,
      [PROBE_ENV.hostTargets]: listeners.hostTargets.join(" "),
      [PROBE_ENV.egressPort]: String(listeners.loopbackPort),
    },
    signal,
    timeoutMs: 120_000,
  });
  const after = await sandbox.exec(["bash", "-c", SURVIVOR_CHECK], {
    env: { [PROBE_ENV.marker]: context.marker },
    signal,
  });
  const inspect = await sandbox.docker.run(["container", "inspect", sandbox.containerName], {
    signal,
  });
  const probe = parseProbe(result.stdout);
  if (inspect.stdout.includes(canaryPart)) {
    probe.set("key-found", [...probe.get("key-found") ?? [], ["docker inspect of the container"]]);
  }
  context.progress("attacking: filling the workspace past its limit");
  const limitBytes = sandbox.profile.resources.diskBytes;
  const mib = Math.max(1, Math.floor(limitBytes / (1024 * 1024)));
  const twinFill = await fill(sandbox, Math.max(1, Math.floor(mib / 4)), signal);
  const attackFill = await fill(sandbox, mib * 3, signal);
  return {
    image,
    nonce: listeners.nonce,
    probe,
    probeExit: result.exitCode,
    survivorAfterCommand: after.stdout.trim(),
    hostTwin: await twin,
    disk: { twin: twinFill, attack: attackFill, limitBytes },
  };
}

/** What the disk attack needs of a sandbox: its commands, and the disk watch a run has. */
export interface FillTarget {
  exec: SandboxProvider["exec"];
  /** `ready`, when given, resolves once the watch can see the write (it has a size from before). */
  watchDisk(): { readonly signal: AbortSignal; close(): Promise<void>; ready?: Promise<void> };
}

/** Write `mib` MiB into the workspace while the disk watch runs, as a run's command would. */
export async function fill(
  sandbox: FillTarget,
  mib: number,
  signal?: AbortSignal,
): Promise<FillOutcome> {
  const watch = sandbox.watchDisk();
  try {
    await watch.ready;
    const result = await sandbox.exec(["bash", "-c", fillScript(mib)], {
      signal: signal ? AbortSignal.any([signal, watch.signal]) : watch.signal,
      timeoutMs: 120_000,
    });
    const lines = parseProbe(result.stdout);
    const size = Number(lines.get("size")?.[0]?.[0]);
    return {
      completed: /^wrote$/m.test(result.stdout),
      stoppedBy: lines.get("write-failed")?.[0]?.[0] ?? `exit ${result.exitCode}`,
      writtenBytes: Number.isFinite(size) ? size : undefined,
    };
  } catch (error) {
    if (!watch.signal.aborted) throw error;
    const reason = watch.signal.reason;
    return {
      completed: false,
      stoppedBy: reason instanceof Error ? reason.message : String(reason),
    };
  } finally {
    await watch.close();
  }
}

/** The sandbox, its volume and the host's records of it, removed before this returns. */
async function destroyNow(sandbox: DockerSandboxProvider): Promise<void> {
  await sandbox.teardown({ volumes: true, signal: AbortSignal.timeout(120_000) });
  await Promise.all([removeProxyMountSource(sandbox.containerName), forget(sandbox.containerName)]);
}

/** After the sandbox was destroyed: its container, or a process with the marker, still there. */
async function survivesDestroy(sandbox: DockerSandboxProvider, marker: string): Promise<string> {
  const found: string[] = [];
  const listed = await sandbox.docker.run(
    ["ps", "--all", "--quiet", "--filter", `name=^/${sandbox.containerName}$`],
    { timeoutMs: 30_000 },
  );
  if (listed.stdout.trim()) found.push(`container ${sandbox.containerName}`);
  // On a local engine the container's processes are this host's: none may carry the marker.
  // A host without /proc (not Linux) has no such processes to look for.
  const entries = await Array.fromAsync(Deno.readDir("/proc")).catch(() => [] as Deno.DirEntry[]);
  for (const entry of entries) {
    if (!/^\d+$/.test(entry.name)) continue;
    const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (cmdline.startsWith(marker)) found.push(`host process ${entry.name}`);
  }
  return found.join(", ");
}

function judgeAll(observed: Observed | undefined, afterDestroy: string, profile: Profile) {
  if (!observed) throw new SandboxError("docker_failed", "The doctor's sandbox gave no answer");
  const { probe, disk } = observed;
  const field = (name: string) => probe.get(name)?.[0] ?? [];
  const checks: DefenceCheck[] = [
    judgeKey({
      canaryFound: (probe.get("key-found") ?? []).map((f) => f.join(" ")),
      tokenFound: probe.has("key-twin"),
    }),
  ];
  checks.push(judgeHostService(observed));
  checks.push(...judgeEgress(probe, observed.nonce, profile));
  const unshare = field("unshare");
  checks.push(judgeEscalation({
    statusRead: probe.has("CapEff"),
    capEff: field("CapEff")[0] ?? "?",
    capPrm: field("CapPrm")[0] ?? "?",
    noNewPrivs: field("NoNewPrivs")[0] === "1",
    setuidFiles: (probe.get("setuid") ?? []).map((f) => f[0]),
    unshare: unshare[0] === "missing" ? "missing" : unshare[0] === "0" ? "succeeded" : "refused",
    unshareDetail: unshare[1] ?? unshare[0] ?? "",
  }));
  checks.push(judgeSurvivor({
    seenDuring: probe.has("survivor"),
    aliveAfterCommand: observed.survivorAfterCommand !== "",
    aliveAfterDestroy: afterDestroy !== "",
    detail: [observed.survivorAfterCommand, afterDestroy].filter(Boolean).join("; ") ||
      "no process with its marker",
  }));
  checks.push(judgeFill(disk), NO_GIT_REMOTE);
  return checks;
}

function judgeHostService(observed: Observed): DefenceCheck {
  const reached: string[] = [];
  const refused: string[] = [];
  for (const [target, code, rest] of observed.probe.get("host") ?? []) {
    if (rest?.includes(observed.nonce)) reached.push(target);
    else refused.push(`${target}: ${code === "000" ? (rest ?? "").trim() : `HTTP ${code}`}`);
  }
  const twin = observed.hostTwin;
  return judgeReach("host_service", {
    reached,
    refused,
    twinReached: twin?.includes(observed.nonce) ?? false,
    twinDetail: twin === undefined
      ? "no bridge gateway on this host to serve an ordinary container"
      : `an ordinary container of the same image on the default bridge: ${twin}`,
  });
}

/** The egress proxy's two defences: the allowlist, and the address guard behind an allowed name. */
export function judgeEgress(
  probe: Map<string, string[][]>,
  nonce: string,
  profile: Profile,
): DefenceCheck[] {
  const lines = new Map((probe.get("egress") ?? []).map(([name, code, rest]) => [name, {
    code,
    rest: (rest ?? "").trim(),
  }]));
  const twin = lines.get("twin");
  const interfaces = (probe.get("interfaces")?.[0]?.[0] ?? "").trim();
  const absent = twin?.code === "none"
    ? `network mode "${profile.sandbox.network.mode}": no egress proxy, the sandbox has its own network (interfaces: ${interfaces})`
    : undefined;
  const twinSeen = {
    twinReached: twin?.rest.includes(nonce) ?? false,
    twinDetail: `${TWIN_HOST} (mapped to the host's loopback in network.hosts) through the proxy: ${
      twin ? `HTTP ${twin.code}` : "no answer"
    }`,
    absent,
  };
  const denied = lines.get("denied");
  // Past the policy is past the defence: a 502 means the proxy went on to resolve the name. No
  // HTTP status at all (curl missing from the image) is no answer: the attack did not run.
  const passed = denied !== undefined && /^\d{3}$/.test(denied.code) &&
    !["403", "000", "none"].includes(denied.code);
  const allowlist = judgeReach("egress_allowlist", {
    reached: passed ? [`${DENIED_HOST} (HTTP ${denied.code}: let through the policy)`] : [],
    refused: passed || !denied ? [] : [`${DENIED_HOST}: HTTP ${denied.code} ${denied.rest}`],
    ...twinSeen,
  });
  const reached: string[] = [];
  const refused: string[] = [];
  for (const name of ["internal-plain", "internal-connect", "internal-literal"]) {
    const line = lines.get(name);
    if (line?.rest.includes(nonce)) reached.push(`${name} (the host's loopback answered)`);
    else refused.push(`${name}: HTTP ${line?.code ?? "?"}`);
  }
  return [allowlist, judgeReach("address_guard", { reached, refused, ...twinSeen })];
}

/** The disk check from what the two fills did (the twin under the limit, the attack past it). */
export function judgeFill(
  disk: { twin: FillOutcome; attack: FillOutcome; limitBytes: number },
): DefenceCheck {
  return judgeDisk({
    limitBytes: disk.limitBytes,
    twinCompleted: disk.twin.completed,
    attackCompleted: disk.attack.completed,
    stoppedBy: disk.attack.stoppedBy,
    writtenBytes: disk.attack.writtenBytes,
  });
}

/** The git grant where the doctor has no remote to push to. */
export const NO_GIT_REMOTE: DefenceCheck = {
  id: "git_grant",
  defence: DEFENCES.git_grant,
  status: "not_applicable",
  reason: "no git remote: the git proxy serves only runs on a remote repository (run --repo URL)",
  evidence: [],
};
