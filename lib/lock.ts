/** Cross-process mutual exclusion on this host, with advisory file locks. */

/**
 * Where the locks live: one directory for the whole host, not per user or state directory, because
 * the Docker engine they guard is shared by every user and every `sandbox` process of the host.
 */
export function hostLockDir(): string {
  return `${Deno.env.get("SANDBOX_LOCK_DIR") ?? "/tmp/sandbox-locks"}`;
}

/**
 * Run `fn` while holding an exclusive lock on `<lock dir>/<name>.lock`. The lock is released when
 * `fn` settles, and by the OS if this process dies, so a crash never leaves it held.
 */
export async function withHostLock<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const dir = hostLockDir();
  try {
    await Deno.mkdir(dir, { recursive: true, mode: 0o1777 });
    await Deno.chmod(dir, 0o1777);
  } catch {
    // Made by another user: usable as it is (sticky and world-writable).
  }
  using file = await Deno.open(`${dir}/${name}.lock`, { create: true, write: true, mode: 0o666 });
  await file.lock(true);
  try {
    return await fn();
  } finally {
    await file.unlock();
  }
}
