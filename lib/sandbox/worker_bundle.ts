/**
 * The worker as one JS file, for baking into the sandbox image and for running on the host in
 * mode "none".
 *
 * The bundled CLI carries the worker bundle embedded (`scripts/bundle.sh` registers it before the
 * CLI starts). Run from a checkout, the worker is bundled from source on first use and cached in the
 * state directory under a hash of the sources, so an unchanged checkout never bundles twice.
 */
import { userStateDir } from "../config.ts";
import { CommandExitError } from "../errors.ts";
import { fileSha256, sha256Hex } from "../hash.ts";
import { run } from "../process.ts";

let embedded: string | undefined;
/** SHA-256 of the embedded bundle, computed when the CLI was bundled (hashing it costs ~30 ms). */
let embeddedSha256: string | undefined;

/** Called by the bundled CLI's entry, before anything else runs. */
export function setEmbeddedWorker(text: string, sha256?: string): void {
  embedded = text;
  embeddedSha256 = sha256 && /^[0-9a-f]{64}$/.test(sha256.trim()) ? sha256.trim() : undefined;
}

const SOURCE_ROOT = new URL("../..", import.meta.url);

/** Files whose content decides the worker bundle, when running from a checkout. */
async function sourceFiles(): Promise<string[]> {
  const files = ["deno.json", "deno.lock"];
  const walk = async (dir: string): Promise<void> => {
    for await (const entry of Deno.readDir(new URL(dir, SOURCE_ROOT))) {
      if (entry.isDirectory) await walk(`${dir}/${entry.name}`);
      else if (entry.isFile && entry.name.endsWith(".ts")) files.push(`${dir}/${entry.name}`);
    }
  };
  for (const dir of ["worker", "lib"]) await walk(dir);
  return files.sort();
}

let identity: Promise<string> | undefined;

/** A cheap fingerprint of the worker bundle (no bundling): part of the image's content hash. */
export function workerIdentity(): Promise<string> {
  identity ??= (async () => {
    if (embedded !== undefined) return await sha256Hex(embedded);
    const parts: string[] = [];
    for (const file of await sourceFiles()) {
      parts.push(file, await Deno.readTextFile(new URL(file, SOURCE_ROOT)).catch(() => ""));
    }
    return await sha256Hex(parts.join("\0"));
  })();
  return identity;
}

let contentHash: Promise<string> | undefined;

/**
 * SHA-256 of the worker bundle's bytes: what goes into the image, whether it was embedded in the
 * bundled CLI or bundled here from a checkout (both are `deno bundle worker/main.ts`, byte for
 * byte the same for the same sources), so both build the same image.
 */
export function workerContentHash(onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
  contentHash ??= (async () => {
    if (embedded !== undefined) return embeddedSha256 ?? await sha256Hex(embedded);
    return await fileSha256(await workerBundlePath(onProgress), `${userStateDir()}/cache`);
  })();
  contentHash.catch(() => contentHash = undefined);
  return contentHash;
}

/** Path of the worker bundle on the host, building it from source when needed. */
export async function workerBundlePath(onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
  const dir = `${userStateDir()}/worker`;
  await Deno.mkdir(dir, { recursive: true });
  const path = `${dir}/worker-${(await workerIdentity()).slice(0, 16)}.js`;
  try {
    await Deno.stat(path);
    return path;
  } catch {
    // Not built yet.
  }
  // The partial file keeps the .js extension: deno bundle picks the module format from it.
  const partial = `${path}.${Deno.pid}.partial.js`;
  if (embedded !== undefined) {
    await Deno.writeTextFile(partial, embedded);
  } else {
    const started = performance.now();
    onProgress?.("Bundling the worker from source (once per change)", "begin");
    // Run from the checkout so deno.json is found as it is for `deno bundle` by hand: with an
    // explicit --config the bundle's CommonJS shim loses Node's require.
    const result = await run(
      [Deno.execPath(), "bundle", "--quiet", "--platform", "deno", "-o", partial, "worker/main.ts"],
      { cwd: new URL(".", SOURCE_ROOT).pathname },
    );
    if (result.exitCode !== 0) {
      throw new CommandExitError("image_build_failed", "Cannot bundle the worker", result);
    }
    onProgress?.(`Bundled the worker in ${((performance.now() - started) / 1000).toFixed(1)}s`, "end");
  }
  await Deno.rename(partial, path);
  return path;
}

/** The deno runtime baked into the image: this process's own binary. */
export function denoBinaryPath(): string {
  return Deno.execPath();
}
