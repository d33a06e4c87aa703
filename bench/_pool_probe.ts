/**
 * What the bench sees of the warm pool from the host, without touching a pooled container (no
 * `docker exec` into it: a pooled container must have run nothing but our own code until a run
 * claims it, lib/sandbox/pool.ts): the ready records in the state directory, whether a pooled
 * container's worker waits for its job yet (its inotify watch, read from /proc on this host),
 * whether a run's container is gone, and a container's memory.
 */
import { run } from "../lib/process.ts";
import { poolKey } from "../lib/sandbox/pool_records.ts";
import { proxyMountSource } from "../lib/sandbox/proxy_mount.ts";

const DOCKER_TIMEOUT_MS = 60_000;
/** How often a wait polls the engine and /proc. */
const POLL_MS = 25;
/** A pooled container's name ends in `-p` and 8 hex digits (lib/sandbox/pool.ts); a cold one in the run id. */
export const POOLED_NAME = /-p[0-9a-f]{8}$/;
/** Label of the containers the bench starts itself (removed by name when done). */
export const BENCH_LABEL = "dev.sandbox.bench=1";

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** `docker ARGS`'s stdout, trimmed; raises on a non-zero exit. */
export async function docker(args: readonly string[]): Promise<string> {
  const result = await run(["docker", ...args], { timeoutMs: DOCKER_TIMEOUT_MS });
  if (result.exitCode !== 0) {
    throw new Error(`docker ${args.join(" ")}: ${result.stderr.slice(-1_000)}`);
  }
  return result.stdout.trim();
}

/** The image `container` was made from. */
export async function imageOf(container: string): Promise<string> {
  return await docker(["container", "inspect", "--format", "{{.Config.Image}}", container]);
}

