/** Hex SHA-256 of a string. */
export async function sha256Hex(text: string): Promise<string> {
  return await sha256HexOf(new TextEncoder().encode(text));
}

/** Hex SHA-256 of bytes. */
export async function sha256HexOf(bytes: Uint8Array): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Hex SHA-256 of a file's bytes, remembered in `cacheDir` under the file's identity (path, device,
 * inode, size, modification time), so that a large file that has not changed (the deno binary,
 * 100 MB) is read once, not on every start. A cache that cannot be written only costs speed.
 */
export async function fileSha256(path: string, cacheDir?: string): Promise<string> {
  return await cachedByIdentity(
    [path],
    cacheDir,
    async () => await sha256HexOf(await Deno.readFile(path)),
  );
}

/**
 * `compute()` (a hex SHA-256 of what `paths` hold), remembered in `cacheDir` under the paths'
 * identities (path, device, inode, size, modification time): while none of the files changed,
 * it is stat'ed, not read. A cache that cannot be written only costs speed.
 */
export async function cachedByIdentity(
  paths: readonly string[],
  cacheDir: string | undefined,
  compute: () => Promise<string>,
): Promise<string> {
  if (!cacheDir) return await compute();
  let infos: Deno.FileInfo[];
  try {
    // Synchronous: a hundred stats of local files take well under a millisecond this way, and
    // ~10 ms as as many round trips through the runtime's thread pool, on every start.
    infos = paths.map((path) => Deno.statSync(path));
  } catch {
    // One is gone (or unreadable) meanwhile: no identity to remember it by.
    return await compute();
  }
  const identity = paths.map((path, i) =>
    [path, infos[i].dev, infos[i].ino, infos[i].size, infos[i].mtime?.getTime() ?? 0].join("\0")
  )
    .join("\0\0");
  const entry = `${cacheDir}/${(await sha256Hex(identity)).slice(0, 32)}.sha256`;
  // No readable entry is a cache miss: the hash is computed (and stored) below.
  const cached = (await Deno.readTextFile(entry).catch(() => "")).trim();
  if (/^[0-9a-f]{64}$/.test(cached)) return cached;
  const hash = await compute();
  try {
    await Deno.mkdir(cacheDir, { recursive: true });
    const partial = `${entry}.${Deno.pid}.tmp`;
    await Deno.writeTextFile(partial, hash + "\n");
    await Deno.rename(partial, entry);
  } catch {
    // Read-only state directory: hash again next time.
  }
  return hash;
}

/** `bytes` random bytes, in hex. */
export function randomHex(bytes: number): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(bytes)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
}
