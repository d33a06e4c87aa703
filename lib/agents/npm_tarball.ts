/**
 * Pinned npm tarballs, fetched from the registry over HTTPS and kept in a cache on the host.
 *
 * The tarball is checked against the integrity hash pinned in `packages.ts` before anything uses
 * it, so a mirror, a proxy or a tampered cache can delay a build but never change what goes into
 * the image. The cache (`$XDG_CACHE_HOME/sandbox/npm`, else `~/.cache/sandbox/npm`) means a
 * rebuilt sandbox image does not download the agent again, and lets a machine without the
 * registry build the layer from a tarball copied there by hand.
 */
import { userCacheDir } from "../paths.ts";
import { CommandExitError, SandboxError } from "../errors.ts";
import { run } from "../process.ts";
import type { PlatformTarball } from "./packages.ts";

export const DEFAULT_NPM_REGISTRY = "https://registry.npmjs.org";
/** Time allowed until the registry's response headers; the body then streams without a limit. */
const REGISTRY_TIMEOUT_MS = 30_000;

/** The registry npm itself would use: `npm_config_registry` when set (a mirror), else npmjs. */
export function npmRegistry(
  env: (name: string) => string | undefined = (name) => Deno.env.get(name),
): string {
  const configured = env("npm_config_registry") || env("NPM_CONFIG_REGISTRY");
  return (configured || DEFAULT_NPM_REGISTRY).replace(/\/+$/, "");
}

/** Where fetched tarballs are kept. */
export function npmCacheDir(): string {
  return `${userCacheDir()}/npm`;
}

/**
 * The cache file name of a tarball: the name `npm pack <spec>` gives it (scope, then the
 * registry's file name), so that a tarball packed elsewhere can be dropped into the cache as is.
 */
