/**
 * The host's book of warm-pool sandboxes: which containers are ready to be claimed, and which
 * process holds each one in use. Plain files in the state directory (only this user's):
 *
 * | file                                  | means                                              |
 * |---------------------------------------|----------------------------------------------------|
 * | `pool/ready/<container>.json`         | started ahead, never used: `{key, configHash}`     |
 * | `pool/claimed/<container>.<pid>-<t>`  | in use by process `pid` that started at tick `t`,  |
 * |                                       | or being started by it for a pool (`startingFor`)  |
 * | `pool/kept/<container>`               | a run's container kept with its work (until `down`)|
 *
 * A claim is a `rename` from `ready/` to `claimed/`: of two processes that race for one container,
 * exactly one rename succeeds, so a pooled container serves one run, once. The claimer's pid and
 * its start time (field 22 of `/proc/PID/stat`) are in the claimed name: a container whose holder
 * is gone (the CLI was killed) is found by the next command that reaps, and a reused pid cannot
 * pass for the holder, because its start time differs.
 */
import { userStateDir } from "../paths.ts";
import { processStartTicks } from "../process.ts";

export { processStartTicks };

export interface ReadyRecord {
  /** Container name. */
  name: string;
  /** What the container is for (profile, agent, repository): see `poolKey`. */
  key: string;
  /** The configuration it was made with (`DockerSandboxProvider.configHash`). */
  configHash: string;
  /** The id of the image it was made from (its tag may name another image since). */
  imageId: string;
}

export interface ClaimedRecord {
  name: string;
  pid: number;
  /** The holder's start time in clock ticks since boot, or 0 where /proc has none. */
  startTicks: number;
}

function poolDir(): string {
  return `${userStateDir()}/pool`;
}

/** The key of the pool a run of `profile` (with `agent`, on `repoKey`) claims from. */
export function poolKey(profile: string, agent?: string, repoKey?: string): string {
  return JSON.stringify([profile, agent ?? null, repoKey ?? null]);
}

/** This process, as a claimed record names its holder. */
async function self(): Promise<{ pid: number; startTicks: number }> {
  return { pid: Deno.pid, startTicks: await processStartTicks(Deno.pid) ?? 0 };
}

function claimedName(name: string, holder: { pid: number; startTicks: number }): string {
  return `${name}.${holder.pid}-${holder.startTicks}`;
}

function parseClaimed(file: string): ClaimedRecord | undefined {
  const match = /^(.+)\.(\d+)-(\d+)$/.exec(file);
  return match
    ? { name: match[1], pid: Number(match[2]), startTicks: Number(match[3]) }
    : undefined;
}

/** Write `record` as ready to be claimed. */
export async function addReady(record: ReadyRecord): Promise<void> {
  await Deno.mkdir(`${poolDir()}/ready`, { recursive: true, mode: 0o700 });
  const path = `${poolDir()}/ready/${record.name}.json`;
  await Deno.writeTextFile(`${path}.tmp`, JSON.stringify(record), { mode: 0o600 });
  await Deno.rename(`${path}.tmp`, path);
}

