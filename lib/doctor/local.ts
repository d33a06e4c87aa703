/**
 * `sandbox doctor` in sandbox mode local (bubblewrap, docs/local.md): the container's attacks, run
 * in a throwaway local sandbox acquired as a run acquires one (`sandboxLifecycle(profile)`), with a
 * session opened on its relay as a run opens it (the relay a command in the sandbox, the proxies'
 * sockets bound in read-only), so that the key, the egress allowlist and the address guard are
 * attacked exactly as in a container. What differs:
 * - a host service: the doctor's listeners are on the host's loopback and on a non-loopback
 *   address of the host; the twin is the same request from this process, on the host;
 * - a survivor: mode local keeps what a command leaves until the sandbox is released (docs/local.md
 *   "What does not hold"), so the setsid child is judged after the release, on the host's /proc;
 * - the disk: the host's `du` watch of the checkout; the write starts once the watch has its first
 *   size, as a run's agent starts after its watch;
 * - the environment: bubblewrap's version, user namespaces, the cgroup version, which mechanism
 *   holds `resources.memory`, `cpus` and `pids` (and what it leaves unlimited), and the seccomp
 *   filter as a command of the sandbox sees it.
 */
import type { Profile } from "../config.ts";
import { randomHex } from "../hash.ts";
import { run } from "../process.ts";
import { openSession, type SandboxSession } from "../proxy/session.ts";
import type { DiskWatch } from "../sandbox/disk_watch.ts";
import { localTools } from "../sandbox/local/bwrap.ts";
import type { LocalLimits } from "../sandbox/local/limits.ts";
import type { LocalSandbox } from "../sandbox/local/local_sandbox.ts";
import type { RunSandbox } from "../sandbox/provider.ts";
import { sandboxLifecycle } from "../sandbox/providers.ts";
import { formatBytes } from "../units.ts";
import {
  canaryKeys,
  doctorProfile,
  fill,
  type FillOutcome,
  judgeEgress,
  judgeFill,
  NO_GIT_REMOTE,
} from "./doctor.ts";
import { escalationSeen, parseProbe, PROBE_ENV, PROBE_SCRIPT, SURVIVOR_CHECK } from "./probes.ts";
import {
  type DefenceCheck,
  judgeEscalation,
  judgeKey,
  judgeReach,
  judgeSurvivor,
} from "./verdicts.ts";

/** What bubblewrap and this host give a local sandbox: facts, not verdicts. */
export interface LocalFacts {
  /** `bwrap --version`, or null when it did not say. */
  bwrap: string | null;
  /** `user.max_user_namespaces` (0: none may be made), or null when unknown. */
  maxUserNamespaces: number | null;
  /** 1 or 2, or null when /sys/fs/cgroup shows neither. */
  cgroupVersion: number | null;
  /** What holds the sandbox's limits: its own cgroup (v2 or v1), or rlimits per command. */
  limits: LocalLimits["kind"];
  /** What holds `resources.memory`, `resources.cpus` and `resources.pids`, in words. */
  memory: string;
  cpu: string;
  pids: string;
  /** The seccomp filter as a command of the sandbox sees it (`/proc/self/status`). */
  seccomp: string;
  /** Landlock as every command of the sandbox has it: `applied (ABI N)`, or `absent: why`. */
  landlock: string;
}

export interface LocalAttacked {
  facts: LocalFacts;
  checks: DefenceCheck[];
}

/** The doctor's listeners on this host: its loopback, and one of its other addresses if any. */
interface LocalListeners extends AsyncDisposable {
  nonce: string;
  loopbackPort: number;
  targets: string[];
}

function startLocalListeners(): LocalListeners {
  const nonce = `doctor-nonce-${randomHex(8)}`;
  const listen = (hostname: string) =>
    Deno.serve({ hostname, port: 0, onListen: () => {} }, () => new Response(`${nonce}\n`));
  // An address of the host's own network before a bridge's (an engine's bridge may be down).
  const others = Deno.networkInterfaces().filter((i) =>
    i.family === "IPv4" && !i.address.startsWith("127.")
  );
  const other = others.find((i) => !/^(docker|br-|veth|virbr)/.test(i.name)) ?? others[0];
  const servers = [listen("127.0.0.1"), ...(other ? [listen(other.address)] : [])];
  return {
    nonce,
    loopbackPort: servers[0].addr.port,
    targets: servers.map((s) => `${s.addr.hostname}:${s.addr.port}`),
    [Symbol.asyncDispose]: async () => void await Promise.all(servers.map((s) => s.shutdown())),
  };
}

