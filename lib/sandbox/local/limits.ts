/**
 * The resources of a local sandbox (`resources.memory`, `cpus`, `pids`): a cgroup of its own where
 * this process may make one — cgroup v2 (`/sys/fs/cgroup/sandbox-local/ID`, for root: a process
 * joins a v2 cgroup only if its user may write the cgroup.procs of the common ancestor of where it
 * is and where it goes, here the root's) or v1 (a group under each of the memory, cpu and pids
 * hierarchies) — into which every command of the sandbox moves itself before it starts, so that the
 * limits hold for the sandbox as a whole; otherwise rlimits per command (processes only, and no
 * core files), which leave memory and CPU unlimited. `LocalLimits.kind` says which held
 * (docs/local.md).
 */
import type { Profile } from "../../config.ts";
import { RLIMIT } from "./launcher.ts";

const CGROUP_ROOT = "/sys/fs/cgroup";
const PARENT = "sandbox-local";
const CPU_PERIOD_US = 100_000;

export interface LocalLimits {
  /** What enforces the limits: a cgroup (v2 or v1), or rlimits per command. */
  readonly kind: "cgroup2" | "cgroup1" | "rlimit";
  /**
   * The cgroup.procs files every command joins before it starts (launcher.ts): a file that cannot
   * be joined fails the command (125), since a limit that cannot be applied must not be skipped.
   */
  readonly cgroupJoins: readonly string[];
  /** rlimits every command sets where no cgroup holds the limits (processes only, no core files). */
  readonly rlimits: readonly (readonly [resource: number, value: number])[];
  /** Times the memory limit killed a process of the sandbox (0 without a memory cgroup). */
  oomKills(): Promise<number>;
  /** Memory and processes in use by the whole sandbox (0 without a cgroup). */
  usage(): Promise<{ memoryBytes: number; pids: number }>;
  /** Kill every process left in the cgroup, then remove it. */
  remove(): Promise<void>;
}

async function writable(dir: string): Promise<boolean> {
  try {
    await Deno.mkdir(dir, { recursive: true });
    return true;
  } catch {
    // Not ours to make (no delegation, not root): the next mechanism is tried.
    return false;
  }
}

async function write(path: string, value: string): Promise<void> {
  await Deno.writeTextFile(path, value);
}

/** The limits of sandbox `id`, by the first mechanism this machine lets this user use. */
export async function applyLimits(id: string, profile: Profile): Promise<LocalLimits> {
  const r = profile.resources;
  const v2 = `${CGROUP_ROOT}/${PARENT}/${id}`;
  if (await Deno.stat(`${CGROUP_ROOT}/cgroup.controllers`).then(() => true, () => false)) {
    if (await writable(v2)) {
      // Controllers must be enabled for the parent's children; one the kernel lacks fails loudly.
      await write(`${CGROUP_ROOT}/${PARENT}/cgroup.subtree_control`, "+memory +pids +cpu");
      await write(`${v2}/memory.max`, String(r.memoryBytes));
      await write(`${v2}/memory.swap.max`, "0").catch(() => {}); // no swap controller: none to cap
      await write(`${v2}/pids.max`, String(r.pids));
      if (r.cpus > 0) {
        await write(`${v2}/cpu.max`, `${Math.round(r.cpus * CPU_PERIOD_US)} ${CPU_PERIOD_US}`);
      }
      return cgroupLimits("cgroup2", [v2], {
        oom: `${v2}/memory.events`,
        memory: `${v2}/memory.current`,
        pids: `${v2}/pids.current`,
      });
    }
  }
  const v1 = {
    memory: `${CGROUP_ROOT}/memory/${PARENT}/${id}`,
    pids: `${CGROUP_ROOT}/pids/${PARENT}/${id}`,
    cpu: `${CGROUP_ROOT}/cpu/${PARENT}/${id}`,
  };
  if (
    await Deno.stat(`${CGROUP_ROOT}/memory/cgroup.procs`).then(() => true, () => false) &&
    await writable(v1.memory) && await writable(v1.pids) && await writable(v1.cpu)
  ) {
    await write(`${v1.memory}/memory.limit_in_bytes`, String(r.memoryBytes));
    await write(`${v1.pids}/pids.max`, String(r.pids));
    if (r.cpus > 0) {
      await write(`${v1.cpu}/cpu.cfs_period_us`, String(CPU_PERIOD_US));
      await write(`${v1.cpu}/cpu.cfs_quota_us`, String(Math.round(r.cpus * CPU_PERIOD_US)));
    }
    return cgroupLimits("cgroup1", [v1.memory, v1.pids, v1.cpu], {
      oom: `${v1.memory}/memory.oom_control`,
      memory: `${v1.memory}/memory.usage_in_bytes`,
      pids: `${v1.pids}/pids.current`,
    });
  }
  return rlimitLimits(r.pids);
}

function cgroupLimits(
  kind: "cgroup2" | "cgroup1",
  dirs: string[],
  files: { oom: string; memory: string; pids: string },
): LocalLimits {
  const number = async (path: string) =>
    Number((await Deno.readTextFile(path).catch(() => "0")).trim()) || 0;
  return {
    kind,
    cgroupJoins: dirs.map((dir) => `${dir}/cgroup.procs`),
    rlimits: [],
    async oomKills() {
      // A file that cannot be read (the group removed) reports no kill.
      const text = await Deno.readTextFile(files.oom).catch(() => "");
      return Number(/^oom_kill (\d+)$/m.exec(text)?.[1] ?? 0);
    },
    usage: async () => ({
      memoryBytes: await number(files.memory),
      pids: await number(files.pids),
    }),
    async remove() {
      for (const dir of dirs) await killAndRemove(dir);
    },
  };
}

/** Kill what is left in cgroup `dir` until it is empty, then remove it. */
async function killAndRemove(dir: string): Promise<void> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const procs = await Deno.readTextFile(`${dir}/cgroup.procs`).catch(() => undefined);
    if (procs === undefined) return; // gone already
    const pids = procs.split("\n").filter(Boolean).map(Number);
    for (const pid of pids) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch {
        // Exited between the read and the kill: nothing to end.
      }
    }
    if (pids.length === 0) {
      try {
        await Deno.remove(dir);
        return;
      } catch {
        // A process was just reaped or joined: read again.
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function rlimitLimits(pids: number): LocalLimits {
  return {
    kind: "rlimit",
    cgroupJoins: [],
    rlimits: [[RLIMIT.nproc, pids], [RLIMIT.core, 0]],
    oomKills: () => Promise.resolve(0),
    usage: () => Promise.resolve({ memoryBytes: 0, pids: 0 }),
    remove: () => Promise.resolve(),
  };
}
