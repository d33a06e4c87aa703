/** What the engine and the host give `sandbox doctor`'s sandbox, or lack: facts, not verdicts. */
import type { DockerCli } from "../sandbox/docker.ts";

export interface EnvironmentFacts {
  /** The engine's server version, or null when `docker info` did not say. */
  engineVersion: string | null;
  /** The engine runs rootless (its root is your user). */
  rootless: boolean;
  /** 1 or 2, or null when unknown. */
  cgroupVersion: number | null;
  /** The engine's storage driver and its backing filesystem. */
  storage: string | null;
  /**
   * `resources.disk` as a kernel quota on the workspace volume (true), or enforced by the
   * container's init reporting sizes (false); null before a sandbox was made to find out.
   */
  diskQuota: boolean | null;
  /** The engine remaps container uids (`userns-remap`). */
  usernsRemap: boolean;
  /** Unprivileged user namespaces on the host (what a process of yours could create). */
  hostUserNamespaces: boolean | null;
  /** The engine's seccomp profile, or null when seccomp is off. */
  seccomp: string | null;
  /** Other security options the engine reports (apparmor, selinux). */
  securityOptions: string[];
}

interface DockerInfo {
  ServerVersion?: string;
  CgroupVersion?: string;
  Driver?: string;
  DriverStatus?: [string, string][] | null;
  SecurityOptions?: string[] | null;
}

/** The facts `docker info` and the host's `/proc` give. */
export async function environmentFacts(
  docker: DockerCli,
  signal?: AbortSignal,
): Promise<EnvironmentFacts> {
  const result = await docker.run(["info", "--format", "{{json .}}"], {
    signal,
    timeoutMs: 30_000,
  });
  let info: DockerInfo = {};
  try {
    if (result.exitCode === 0) info = JSON.parse(result.stdout);
  } catch {
    // An engine whose info is not JSON: every fact from it stays unknown (null), as shown.
  }
  const options = (info.SecurityOptions ?? []).map(parseSecurityOption);
  const named = (name: string) => options.find((o) => o.name === name);
  const backing = info.DriverStatus?.find(([key]) => key === "Backing Filesystem")?.[1];
  return {
    engineVersion: info.ServerVersion ?? null,
    rootless: named("rootless") !== undefined,
    cgroupVersion: info.CgroupVersion ? Number(info.CgroupVersion) : null,
    storage: info.Driver ? `${info.Driver}${backing ? ` on ${backing}` : ""}` : null,
    diskQuota: null,
    usernsRemap: named("userns") !== undefined,
    hostUserNamespaces: await hostUserNamespaces(),
    seccomp: named("seccomp")?.fields.profile ?? null,
    securityOptions: options.map((o) => o.name).filter((n) =>
      !["seccomp", "rootless", "userns"]
        .includes(n)
    ),
  };
}

/** `name=seccomp,profile=default` → `{name: "seccomp", fields: {profile: "default"}}`. */
function parseSecurityOption(text: string): { name: string; fields: Record<string, string> } {
  const fields: Record<string, string> = {};
  for (const part of text.split(",")) {
    const at = part.indexOf("=");
    if (at > 0) fields[part.slice(0, at)] = part.slice(at + 1);
  }
  return { name: fields.name ?? text, fields };
}

async function hostUserNamespaces(): Promise<boolean | null> {
  const read = (path: string) => Deno.readTextFile(path).then((t) => t.trim(), () => undefined);
  const [clone, max] = await Promise.all([
    read("/proc/sys/kernel/unprivileged_userns_clone"),
    read("/proc/sys/user/max_user_namespaces"),
  ]);
  if (clone === "0" || max === "0") return false;
  if (max === undefined) return null;
  return true;
}