/** Attack a throwaway local sandbox of `user`'s profile; released before this returns. */
export async function attackLocal(
  user: Profile,
  options: { signal?: AbortSignal; progress: (line: string) => void },
): Promise<LocalAttacked> {
  const { signal, progress } = options;
  const tools = await localTools();
  await using listeners = startLocalListeners();
  const profile = doctorProfile(user, listeners.loopbackPort);
  const { canary, keys, redactor } = await canaryKeys();
  progress(`starting a throwaway local sandbox of profile "${user.name}"`);
  const lifecycle = await sandboxLifecycle(profile);
  const logDir = await Deno.makeTempDir({ prefix: "sandbox-doctor-" });
  const sandbox = await lifecycle.acquire({ runId: `doctor${randomHex(4)}`, signal })
    .catch(async (error) => {
      await Deno.remove(logDir, { recursive: true });
      throw error;
    });
  const marker = `doctor-survivor-${randomHex(6)}`;
  // LocalLifecycle's sandboxes are LocalSandboxes: what holds their limits is theirs to say.
  const { limits: { kind: limits }, landlock } = sandbox.provider as LocalSandbox;
  let observed: Observed;
  try {
    await using session = await openSession(profile, sandbox.relay!, {
      keys,
      redactor,
      signal,
      runId: sandbox.name,
      // The doctor's own traffic stays out of the user's access log.
      accessLogPath: `${logDir}/access.ndjson`,
    });
    progress("attacking: the key, escalation, the network, a setsid survivor");
    observed = await observe(sandbox, session, { canary, marker, listeners, signal });
    progress("attacking: filling the workspace past its limit");
    observed.disk = await fillPastLimit(sandbox, profile.resources.diskBytes, signal);
  } finally {
    progress("releasing the throwaway sandbox");
    await sandbox.release();
    await Deno.remove(logDir, { recursive: true });
  }
  const afterRelease = await survivorAfterRelease(marker);
  const bwrap = await run([tools.bwrap, "--version"], { clearEnv: true, timeoutMs: 30_000 });
  const facts = await localFacts(profile, limits, observed.probe, {
    bwrap: bwrap.stdout.trim() || null,
    landlock: "abi" in landlock ? `applied (ABI ${landlock.abi})` : `absent: ${landlock.absent}`,
  });
  return { facts, checks: judgeLocal(observed, afterRelease, profile) };
}

interface Observed {
  probe: Map<string, string[][]>;
  nonce: string;
  survivorAfterCommand: string;
  /** The same requests from this process, on the host: target → what answered. */
  hostTwin: Map<string, string>;
  disk?: { twin: FillOutcome; attack: FillOutcome; limitBytes: number };
}

/** What a command of the sandbox sees besides the container's probes: seccomp, setuid, links. */
const LOCAL_PROBE = `
printf 'interfaces\\t%s\\n' "$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')"
grep -E '^Seccomp(_filters)?:' /proc/self/status | sed 's/:[[:space:]]*/\\t/'
find /usr -xdev \\( -perm -4000 -o -perm -2000 \\) -type f 2>/dev/null | head -20 | sed 's/^/setuid\\t/'
`;

