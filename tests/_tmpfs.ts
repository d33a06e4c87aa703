/**
 * A small tmpfs for tests of a full disk (the tests run as root: `mount` needs it), unmounted on
 * dispose, and a way to fill it.
 */
import { run } from "../lib/process.ts";

/** A tmpfs of `sizeBytes` mounted on `path` (made if missing) until disposed. */
export async function mountTmpfs(
  path: string,
  sizeBytes: number,
): Promise<AsyncDisposable & { path: string }> {
  await Deno.mkdir(path, { recursive: true });
  const mounted = await run([
    "mount",
    "-t",
    "tmpfs",
    "-o",
    `size=${sizeBytes},mode=0755`,
    "tmpfs",
    path,
  ]);
  if (mounted.exitCode !== 0) {
    throw new Error(`Cannot mount a tmpfs on ${path} (the tests need root): ${mounted.stderr}`);
  }
  return {
    path,
    async [Symbol.asyncDispose]() {
      const unmounted = await run(["umount", path]);
      if (unmounted.exitCode !== 0) {
        throw new Error(`Cannot unmount the tmpfs on ${path}: ${unmounted.stderr}`);
      }
    },
  };
}

/**
 * Fill the filesystem of `dir` to its last byte with `dir/filler` (which the caller may remove to
 * free the space again). Resolves with the bytes written.
 */
export async function fillDisk(dir: string): Promise<number> {
  using file = await Deno.open(`${dir}/filler`, { write: true, create: true, append: true });
  const chunk = new Uint8Array(64 * 1024);
  let written = 0;
  let size = chunk.length;
  while (size > 0) {
    try {
      written += await file.write(chunk.subarray(0, size));
    } catch (error) {
      if ((error as { code?: string }).code !== "ENOSPC") throw error;
      size = size >> 1; // the last pages, smaller and smaller writes
    }
  }
  return written;
}
