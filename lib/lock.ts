/** Cross-process mutual exclusion on this host, with advisory file locks. */

/**
 * Where the locks live: one directory for the whole host, not per user or state directory, because
 * the Docker engine they guard is shared by every user and every `sandbox` process of the host.
 */
export function hostLockDir(): string {
  return `${Deno.env.get("SANDBOX_LOCK_DIR") ?? "/tmp/sandbox-locks"}`;
}

/** `<lock dir>/<name>.lock`, opened (made when missing). */
async function openLockFile(name: string): Promise<Deno.FsFile> {
  const dir = hostLockDir();
  try {
    await Deno.mkdir(dir, { recursive: true, mode: 0o1777 });
    await Deno.chmod(dir, 0o1777);
  } catch {
    // Made by another user: usable as it is (sticky and world-writable).
  }
  return await Deno.open(`${dir}/${name}.lock`, { create: true, write: true, mode: 0o666 });
}

/**
 * Run `fn` while holding an exclusive lock on `<lock dir>/<name>.lock`. The lock is released when
 * `fn` settles, and by the OS if this process dies, so a crash never leaves it held.
 */
export async function withHostLock<T>(name: string, fn: () => Promise<T>): Promise<T> {
  using file = await openLockFile(name);
  await file.lock(true);
  try {
    return await fn();
  } finally {
    await file.unlock();
  }
}

/** A lock held until `release` (or this process's end: the OS releases it). */
export interface HeldLock {
  release(): void;
}

/**
 * Take the exclusive lock on `<lock dir>/<name>.lock` if no one holds it, without waiting:
 * undefined when another process (or another holder in this one) has it.
 */
export async function tryHostLock(name: string): Promise<HeldLock | undefined> {
  const file = await openLockFile(name);
  if (!await file.tryLock(true)) {
    file.close();
    return undefined;
  }
  let held = true;
  return {
    release() {
      if (!held) return;
      held = false;
      // Closing the file releases the lock.
      file.close();
    },
  };
}