/** Names of the pool's ready containers for runs of `profile` (with `agent`), in `state`. */
export async function readyPooled(
  state: string,
  profile: string,
  agent?: string,
): Promise<string[]> {
  const key = poolKey(profile, agent);
  const names: string[] = [];
  try {
    for await (const entry of Deno.readDir(`${state}/sandbox/pool/ready`)) {
      if (!entry.isFile || !entry.name.endsWith(".json")) continue;
      // Unreadable: claimed by a run between the listing and the read, so no longer ready.
      const text = await Deno.readTextFile(`${state}/sandbox/pool/ready/${entry.name}`).catch(() =>
        ""
      );
      if (text && (JSON.parse(text) as { key: string }).key === key) {
        names.push(entry.name.slice(0, -".json".length));
      }
    }
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  return names;
}

/**
 * Whether the worker in pooled `container` waits for its job: it watches its directory (inotify)
 * only once its code is loaded (worker/serve.ts). Its process is found by `docker top` and its
 * descriptors read in /proc. Undefined where this host cannot read them (an engine in a VM).
 */
export async function workerListening(container: string): Promise<boolean | undefined> {
  // A container that cannot be listed is gone (claimed and removed): its worker waits nowhere.
  const top = await docker(["top", container, "-eo", "pid,args"]).catch(() => "");
  const pids = top.split("\n").filter((line) => line.includes("worker.js serve --await-job"))
    .map((line) => Number(line.trim().split(/\s+/)[0]));
  if (pids.length === 0) return false;
  for (const pid of pids) {
    let fds: string[];
    try {
      fds = (await Array.fromAsync(Deno.readDir(`/proc/${pid}/fd`))).map((entry) => entry.name);
    } catch {
      // Not this host's process (an engine in a VM) or not ours to read: unknown, not "no".
      return undefined;
    }
    for (const fd of fds) {
      const target = await Deno.readLink(`/proc/${pid}/fd/${fd}`).catch(() => "");
      if (target === "anon_inode:inotify") return true;
    }
  }
  return false;
}

/** Whether no container named `name` exists any more (a run's is removed behind it, detached). */
export async function containerGone(name: string): Promise<boolean> {
  const result = await run(["docker", "container", "inspect", "--format", "{{.Id}}", name], {
    timeoutMs: DOCKER_TIMEOUT_MS,
  });
  return result.exitCode !== 0;
}

/** The container a finished run worked in (`meta.extra.container` of its run log). */
export async function runContainer(state: string, runId: string): Promise<string> {
  const meta = JSON.parse(await Deno.readTextFile(`${state}/sandbox/runs/${runId}/meta.json`)) as {
    extra?: { container?: string };
  };
  if (!meta.extra?.container) throw new Error(`run ${runId} recorded no container`);
  return meta.extra.container;
}

/** What is left to settle after a run: its container's removal, and the refilled pool's worker. */
export interface Settling {
  /** Milliseconds after the run's exit until its container was gone and the pool's workers listened. */
  ms: number;
  /** False when this host cannot see whether a pooled worker listens (only the removal is awaited). */
  workersSeen: boolean;
}

/** Whether the runs' containers are gone and each of the pool's ready workers listens (at least `ready`). */
async function settled(
  state: string,
  profile: string,
  previous: readonly string[],
  ready: number,
): Promise<boolean | undefined> {
  for (const name of previous) if (!await containerGone(name)) return false;
  const names = await readyPooled(state, profile);
  if (names.length < ready) return false;
  const listening = await Promise.all(names.map(workerListening));
  if (listening.includes(undefined)) return undefined;
  return listening.every(Boolean);
}

/**
 * Wait until what runs behind finished runs is done: their containers (`previous`) removed and the
 * pool of `profile` holding `ready` containers whose workers listen. Measured from the call.
 */
export async function waitSettled(
  state: string,
  profile: string,
  options: {
    previous?: readonly string[];
    ready?: number;
    timeoutMs?: number;
    signal?: AbortSignal;
  } = {},
): Promise<Settling> {
  const started = performance.now();
  const deadline = started + (options.timeoutMs ?? 120_000);
  while (performance.now() < deadline) {
    options.signal?.throwIfAborted();
    const done = await settled(state, profile, options.previous ?? [], options.ready ?? 1);
    if (done !== false) return { ms: performance.now() - started, workersSeen: done === true };
    await sleep(POLL_MS);
  }
  throw new Error(
    `the pool of ${profile} did not settle within ${options.timeoutMs ?? 120_000} ms`,
  );
}

/** Whether the pool of `profile` is settled right now (see `waitSettled`), false if unknown. */
export async function isSettled(
  state: string,
  profile: string,
  previous: string,
): Promise<boolean> {
  return await settled(state, profile, [previous], 1) === true;
}

const MEMORY_UNITS: Record<string, number> = {
  B: 1,
  KB: 1e3,
  MB: 1e6,
  GB: 1e9,
  KIB: 1024,
  MIB: 1024 ** 2,
  GIB: 1024 ** 3,
};

/** `docker stats`' "12.3MiB / 23.5GiB": the part before the slash, in MiB. */
export function parseMemUsage(text: string): number {
  const match = /^\s*([\d.]+)\s*([KMG]?i?B)\s*\//i.exec(text);
  const factor = match ? MEMORY_UNITS[match[2].toUpperCase()] : undefined;
  if (!match || factor === undefined) {
    throw new Error(`cannot read docker stats' memory usage "${text}"`);
  }
  return Number(match[1]) * factor / 1024 ** 2;
}

/** Memory in use by `container` (cgroup usage less inactive file cache, as docker stats shows), MiB. */
export async function memoryMiB(container: string): Promise<number> {
  return parseMemUsage(
    await docker(["stats", "--no-stream", "--format", "{{.MemUsage}}", container]),
  );
}

/** This machine's memory (MemTotal of /proc/meminfo), MiB. */
export async function machineMemoryMiB(): Promise<number> {
  const match = /^MemTotal:\s+(\d+) kB/m.exec(await Deno.readTextFile("/proc/meminfo"));
  if (!match) throw new Error("no MemTotal in /proc/meminfo");
  return Number(match[1]) / 1024;
}

/** A container of the bench's own from `image`, running `argv` (default: the image's command). */
export async function startBenchContainer(
  image: string,
  purpose: string,
  argv: string[] = [],
): Promise<string> {
  const name = `sandbox-bench-${purpose}-${crypto.randomUUID().slice(0, 8)}`;
  await docker(["run", "-d", "--name", name, "--label", BENCH_LABEL, image, ...argv]);
  return name;
}

/** Remove containers the bench started itself (by name). */
export async function removeBenchContainers(names: readonly string[]): Promise<void> {
  if (names.length > 0) {
    await run(["docker", "rm", "--force", ...names], { timeoutMs: DOCKER_TIMEOUT_MS });
  }
}

/**
 * Remove the directories the CLI made for the containers' proxy sockets under a state directory
 * of the bench's (lib/sandbox/proxy_mount.ts: one parent per user and state directory, so this one
 * holds only the bench's). A container removed by label leaves its directory behind.
 */
export async function removeProxyMounts(state: string): Promise<void> {
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state);
  try {
    const source = await proxyMountSource("bench");
    await Deno.remove(source.slice(0, source.lastIndexOf("/")), { recursive: true });
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  } finally {
    if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", previous);
  }
}