/** Ready records, oldest first (each as written; one that cannot be read is skipped). */
export async function listReady(): Promise<ReadyRecord[]> {
  const dir = `${poolDir()}/ready`;
  const found: { record: ReadyRecord; at: number }[] = [];
  try {
    for await (const entry of Deno.readDir(dir)) {
      if (!entry.isFile || !entry.name.endsWith(".json")) continue;
      try {
        const path = `${dir}/${entry.name}`;
        const [text, info] = await Promise.all([Deno.readTextFile(path), Deno.stat(path)]);
        found.push({ record: JSON.parse(text) as ReadyRecord, at: info.mtime?.getTime() ?? 0 });
      } catch {
        // Claimed by another process between the listing and the read: not ours to take.
      }
    }
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  return found.sort((a, b) => a.at - b.at).map((each) => each.record);
}

/**
 * Move `name` from ready to claimed by this process. True for exactly one of any number of
 * processes that try at once; false when another took it (or it was never ready).
 */
export async function claimReady(name: string): Promise<boolean> {
  await Deno.mkdir(`${poolDir()}/claimed`, { recursive: true, mode: 0o700 });
  try {
    await Deno.rename(
      `${poolDir()}/ready/${name}.json`,
      `${poolDir()}/claimed/${claimedName(name, await self())}`,
    );
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/**
 * Record that this process holds `name`, a container it makes: for itself (a cold run), or, with
 * `startingFor`, for the pool of that key (the record says so until the container is ready).
 */
export async function holdOwn(name: string, startingFor?: string): Promise<void> {
  await Deno.mkdir(`${poolDir()}/claimed`, { recursive: true, mode: 0o700 });
  const content = startingFor === undefined ? "" : `${STARTING}${startingFor}`;
  await Deno.writeTextFile(`${poolDir()}/claimed/${claimedName(name, await self())}`, content, {
    mode: 0o600,
  });
}

/** How a record made by `holdOwn(name, key)` begins (a run's claimed record is JSON, a cold one empty). */
const STARTING = "starting for ";

/** The containers live processes are starting for the pool of `key` (`holdOwn(name, key)`). */
export async function startingFor(key: string): Promise<ClaimedRecord[]> {
  const found: ClaimedRecord[] = [];
  for (const held of await listClaimed()) {
    const content = await Deno.readTextFile(`${poolDir()}/claimed/${claimedName(held.name, held)}`)
      .catch(() => ""); // released meanwhile: not starting any more
    if (content !== `${STARTING}${key}`) continue;
    if (await holderAlive(held)) found.push(held);
  }
  return found;
}

/** This process no longer holds `name` (it is ready for a run now, or removed). */
export async function releaseOwn(name: string): Promise<void> {
  await Deno.remove(`${poolDir()}/claimed/${claimedName(name, await self())}`);
}

/** `name`, held by this process, is kept after it (reaping passes it over; `down` removes it). */
export async function keepSandbox(name: string): Promise<void> {
  await Deno.mkdir(`${poolDir()}/kept`, { recursive: true, mode: 0o700 });
  await Deno.rename(
    `${poolDir()}/claimed/${claimedName(name, await self())}`,
    `${poolDir()}/kept/${name}`,
  );
}

/**
 * Take over `held`, a container whose holder is dead, as this process's own: one rename, so that
 * of processes reaping at once exactly one handles it. False when another took it first.
 */
export async function adoptOrphan(held: ClaimedRecord): Promise<boolean> {
  try {
    await Deno.rename(
      `${poolDir()}/claimed/${claimedName(held.name, held)}`,
      `${poolDir()}/claimed/${claimedName(held.name, await self())}`,
    );
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/** Forget `name` wherever it is recorded (it was removed). */
export async function forget(name: string): Promise<void> {
  const paths = [`${poolDir()}/ready/${name}.json`, `${poolDir()}/kept/${name}`];
  for (const held of await listClaimed()) {
    if (held.name === name) paths.push(`${poolDir()}/claimed/${claimedName(held.name, held)}`);
  }
  // Already gone is as good as removed.
  await Promise.allSettled(paths.map((path) => Deno.remove(path)));
}

/** Every claimed record. */
export async function listClaimed(): Promise<ClaimedRecord[]> {
  const records: ClaimedRecord[] = [];
  try {
    for await (const entry of Deno.readDir(`${poolDir()}/claimed`)) {
      const record = entry.isFile ? parseClaimed(entry.name) : undefined;
      if (record) records.push(record);
    }
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  return records;
}

/** Whether `held`'s holder still runs (a reused pid has another start time). */
async function holderAlive(held: ClaimedRecord): Promise<boolean> {
  return await processStartTicks(held.pid) === held.startTicks;
}

/** Claimed containers whose holder is no longer alive (a reused pid has another start time). */
export async function orphaned(): Promise<ClaimedRecord[]> {
  const all = await listClaimed();
  const alive = await Promise.all(all.map(holderAlive));
  return all.filter((_, i) => !alive[i]);
}