export function cachedTarballName(tarball: PlatformTarball): string {
  const scope = tarball.path.match(/^@([^/]+)\//)?.[1];
  const file = tarball.path.slice(tarball.path.lastIndexOf("/") + 1);
  return scope ? `${scope}-${file}` : file;
}

/** The registry could not be reached, or did not serve the tarball. */
export class RegistryError extends SandboxError {
  override name = "RegistryError";
  constructor(readonly registry: string, message: string, options?: ErrorOptions) {
    super("image_build_failed", message, options);
  }
}

export interface FetchTarballOptions {
  registry?: string;
  cacheDir?: string;
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
}

/**
 * The path of `tarball` in the cache, fetched first when it is missing or does not match its
 * pinned integrity. Raises `RegistryError` when the registry cannot provide it, and a
 * `SandboxError("image_build_failed")` when what it provides does not match the pin.
 */
export async function fetchTarball(
  tarball: PlatformTarball,
  options: FetchTarballOptions = {},
): Promise<string> {
  const cacheDir = options.cacheDir ?? npmCacheDir();
  const path = `${cacheDir}/${cachedTarballName(tarball)}`;
  if (await integrityOf(path) === tarball.integrity) return path;

  const url = `${options.registry ?? npmRegistry()}/${tarball.path}`;
  const registry = displayRegistry(options.registry ?? npmRegistry());
  await Deno.mkdir(cacheDir, { recursive: true });
  options.onProgress?.(`Downloading ${tarball.spec} from ${registry}`);
  const body = await requestTarball(url, tarball.spec, registry, options.signal);
  // Written beside the final name and renamed only once its hash matches: a partial or tampered
  // download never sits in the cache under the name the next build trusts. (A partial file that
  // cannot be removed is harmless for the same reason: nothing reads a `.partial` name.)
  const partial = `${path}.${Deno.pid}.partial`;
  const hash = await sha512();
  let integrity: string;
  try {
    integrity = await writeHashed(body, partial, hash);
  } catch (error) {
    // The download failed: the error below says so; a partial file left behind is never read.
    await Deno.remove(partial).catch(() => {});
    if (options.signal?.aborted) {
      throw new SandboxError("interrupted", `Downloading ${tarball.spec} was interrupted`);
    }
    throw new RegistryError(
      registry,
      `Cannot download ${tarball.spec} from ${registry}: ${describeFetchError(error)}`,
      { cause: error },
    );
  }
  if (integrity !== tarball.integrity) {
    // Refused below; a partial file left behind is never read.
    await Deno.remove(partial).catch(() => {});
    throw new SandboxError(
      "image_build_failed",
      `The tarball of ${tarball.spec} from ${registry} does not match its pinned integrity`,
      {
        detail:
          `expected ${tarball.integrity}\nreceived ${integrity}\nA registry mirror or proxy changed it; nothing was installed`,
      },
    );
  }
  await Deno.rename(partial, path);
  return path;
}

/**
 * Unpack the installed files of `tarball` (its `root`) from the checked tarball at `path` into the
 * existing directory `dest`, owned by this user. GNU tar refuses absolute and `..` member names by
 * default; the tarball matched its pin anyway.
 */
export async function unpackTarball(
  tarball: PlatformTarball,
  path: string,
  dest: string,
  signal?: AbortSignal,
): Promise<void> {
  const root = tarball.root.split("/").filter(Boolean);
  const unpacked = await run([
    "tar",
    "-x",
    "-z",
    "-f",
    path,
    "-C",
    dest,
    "--no-same-owner",
    `--strip-components=${root.length}`,
    tarball.root,
  ], { signal });
  if (unpacked.aborted) {
    throw new SandboxError("interrupted", `Unpacking ${tarball.spec} was interrupted`);
  }
  if (unpacked.exitCode !== 0) {
    throw new CommandExitError("image_build_failed", `Cannot unpack ${tarball.spec}`, unpacked);
  }
}

/**
 * The body of a 200 answer for `url`; the timeout covers the wait for the response headers.
 * Raises `RegistryError` for no answer or another status, `interrupted` when `signal` aborts.
 */
async function requestTarball(
  url: string,
  spec: string,
  registry: string,
  signal: AbortSignal | undefined,
): Promise<ReadableStream<Uint8Array>> {
  const headers = AbortSignal.timeout(REGISTRY_TIMEOUT_MS);
  let response: Response;
  try {
    response = await fetch(url, { signal: signal ? AbortSignal.any([signal, headers]) : headers });
  } catch (error) {
    if (signal?.aborted) {
      throw new SandboxError("interrupted", `Downloading ${spec} was interrupted`);
    }
    const reason = headers.aborted
      ? `no answer within ${REGISTRY_TIMEOUT_MS / 1000} s`
      : describeFetchError(error);
    throw new RegistryError(registry, `Cannot download ${spec} from ${registry}: ${reason}`, {
      cause: error,
    });
  }
  if (response.status !== 200 || response.body === null) {
    await response.body?.cancel();
    throw new RegistryError(
      registry,
      `Cannot download ${spec} from ${registry}: HTTP ${response.status}`,
    );
  }
  return response.body;
}

/** Writes `body` to `path` (mode 0644) and returns its integrity, hashed with `hash` on the way. */
async function writeHashed(
  body: ReadableStream<Uint8Array>,
  path: string,
  hash: Awaited<ReturnType<typeof sha512>>,
): Promise<string> {
  const file = await Deno.open(path, { write: true, create: true, truncate: true, mode: 0o644 });
  try {
    for await (const chunk of body) {
      hash.update(chunk);
      let rest = chunk;
      while (rest.length > 0) rest = rest.subarray(await file.write(rest));
    }
  } finally {
    file.close();
  }
  return `sha512-${hash.digest("base64")}`;
}

/** The `sha512-…` integrity of a file, or undefined when it cannot be read. */
export async function integrityOf(path: string): Promise<string | undefined> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path, { read: true });
  } catch {
    return undefined;
  }
  const hash = await sha512();
  try {
    for await (const chunk of file.readable) hash.update(chunk);
  } catch {
    return undefined;
  }
  return `sha512-${hash.digest("base64")}`;
}

/** A registry URL for messages: a mirror's credentials (`https://user:token@…`) left out. */
export function displayRegistry(registry: string): string {
  try {
    const url = new URL(registry);
    url.username = "";
    url.password = "";
    return url.href.replace(/\/+$/, "");
  } catch {
    return "the configured registry";
  }
}

/** A fetch error's reason without its URL (a mirror URL may carry credentials). */
function describeFetchError(error: unknown): string {
  const text = error instanceof Error
    ? (error.cause instanceof Error ? error.cause.message : error.message)
    : String(error);
  return text
    .replace(/^error sending request for url \([^)]*\):\s*/i, "")
    .replace(/https?:\/\/[^\s)]+/g, "the registry")
    .split("\n")[0] || "the connection failed";
}

/**
 * An incremental SHA-512 (Web Crypto has none). Node's crypto module is loaded here, when a
 * tarball is checked, not with the CLI: the modules that import this one are on every run's path,
 * and loading it costs each start ~15 ms.
 */
async function sha512() {
  const { createHash } = await import("node:crypto");
  return createHash("sha512");
}
