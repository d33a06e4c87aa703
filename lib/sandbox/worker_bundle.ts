/**
 * The programs baked into the sandbox image, each as one JS file: the worker (the agent; also run
 * on the host in mode "none") and the relay (relay/main.ts, which carries the proxies' connections
 * over the exec stream; a bundle of its own so that it starts fast).
 *
 * The bundled CLI carries both bundles embedded (`scripts/bundle.sh` registers them before the
 * CLI starts), brotli-compressed and in base64 in comments at the end of its own file
 * (bundle_trailer.ts), with their SHA-256: a 3 MB string literal would cost every start of the CLI
 * tens of ms, and the bytes are needed only when an image is built, so they are read and
 * decompressed then and only then. Both are finished the same way whether built by bundle.sh
 * or here (lib/sandbox/bundle_text.ts). Run from a checkout, each is bundled from
 * source on first use and cached in the state directory under a hash of the sources, so an
 * unchanged checkout never bundles twice.
 */
import { userCacheDir, userStateDir } from "../paths.ts";
import { CommandExitError, SandboxError } from "../errors.ts";
import { cachedByIdentity, fileSha256, sha256Hex, sha256HexOf } from "../hash.ts";
import { run } from "../process.ts";
import { BundleShapeError, finishBundle } from "./bundle_text.ts";

type BundleName = "worker" | "relay";
const ENTRY: Record<BundleName, string> = { worker: "worker/main.ts", relay: "relay/main.ts" };

/**
 * An embedded bundle (dist/embedded.ts, written by scripts/embed_bundles.ts): a function that reads
 * its bytes, brotli-compressed in base64, from the end of the bundled CLI's file (called only to
 * build an image), and the SHA-256 of the bundle itself.
 */
export interface EmbeddedBundle {
  brotliBase64: () => string;
  sha256: string;
}

const embedded: Partial<Record<BundleName, EmbeddedBundle>> = {};

function embed(name: BundleName, bundle: EmbeddedBundle): void {
  if (!/^[0-9a-f]{64}$/.test(bundle.sha256)) {
    throw new TypeError(`Invalid SHA-256 for the embedded ${name} bundle`);
  }
  embedded[name] = bundle;
}

/** Called by the bundled CLI's entry, before anything else runs. */
export function setEmbeddedWorker(bundle: EmbeddedBundle): void {
  embed("worker", bundle);
}

/** Called by the bundled CLI's entry, before anything else runs. */
export function setEmbeddedRelay(bundle: EmbeddedBundle): void {
  embed("relay", bundle);
}

/** The bytes of an embedded bundle: decompressed only now, when an image is being built. */
async function embeddedBytes(bundle: EmbeddedBundle): Promise<Uint8Array> {
  const { brotliDecompressSync } = await import("node:zlib");
  let base64: string;
  try {
    base64 = bundle.brotliBase64();
  } catch (error) {
    throw new SandboxError(
      "image_build_failed",
      `Cannot read the bundle this CLI carries (${
        error instanceof Error ? error.message : String(error)
      }): this bundled CLI is damaged; build it again (deno task bundle) or run from a checkout`,
    );
  }
  const bytes = new Uint8Array(brotliDecompressSync(Uint8Array.fromBase64(base64)));
  // The bytes that go into the image must be the ones the tag's hash names.
  if (await sha256HexOf(bytes) !== bundle.sha256) {
    throw new SandboxError(
      "image_build_failed",
      "The embedded bundle does not match its SHA-256: this bundled CLI is damaged",
    );
  }
  return bytes;
}

const SOURCE_ROOT = new URL("../..", import.meta.url);

/**
 * Files whose content decides the bundles, when running from a checkout. Listed synchronously, as
 * their identities are read (lib/hash.ts `cachedByIdentity`): a few local directories.
 */
function sourceFiles(): string[] {
  const files = ["deno.json", "deno.lock"];
  const walk = (dir: string): void => {
    for (const entry of Deno.readDirSync(new URL(dir, SOURCE_ROOT))) {
      if (entry.isDirectory) walk(`${dir}/${entry.name}`);
      else if (entry.isFile && entry.name.endsWith(".ts")) files.push(`${dir}/${entry.name}`);
    }
  };
  for (const dir of ["worker", "relay", "lib"]) walk(dir);
  return files.sort();
}