async function observe(
  sandbox: RunSandbox,
  session: SandboxSession,
  context: { canary: string; marker: string; listeners: LocalListeners; signal?: AbortSignal },
): Promise<Observed> {
  const { listeners, signal } = context;
  // Half of the canary: enough to be unmistakable, and no value holding the whole key enters.
  const canaryPart = context.canary.slice(0, Math.ceil(context.canary.length / 2));
  const result = await sandbox.provider.exec(["bash", "-c", LOCAL_PROBE + PROBE_SCRIPT], {
    env: {
      ...session.env,
      [PROBE_ENV.canary]: btoa(canaryPart),
      [PROBE_ENV.token]: btoa(session.token),
      [PROBE_ENV.marker]: context.marker,
      [PROBE_ENV.hostTargets]: listeners.targets.join(" "),
      [PROBE_ENV.egressPort]: String(listeners.loopbackPort),
    },
    signal,
    timeoutMs: 120_000,
  });
  const after = await sandbox.provider.exec(["bash", "-c", SURVIVOR_CHECK], {
    env: { [PROBE_ENV.marker]: context.marker },
    signal,
  });
  const hostTwin = new Map<string, string>();
  for (const target of listeners.targets) {
    const twin = await run(["curl", "-sS", "-m", "5", "--noproxy", "*", `http://${target}/`], {
      clearEnv: true,
      signal,
      timeoutMs: 30_000,
    });
    hostTwin.set(target, (twin.stdout + twin.stderr).trim().slice(0, 200));
  }
  return {
    probe: parseProbe(result.stdout),
    nonce: listeners.nonce,
    survivorAfterCommand: after.stdout.trim(),
    hostTwin,
  };
}

/** A quarter of the limit (the twin), then three times it, each under the run's disk watch. */
async function fillPastLimit(sandbox: RunSandbox, limitBytes: number, signal?: AbortSignal) {
  const target = {
    exec: sandbox.provider.exec.bind(sandbox.provider),
    watchDisk: () => watchFromFirstSize(sandbox),
  };
  const mib = Math.max(1, Math.floor(limitBytes / (1024 * 1024)));
  const twin = await fill(target, Math.max(1, Math.floor(mib / 4)), signal);
  const attack = await fill(target, mib * 3, signal);
  return { twin, attack, limitBytes };
}

/**
 * The run's disk watch of `sandbox`, its signal aborted with the watch's reason, `ready` once it
 * has measured the checkout (it stops growth past the limit, so it needs a size from before).
 */
function watchFromFirstSize(sandbox: RunSandbox) {
  const controller = new AbortController();
  const watch = sandbox.watchDisk({ onAbort: (reason) => controller.abort(reason) });
  const sized = watch as Partial<DiskWatch>;
  const ready = (async () => {
    // Bounded: a watch that reports nothing fails closed after its silence limit (disk_watch.ts).
    while ("usedBytes" in sized && sized.usedBytes === undefined && !controller.signal.aborted) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  })();
  return { signal: controller.signal, close: () => watch.close(), ready };
}

/**
 * After the release: host processes carrying the marker (a sandbox's processes are this host's,
 * in a pid namespace of its own). The release kills them; this waits up to 10 s for the kernel
 * to have reaped them, and names any still there.
 */
