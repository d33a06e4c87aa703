/**
 * Trust in project configuration files, by content — the convention of direnv's `allow` and mise's
 * `trust`. A `sandbox.yaml` found in a project came with the code, so it may have been written by
 * anyone: it is obeyed only once the user has trusted that exact content at that path. The store is
 * one JSON file in the user's state directory, replaced atomically (write, fsync, rename) under a
 * lock, so concurrent `sandbox trust` calls neither corrupt it nor lose each other's entries.
 */
import { z } from "zod";
import { SandboxError } from "./errors.ts";
import { MAX_CONFIG_BYTES, readBounded } from "./input_file.ts";
import { absolutePath, joinPath, userStateDir } from "./paths.ts";

/** `$XDG_STATE_HOME/sandbox/trusted.json`, else `~/.local/state/sandbox/trusted.json`. */
export function trustStorePath(): string {
  return joinPath(userStateDir(), "trusted.json");
}

/** One trusted file: the content it had when the user trusted it. */
export interface TrustEntry {
  /** Real path (symlinks resolved) of the file. */
  file: string;
  /** Hex SHA-256 of its bytes. */
  sha256: string;
  /** ISO time of the `sandbox trust`. */
  trusted_at: string;
}

/** `trusted`: this content was trusted; `changed`: another content was; `untrusted`: never. */
export type TrustState = "trusted" | "untrusted" | "changed";

const StoreSchema = z.object({
  version: z.literal(1),
  trusted: z.array(z.object({ file: z.string(), sha256: z.string(), trusted_at: z.string() })),
});

/** Hex SHA-256 of bytes. */
export async function sha256OfBytes(bytes: Uint8Array): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The name a file is trusted under: its real path, or its absolute path when it does not exist. */
export async function trustKey(file: string): Promise<string> {
  try {
    return await Deno.realPath(file);
  } catch {
    return absolutePath(file);
  }
}

/** The store's entries; a missing store is empty, an unreadable or corrupt one an error. */
async function readStore(path: string): Promise<TrustEntry[]> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw new SandboxError(
      "config_invalid",
      `Cannot read the trust store "${path}": ${(error as Error).message}`,
    );
  }
  let parsed;
  try {
    parsed = StoreSchema.safeParse(JSON.parse(text));
  } catch {
    parsed = undefined;
  }
  if (!parsed?.success) {
    throw new SandboxError(
      "config_invalid",
      `Cannot read the trust store "${path}": it is not a trust store`,
      {
        detail:
          "Remove it (every project file is then untrusted) and trust your files again with: sandbox trust FILE",
      },
    );
  }
  return parsed.data.trusted;
}

/**
 * Is `bytes`, read from `file`, trusted? A store that cannot be read trusts nothing: the rule fails
 * closed, and `sandbox trust` reports the broken store.
 */
export async function trustStateOf(
  file: string,
  bytes: Uint8Array,
  storePath: string = trustStorePath(),
): Promise<TrustState> {
  let entries: TrustEntry[];
  try {
    entries = await readStore(storePath);
  } catch {
    return "untrusted";
  }
  const key = await trustKey(file);
  const entry = entries.find((e) => e.file === key);
  if (!entry) return "untrusted";
  return entry.sha256 === await sha256OfBytes(bytes) ? "trusted" : "changed";
}

/** Trust `bytes` as the content of `file` (replacing an earlier entry for the file). */
export async function trustContent(
  file: string,
  bytes: Uint8Array,
  storePath: string = trustStorePath(),
): Promise<TrustEntry> {
  const entry: TrustEntry = {
    file: await trustKey(file),
    sha256: await sha256OfBytes(bytes),
    trusted_at: new Date().toISOString(),
  };
  await updateStore(
    storePath,
    (entries) => [...entries.filter((e) => e.file !== entry.file), entry],
  );
  return entry;
}

/** Forget the trust in `file`; false when it was not trusted. */
export async function revokeTrust(
  file: string,
  storePath: string = trustStorePath(),
): Promise<boolean> {
  const key = await trustKey(file);
  let found = false;
  await updateStore(storePath, (entries) => {
    found = entries.some((e) => e.file === key);
    return entries.filter((e) => e.file !== key);
  });
  return found;
}

/** Every trusted file, with whether its content is still the trusted one. */
export async function listTrust(
  storePath: string = trustStorePath(),
): Promise<(TrustEntry & { state: "trusted" | "changed" | "missing" })[]> {
  const entries = await readStore(storePath);
  return await Promise.all(entries.map(async (entry) => {
    // Read with the configuration's bound: a file past it was never trusted as it is now.
    const read = await readBounded(entry.file, MAX_CONFIG_BYTES);
    if (read.kind === "unreadable") return { ...entry, state: "missing" as const };
    if (read.kind === "too_large") return { ...entry, state: "changed" as const };
    return {
      ...entry,
      state: await sha256OfBytes(read.bytes) === entry.sha256
        ? "trusted" as const
        : "changed" as const,
    };
  }));
}

/** Read, change and atomically replace the store, holding its lock throughout. */
async function updateStore(
  path: string,
  change: (entries: TrustEntry[]) => TrustEntry[],
): Promise<void> {
  const dir = path.replace(/\/[^/]*$/, "") || "/";
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  using lock = await Deno.open(`${path}.lock`, { create: true, write: true, mode: 0o600 });
  await lock.lock(true);
  try {
    const entries = change(await readStore(path));
    const text = JSON.stringify({ version: 1, trusted: entries }, null, 2) + "\n";
    const temporary = `${path}.${crypto.randomUUID()}.tmp`;
    try {
      using file = await Deno.open(temporary, {
        create: true,
        write: true,
        truncate: true,
        mode: 0o600,
      });
      const bytes = new TextEncoder().encode(text);
      for (let written = 0; written < bytes.length;) {
        written += await file.write(bytes.subarray(written));
      }
      await file.syncData();
      await Deno.rename(temporary, path);
    } catch (error) {
      // The error below says the store was not written; a temporary file left behind has a name of
      // its own that nothing reads.
      await Deno.remove(temporary).catch(() => {});
      throw new SandboxError(
        "config_invalid",
        `Cannot write the trust store "${path}": ${(error as Error).message}`,
      );
    }
  } finally {
    await lock.unlock();
  }
}
