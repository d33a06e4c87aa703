/**
 * Deno's caches for the worker of mode local, warm — what the image build does for a
 * container (Dockerfile): without them every run's worker compiled its 7 MB bundle again (~0.5 s
 * of CPU before its first event).
 *
 * Once per worker build and Deno version, a sandbox of its own runs only our code (the worker's
 * `--help`) with `DENO_DIR=/tmp/deno-dir`, at the paths a run's sandbox
 * uses (the code cache is keyed by them). Its cache databases are compacted and kept, read-only,
 * in `<cache>/local-deno/ID-VERSION/` (`~/.cache/sandbox`: made again when missing). Each run's
 * sandbox gets a copy in its own fresh `/tmp` before its first command (local_sandbox.ts
 * `createLocalSandbox`): Deno writes its cache where it runs, and nothing a run writes may reach
 * the next one — never a link, never a bind. `sandbox prune --images` removes the caches of other
 * builds (worker_bundle.ts `pruneBundles`).
 */
import type { Profile } from "../../config.ts";
import { SandboxError } from "../../errors.ts";
import { pathExists } from "../../paths.ts";
import { denoCachesDir, workerIdentity } from "../worker_bundle.ts";
import type { HostPrograms } from "./bwrap.ts";
import { createLocalSandbox } from "./local_sandbox.ts";

/** Where a sandbox's Deno keeps its cache (its own /tmp): `DENO_DIR` of every run's command. */
export const SANDBOX_DENO_DIR = "/tmp/deno-dir";
/** The cache databases Deno writes for a bundle run with `--no-config`. */
const DATABASES = ["v8_code_cache_v2", "dep_analysis_cache_v2", "node_analysis_cache_v2"];

/** The warmed cache for this CLI's bundles and Deno: `<cache>/local-deno/ID-VERSION`. */
export async function denoCacheDir(): Promise<string> {
  const id = (await workerIdentity()).slice(0, 16);
  return `${denoCachesDir()}/${id}-${Deno.version.deno}`;
}

let warming: Promise<string | undefined> | undefined;

/**
 * The warmed cache's directory, made first if missing (a second, with a progress line); undefined
 * when it cannot be made (the run then starts cold, and says so). `programs` must be the deno and
 * the worker bundle this CLI binds into a run's sandbox.
 */
export function warmDenoCache(
  profile: Profile,
  programs: Required<Pick<HostPrograms, "deno" | "worker">>,
  onProgress?: (line: string) => void,
): Promise<string | undefined> {
  warming ??= (async () => {
    const dir = await denoCacheDir();
    if (await pathExists(`${dir}/${DATABASES[0]}`)) return dir;
    onProgress?.("Warming Deno's cache for mode local (once per worker build)");
    try {
      await makeCache(profile, programs, dir);
      return dir;
    } catch (error) {
      onProgress?.(
        `Deno's cache for mode local could not be warmed, so this run starts cold: ${
          error instanceof Error ? error.message : String(error)
        }`,
      );
      return undefined;
    }
  })();
  // Asked again by the next run of this process: the cache directory may have been emptied.
  warming.finally(() => warming = undefined).catch(() => {});
  return warming;
}

/** Warm the cache in a sandbox of its own, then move its compacted databases to `dir`. */
async function makeCache(
  profile: Profile,
  programs: Required<Pick<HostPrograms, "deno" | "worker">>,
  dir: string,
): Promise<void> {
  const sandbox = await createLocalSandbox(
    profile,
    `local-warm-${crypto.randomUUID().slice(0, 8)}`,
    {
      programs,
    },
  );
  const partial = `${dir}.${Deno.pid}.partial`;
  try {
    // Loaded only to warm (once per build): `sandbox exec` loads this module, and not the driver's.
    const { WORKER_COMMAND } = await import("../../run/container_driver.ts");
    const env = { DENO_DIR: SANDBOX_DENO_DIR };
    const argv = [...WORKER_COMMAND, "--help"];
    const result = await sandbox.exec(argv, { env, timeoutMs: 120_000 });
    if (result.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `${argv.join(" ")} exited ${result.exitCode}: ${result.stderr.trim().slice(-300)}`,
      );
    }
    // Only our code ran in that sandbox: its files are read from the host directly.
    const warmed = `${sandbox.dirs.tmp}${SANDBOX_DENO_DIR.slice("/tmp".length)}`;
    await compact(warmed);
    await Deno.mkdir(partial, { recursive: true, mode: 0o755 });
    for (const name of DATABASES) {
      await Deno.copyFile(`${warmed}/${name}`, `${partial}/${name}`);
      await Deno.chmod(`${partial}/${name}`, 0o444);
    }
    await Deno.rename(partial, dir).catch(async (error) => {
      // Another process put the same cache there first: theirs is used.
      if (!await pathExists(`${dir}/${DATABASES[0]}`)) throw error;
    });
  } finally {
    await Deno.remove(partial, { recursive: true }).catch(() => {});
    await sandbox.destroy();
  }
}

/** Fold each database's write-ahead log into it and shrink it: 6.5 MB → 2.5 MB to copy per run. */
async function compact(denoDir: string): Promise<void> {
  const { DatabaseSync } = await import("node:sqlite");
  for (const name of DATABASES) {
    const db = new DatabaseSync(`${denoDir}/${name}`);
    try {
      db.exec("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE; VACUUM;");
    } finally {
      db.close();
    }
  }
}

/**
 * Copy the warmed cache `from` into `to` (a sandbox's fresh /tmp, before its first command): each
 * file new and this user's, writable by the sandbox, shared with nothing.
 */
export async function seedDenoCache(from: string, to: string): Promise<void> {
  await Deno.mkdir(to, { mode: 0o700 });
  for (const name of DATABASES) {
    await Deno.copyFile(`${from}/${name}`, `${to}/${name}`);
    await Deno.chmod(`${to}/${name}`, 0o600);
  }
}