async function survivorAfterRelease(marker: string): Promise<string> {
  let found: string[] = [];
  for (let attempt = 0; attempt < 100; attempt++) {
    found = [];
    for await (const entry of Deno.readDir("/proc")) {
      if (!/^\d+$/.test(entry.name)) continue;
      // A process that ended during the walk has no command line: not one left behind.
      const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
      if (cmdline.startsWith(marker)) found.push(`host process ${entry.name}`);
    }
    if (found.length === 0) return "";
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return found.join(", ");
}

function judgeLocal(observed: Observed, afterRelease: string, profile: Profile): DefenceCheck[] {
  const { probe, disk } = observed;
  const checks: DefenceCheck[] = [
    judgeKey({
      canaryFound: (probe.get("key-found") ?? []).map((f) => f.join(" ")),
      tokenFound: probe.has("key-twin"),
      searched: "any readable environment, command line or file of the sandbox",
    }),
    judgeHostService(observed),
    ...judgeLocalEgress(probe, observed.nonce, profile),
    judgeEscalation(escalationSeen(probe)),
    judgeSurvivor({
      seenDuring: probe.has("survivor"),
      aliveAfterCommand: observed.survivorAfterCommand !== "",
      aliveAfterDestroy: afterRelease !== "",
      detail: [observed.survivorAfterCommand, afterRelease].filter(Boolean).join("; ") ||
        "no process with its marker",
      leftoversUntilRelease:
        "mode local keeps what a command leaves until the sandbox is released: docs/local.md",
    }),
  ];
  if (disk) {
    checks.push(judgeFill(disk));
  }
  checks.push(NO_GIT_REMOTE);
  return checks;
}

/**
 * The egress proxy's rows. Network mode full has no egress proxy: BROKEN where the sandbox has a
 * network of its own, but a local sandbox's holder has only its loopback (seen by the probe), so
 * that nothing outside is reachable, allowed or not: NOT APPLICABLE, saying so.
 */
function judgeLocalEgress(
  probe: Map<string, string[][]>,
  nonce: string,
  profile: Profile,
): DefenceCheck[] {
  const checks = judgeEgress(probe, nonce, profile);
  const interfaces = (probe.get("interfaces")?.[0]?.[0] ?? "").trim();
  if (profile.sandbox.network.mode !== "full" || interfaces !== "lo") return checks;
  return checks.map((c) => ({
    ...c,
    status: "not_applicable",
    reason: 'network mode "full" in mode local: no egress proxy, and the sandbox has no network ' +
      "but its own loopback (interfaces: lo), so nothing outside is reachable, allowed or not",
  }));
}

/** The host's listeners from inside: refused, while the same requests on the host got answers. */
function judgeHostService(observed: Observed): DefenceCheck {
  const reached: string[] = [];
  const refused: string[] = [];
  for (const [target, code, rest] of observed.probe.get("host") ?? []) {
    if (rest?.includes(observed.nonce)) reached.push(target);
    else refused.push(`${target}: ${code === "000" ? (rest ?? "").trim() : `HTTP ${code}`}`);
  }
  const twins = [...observed.hostTwin];
  return judgeReach("host_service", {
    reached,
    refused,
    twinReached: twins.length > 0 && twins.every(([, answer]) => answer.includes(observed.nonce)),
    twinDetail: `the same requests from this process on the host: ${
      twins.map(([target, answer]) =>
        `${target} ${answer.includes(observed.nonce) ? "answered" : answer}`
      ).join(", ")
    }`,
  });
}

/**
 * What holds `resources.memory`, `cpus` and `pids` under the mechanism `limits`, in words: a limit
 * no mechanism holds is said to be not limited, and why (rlimits hold processes only, and
 * `RLIMIT_NPROC` binds no root).
 */
export function limitsHeld(
  limits: LocalLimits["kind"],
  r: Pick<Profile["resources"], "memoryBytes" | "cpus" | "pids">,
  isRoot: boolean,
): Pick<LocalFacts, "memory" | "cpu" | "pids"> {
  const cgroup = limits === "rlimit" ? undefined : `its cgroup (${limits})`;
  const noCgroup = "not limited: no cgroup this user may make (rlimits hold processes only)";
  return {
    memory: cgroup ? `${formatBytes(r.memoryBytes)} for the sandbox, by ${cgroup}` : noCgroup,
    cpu: cgroup
      ? r.cpus > 0 ? `${r.cpus} CPU(s), by ${cgroup}` : "not limited: resources.cpus is 0"
      : noCgroup,
    pids: cgroup
      ? `${r.pids} processes for the sandbox, by ${cgroup}`
      : isRoot
      ? "not limited: RLIMIT_NPROC does not bind root"
      : `${r.pids} processes of your user, all of them counted (RLIMIT_NPROC)`,
  };
}

/** The environment's facts, with what the limits' mechanism holds and what it leaves open. */
async function localFacts(
  profile: Profile,
  limits: LocalLimits["kind"],
  probe: Map<string, string[][]>,
  { bwrap, landlock }: { bwrap: string | null; landlock: string },
): Promise<LocalFacts> {
  const exists = (path: string) => Deno.stat(path).then(() => true, () => false);
  const cgroupVersion = await exists("/sys/fs/cgroup/cgroup.controllers")
    ? 2
    : await exists("/sys/fs/cgroup/memory")
    ? 1
    : null;
  const max = await Deno.readTextFile("/proc/sys/user/max_user_namespaces").then(
    (text) => Number(text.trim()),
    () => null,
  );
  const [mode, filters] = [probe.get("Seccomp")?.[0]?.[0], probe.get("Seccomp_filters")?.[0]?.[0]];
  return {
    bwrap,
    maxUserNamespaces: max !== null && Number.isFinite(max) ? max : null,
    cgroupVersion,
    limits,
    ...limitsHeld(limits, profile.resources, Deno.uid() === 0),
    seccomp: mode === "2"
      ? `filter applied (${filters ?? "?"} filter(s))`
      : mode === "0"
      ? "not applied"
      : "unknown",
    landlock,
  };
}