let identity: Promise<string> | undefined;

/**
 * A cheap fingerprint of the bundles' sources (no bundling): names the cached bundle files. From a
 * checkout, the sources are read and hashed only when one of them changed (by its stat identity,
 * lib/hash.ts `cachedByIdentity`): reading them all cost every run ~20 ms before its container was
 * even looked at.
 */
export function workerIdentity(): Promise<string> {
  identity ??= (async () => {
    if (embedded.worker !== undefined) {
      return await sha256Hex(`${embedded.worker.sha256}\0${embedded.relay?.sha256 ?? ""}`);
    }
    const files = sourceFiles();
    const paths = files.map((file) => new URL(file, SOURCE_ROOT).pathname);
    return await cachedByIdentity(paths, `${userStateDir()}/cache`, async () => {
      const parts: string[] = [];
      for (const [i, file] of files.entries()) {
        parts.push(
          file,
          // A file gone since the listing hashes as empty: the identity still changes with it.
          await Deno.readTextFile(paths[i]).catch(() => ""),
        );
      }
      return await sha256Hex(parts.join("\0"));
    });
  })();
  return identity;
}

const contentHashes: Partial<Record<BundleName, Promise<string>>> = {};

function contentHash(
  name: BundleName,
  onProgress?: (line: string, phase?: "begin" | "end") => void,
): Promise<string> {
  const hash = contentHashes[name] ??= (async () => {
    const bundle = embedded[name];
    if (bundle !== undefined) return bundle.sha256;
    return await fileSha256(await bundlePath(name, onProgress), `${userStateDir()}/cache`);
  })();
  hash.catch(() => contentHashes[name] = undefined);
  return hash;
}

/**
 * SHA-256 of the worker bundle's bytes: what goes into the image, whether it was embedded in the
 * bundled CLI or bundled here from a checkout (both are `deno bundle worker/main.ts`, byte for
 * byte the same for the same sources), so both build the same image.
 */
export function workerContentHash(
  onProgress?: (line: string, phase?: "begin" | "end") => void,
): Promise<string> {
  return contentHash("worker", onProgress);
}

/** SHA-256 of the relay bundle's bytes, as `workerContentHash` for the worker. */
export function relayContentHash(
  onProgress?: (line: string, phase?: "begin" | "end") => void,
): Promise<string> {
  return contentHash("relay", onProgress);
}

/** Path of the worker bundle on the host, building it from source when needed. */
export function workerBundlePath(
  onProgress?: (line: string, phase?: "begin" | "end") => void,
): Promise<string> {
  return bundlePath("worker", onProgress);
}

/** Path of the relay bundle on the host, building it from source when needed. */
export function relayBundlePath(
  onProgress?: (line: string, phase?: "begin" | "end") => void,
): Promise<string> {
  return bundlePath("relay", onProgress);
}

async function bundlePath(
  name: BundleName,
  onProgress?: (line: string, phase?: "begin" | "end") => void,
): Promise<string> {
  const dir = `${userStateDir()}/worker`;
  await Deno.mkdir(dir, { recursive: true });
  const path = `${dir}/${name}-${(await workerIdentity()).slice(0, 16)}.js`;
  try {
    await Deno.stat(path);
    return path;
  } catch {
    // Not built yet.
  }
  // The partial file keeps the .js extension: deno bundle picks the module format from it.
  const partial = `${path}.${Deno.pid}.partial.js`;
  const bundle = embedded[name];
  if (bundle !== undefined) {
    await Deno.writeFile(partial, await embeddedBytes(bundle));
  } else if (embedded.worker !== undefined) {
    throw new SandboxError(
      "image_build_failed",
      `Cannot find the ${name} bundle: this bundled CLI was built without it`,
    );
  } else {
    const started = performance.now();
    onProgress?.(`Bundling the ${name} from source (once per change)`, "begin");
    // Run from the checkout so deno.json is found as it is for `deno bundle` by hand: with an
    // explicit --config the bundle's CommonJS shim loses Node's require.
    const result = await run(
      [Deno.execPath(), "bundle", "--quiet", "--platform", "deno", "-o", partial, ENTRY[name]],
      { cwd: new URL(".", SOURCE_ROOT).pathname },
    );
    if (result.exitCode !== 0) {
      throw new CommandExitError("image_build_failed", `Cannot bundle the ${name}`, result);
    }
    try {
      await Deno.writeTextFile(partial, finishBundle(await Deno.readTextFile(partial)));
    } catch (error) {
      if (!(error instanceof BundleShapeError)) throw error;
      throw new SandboxError(
        "image_build_failed",
        `Cannot finish the ${name} bundle: ${error.message}`,
      );
    }
    onProgress?.(
      `Bundled the ${name} in ${((performance.now() - started) / 1000).toFixed(1)}s`,
      "end",
    );
  }
  await Deno.rename(partial, path);
  return path;
}

