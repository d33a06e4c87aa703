/** Cross-process mutual exclusion on this host, with advisory file locks. */

/**
 * Where the locks live: one directory for the whole host, not per user or state directory, because
 * the Docker engine they guard is shared by every user and every `sandbox` process of the host.
 */
export function hostLockDir(): string {
  return `${Deno.env.get("SANDBOX_LOCK_DIR") ?? "/tmp/sandbox-locks"}`;
}

/** `<lock dir>/<name>.lock`. */
function lockPath(name: string): string {
  return `${hostLockDir()}/${name}.lock`;
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
  return await Deno.open(lockPath(name), { create: true, write: true, mode: 0o666 });
}

/**
 * The lock file, locked: waiting for it (`wait`), or undefined when someone holds it.
 *
 * A holder removes the file as it lets go (`unlockAndRemove`), so that locks named after
 * containers and images do not pile up in the directory. Whoever opened the file before that
 * removal and then got its lock holds a file no longer in the directory, which guards nothing: a
 * newcomer makes a new one. So a lock counts only when the file locked is still the one at the
 * path (same device and inode); otherwise it is let go and the path opened again.
 */
async function lockFile(name: string, wait: boolean): Promise<Deno.FsFile | undefined> {
  for (;;) {
    const file = await openLockFile(name);
    try {
      if (wait) await file.lock(true);
      else if (!await file.tryLock(true)) {
        file.close();
        return undefined;
      }
      if (await isAtPath(file, lockPath(name))) return file;
    } catch (error) {
      file.close();
      throw error;
    }
    file.close();
  }
}

async function isAtPath(file: Deno.FsFile, path: string): Promise<boolean> {
  // No file at the path (removed by its holder): the file held is not the lock any more.
  const [held, current] = await Promise.all([file.stat(), Deno.stat(path).catch(() => undefined)]);
  return current !== undefined && held.dev === current.dev && held.ino === current.ino;
}

/**
 * Remove the lock file, then let go of it (closing it releases the lock). Removed while still
 * held, so that it is the file this holder locked, and a waiter that gets it next sees it gone.
 */
function unlockAndRemove(file: Deno.FsFile, name: string): void {
  try {
    Deno.removeSync(lockPath(name));
  } catch {
    // Another user's file in the shared sticky directory (only its owner may remove it), or a
    // directory made read-only: the file stays, and stays a working lock; nothing is lost.
  }
  file.close();
}

/**
 * Run `fn` while holding an exclusive lock on `<lock dir>/<name>.lock`. The lock is released (and
 * its file removed) when `fn` settles, and by the OS if this process dies, so a crash never leaves
 * it held; a crash leaves only the file, which the next holder removes.
 */
export async function withHostLock<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const file = (await lockFile(name, true))!;
  try {
    return await fn();
  } finally {
    unlockAndRemove(file, name);
  }
}

/**
 * Remove the lock files no one holds (left by holders killed before they could remove them): the
 * names unique to one state directory or container (`pool-…`, `container-…`) are never taken
 * again, so no next holder would remove them. Each file is taken without waiting and removed by
 * `tryHostLock`'s release, as any holder's: a file whose lock is held stays, and a process that
 * opened the file just before its removal finds, once it has the lock, that the file is no longer
 * at the path, and takes the new one (`lockFile`). So removal never lets two holders in at once.
 */
export async function removeFreeLocks(): Promise<void> {
  let names: string[];
  try {
    names = (await Array.fromAsync(Deno.readDir(hostLockDir())))
      .filter((entry) => entry.isFile && entry.name.endsWith(".lock"))
      .map((entry) => entry.name.slice(0, -".lock".length));
  } catch {
    return; // No lock directory (no lock taken on this host yet), or none this user may list.
  }
  for (const name of names) {
    try {
      (await tryHostLock(name))?.release();
    } catch {
      // Another user's file this user may not open: its owner's processes remove it.
    }
  }
}

/** A lock held until `release` (or this process's end: the OS releases it). */
export interface HeldLock {
  release(): void;
}

/**
 * Take the exclusive lock on `<lock dir>/<name>.lock` if no one holds it, without waiting:
 * undefined when another process (or another holder in this one) has it. `release` removes the
 * file as it lets go.
 */
export async function tryHostLock(name: string): Promise<HeldLock | undefined> {
  const file = await lockFile(name, false);
  if (!file) return undefined;
  let held = true;
  return {
    release() {
      if (!held) return;
      held = false;
      unlockAndRemove(file, name);
    },
  };
}
