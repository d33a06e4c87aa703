/**
 * The programs baked into the sandbox image, each as one JS file: the worker (the agent; also run
 * on the host in mode "none") and the relay (relay/main.ts, which carries the proxies' connections
 * over the exec stream; a bundle of its own so that it starts fast).
 *
 * The bundled CLI carries both bundles embedded (`scripts/bundle.sh` registers them before the
 * CLI starts). Run from a checkout, each is bundled from source on first use and cached in the
 * state directory under a hash of the sources, so an unchanged checkout never bundles twice.
 */
import { userStateDir } from "../config.ts";
import { CommandExitError, SandboxError } from "../errors.ts";
import { fileSha256, sha256Hex } from "../hash.ts";
import { run } from "../process.ts";

type BundleName = "worker" | "relay";
const ENTRY: Record<BundleName, string> = { worker: "worker/main.ts", relay: "relay/main.ts" };

const embedded: Partial<Record<BundleName, string>> = {};
/** SHA-256 of each embedded bundle, computed when the CLI was bundled (hashing costs ~30 ms). */
const embeddedSha256: Partial<Record<BundleName, string>> = {};

function embed(name: BundleName, text: string, sha256?: string): void {
  embedded[name] = text;
  embeddedSha256[name] = sha256 && /^[0-9a-f]{64}$/.test(sha256.trim()) ? sha256.trim() : undefined;
}

/** Called by the bundled CLI's entry, before anything else runs. */
export function setEmbeddedWorker(text: string, sha256?: string): void {
  embed("worker", text, sha256);
}

/** Called by the bundled CLI's entry, before anything else runs. */
export function setEmbeddedRelay(text: string, sha256?: string): void {
  embed("relay", text, sha256);
}

const SOURCE_ROOT = new URL("../..", import.meta.url);

/** Files whose content decides the bundles, when running from a checkout. */
async function sourceFiles(): Promise<string[]> {
  const files = ["deno.json", "deno.lock"];
  const walk = async (dir: string): Promise<void> => {
    for await (const entry of Deno.readDir(new URL(dir, SOURCE_ROOT))) {
      if (entry.isDirectory) await walk(`${dir}/${entry.name}`);
      else if (entry.isFile && entry.name.endsWith(".ts")) files.push(`${dir}/${entry.name}`);
    }
  };
  for (const dir of ["worker", "relay", "lib"]) await walk(dir);
  return files.sort();
}

let identity: Promise<string> | undefined;

/** A cheap fingerprint of the bundles' sources (no bundling): names the cached bundle files. */
export function workerIdentity(): Promise<string> {
  identity ??= (async () => {
    if (embedded.worker !== undefined) return await sha256Hex(`${embedded.worker}\0${embedded.relay ?? ""}`);
    const parts: string[] = [];
    for (const file of await sourceFiles()) {
      parts.push(file, await Deno.readTextFile(new URL(file, SOURCE_ROOT)).catch(() => ""));
    }
    return await sha256Hex(parts.join("\0"));
  })();
  return identity;
}

const contentHashes: Partial<Record<BundleName, Promise<string>>> = {};

function contentHash(name: BundleName, onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
  const hash = contentHashes[name] ??= (async () => {
    const text = embedded[name];
    if (text !== undefined) return embeddedSha256[name] ?? await sha256Hex(text);
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
export function workerContentHash(onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
  return contentHash("worker", onProgress);
}

/** SHA-256 of the relay bundle's bytes, as `workerContentHash` for the worker. */
export function relayContentHash(onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
  return contentHash("relay", onProgress);
}

/** Path of the worker bundle on the host, building it from source when needed. */
export function workerBundlePath(onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
  return bundlePath("worker", onProgress);
}

/** Path of the relay bundle on the host, building it from source when needed. */
export function relayBundlePath(onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
  return bundlePath("relay", onProgress);
}

async function bundlePath(name: BundleName, onProgress?: (line: string, phase?: "begin" | "end") => void): Promise<string> {
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
  const text = embedded[name];
  if (text !== undefined) {
    await Deno.writeTextFile(partial, text);
  } else if (embedded.worker !== undefined) {
    throw new SandboxError("image_build_failed", `Cannot find the ${name} bundle: this bundled CLI was built without it`);
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
    onProgress?.(`Bundled the ${name} in ${((performance.now() - started) / 1000).toFixed(1)}s`, "end");
  }
  await Deno.rename(partial, path);
  return path;
}

/** The deno runtime baked into the image: this process's own binary. */
export function denoBinaryPath(): string {
  return Deno.execPath();
}