/** The deno runtime baked into the image: this process's own binary. */
export function denoBinaryPath(): string {
  return Deno.execPath();
}

/** A bundle file in the state directory: `worker-HASH.js`, `relay-HASH.js`, or a partial of one. */
const BUNDLE_FILE = /^(?:worker|relay)-([0-9a-f]{16})\.js(?:\.(\d+)\.partial\.js)?$/;
/** Mode local's warmed Deno cache of a build (local/deno_cache.ts), or a partial one: a directory. */
const DENO_CACHE_DIR = /^([0-9a-f]{16})-[0-9A-Za-z.+-]+?(?:\.(\d+)\.partial)?$/;

/**
 * Remove the bundles of the state directory that this CLI would not use — those of other sources
 * (each change of a checkout makes a new one; each installed version has its own) — and the
 * partial files a killed bundling left (its process gone); the same for mode local's warmed Deno
 * caches (`<cache>/local-deno/`, named `local-deno/…`). One being written now stays. Another
 * version's CLI that needs its bundle again makes it again. Files the tool did not name stay.
 */
export async function pruneBundles(
  options: { dryRun?: boolean } = {},
): Promise<{ removed: { name: string; bytes: number }[] }> {
  const current = (await workerIdentity()).slice(0, 16);
  const removed: { name: string; bytes: number }[] = [];
  const places = [
    { dir: `${userStateDir()}/worker`, prefix: "", pattern: BUNDLE_FILE, directories: false },
    { dir: denoCachesDir(), prefix: "local-deno/", pattern: DENO_CACHE_DIR, directories: true },
  ];
  for (const { dir, prefix, pattern, directories } of places) {
    const entries = await Array.fromAsync(Deno.readDir(dir)).catch((error) => {
      if (error instanceof Deno.errors.NotFound) return [];
      throw error;
    });
    for (const entry of entries) {
      const found = (directories ? entry.isDirectory : entry.isFile) && pattern.exec(entry.name);
      if (!found) continue;
      const [, hash, pid] = found;
      const writing = pid !== undefined &&
        await Deno.stat(`/proc/${pid}`).then(() => true, () => false);
      if (writing || (pid === undefined && hash === current)) continue;
      const path = `${dir}/${entry.name}`;
      const bytes = await sizeOf(path);
      if (bytes === undefined) continue; // removed meanwhile (another prune)
      removed.push({ name: `${prefix}${entry.name}`, bytes });
      if (!options.dryRun) {
        await Deno.remove(path, { recursive: true }).catch((error) => {
          if (!(error instanceof Deno.errors.NotFound)) throw error;
        });
      }
    }
  }
  return { removed };
}

/** Where mode local keeps its warmed Deno caches (local/deno_cache.ts): `<cache>/local-deno`. */
export function denoCachesDir(): string {
  return `${userCacheDir()}/local-deno`;
}

/** Bytes of a file, or of the files of a directory (one level: a warmed cache's); undefined if gone. */
async function sizeOf(path: string): Promise<number | undefined> {
  const info = await Deno.lstat(path).catch(() => undefined);
  if (!info?.isDirectory) return info?.size;
  let bytes = 0;
  for await (const entry of Deno.readDir(path)) {
    bytes += (await Deno.lstat(`${path}/${entry.name}`).catch(() => undefined))?.size ?? 0;
  }
  return bytes;
}
