/**
 * Whether the process recording a run is still that run's: its pid alive with the start time
 * recorded (`pidStartTicks`). A record without that time (written before it was kept) is judged by
 * its start: a process that started after the run did is not the run's, whatever its pid.
 */
import { isSameProcessAlive, processStartTicks } from "../process.ts";

/** `/proc`'s clock ticks per second (`USER_HZ`, 100 on every Linux architecture). */
const TICKS_PER_SECOND = 100;
/** The boot time in `/proc/stat` is in whole seconds. */
const BOOT_TIME_SLACK_MS = 2_000;

export async function isRunProcessAlive(
  meta: { pid: number; pidStartTicks?: number; startedAt: string },
): Promise<boolean> {
  if (meta.pidStartTicks !== undefined) {
    return await isSameProcessAlive(meta.pid, meta.pidStartTicks);
  }
  const ticks = await processStartTicks(meta.pid);
  if (ticks === undefined) return false;
  const boot = await bootTimeMs();
  if (boot === undefined) return true;
  const started = boot + (ticks * 1000) / TICKS_PER_SECOND;
  return started <= Date.parse(meta.startedAt) + BOOT_TIME_SLACK_MS;
}

/** When this machine booted (ms since the epoch), from `/proc/stat`'s `btime`. */
async function bootTimeMs(): Promise<number | undefined> {
  try {
    const match = /^btime (\d+)$/m.exec(await Deno.readTextFile("/proc/stat"));
    return match ? Number(match[1]) * 1000 : undefined;
  } catch {
    // No /proc/stat (not Linux): the pid alone decides, as it must.
    return undefined;
  }
}
