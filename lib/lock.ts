/** Cross-process mutual exclusion on this host, with advisory file locks. */
import { userStateDir } from "./config.ts";

/**
 * Run `fn` while holding an exclusive lock on `<state dir>/locks/<name>.lock`. The lock is released
 * when `fn` settles, and by the OS if this process dies, so a crash never leaves it held.
 */
export async function withHostLock<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const dir = `${userStateDir()}/locks`;
  await Deno.mkdir(dir, { recursive: true });
  using file = await Deno.open(`${dir}/${name}.lock`, { create: true, write: true });
  await file.lock(true);
  try {
    return await fn();
  } finally {
    await file.unlock();
  }
}
