/**
 * An agent CLI's files on the host, for sandbox mode local: the same pinned platform tarball as
 * the image layer (agent_image.ts), checked against its integrity (npm_tarball.ts) and unpacked
 * once into a directory named by what it holds,
 * `$XDG_CACHE_HOME/sandbox/agents/<agent>-<version>-<arch>-<hash>` (else `~/.cache/…`), which
 * every local sandbox of a run with that agent binds read-only at `agentDir(agent)`.
 *
 * The directory appears whole or not at all: the files are unpacked into a temporary directory
 * beside it, checked, made read-only and renamed into place. A run that finds the directory uses
 * it without reading the tarball again; a run that loses the race to rename uses the winner's.
 */
import { userCacheDir } from "../paths.ts";
import { SandboxError } from "../errors.ts";
import { sha256Hex } from "../hash.ts";
import { run } from "../process.ts";
import {
  cachedTarballName,
  fetchTarball,
  npmCacheDir,
  RegistryError,
  unpackTarball,
} from "./npm_tarball.ts";
import {
  AGENT_PACKAGES,
  type AgentCliName,
  type AgentPackage,
  type Architecture,
  type PlatformTarball,
} from "./packages.ts";

export interface HostAgentOptions {
  /** Progress for stderr (a download, an unpack). */
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
  /** npm registry (default: `npm_config_registry`, else npmjs). */
  registry?: string;
  /** Tarball cache (default: `npmCacheDir()`). */
  cacheDir?: string;
  /** Where unpacked agents are kept (default: `hostAgentsDir()`). */
  agentsDir?: string;
  /** The package (default: the agent's pin in `AGENT_PACKAGES`; tests give their own). */
  package?: AgentPackage;
}

/** Where unpacked agents are kept on the host. */
export function hostAgentsDir(): string {
  return `${userCacheDir()}/agents`;
}

/** Docker's name for this host's architecture, if a pinned build exists for it. */
export function hostArchitecture(): Architecture | undefined {
  const names: Record<string, Architecture> = { x86_64: "amd64", aarch64: "arm64" };
  return names[Deno.build.arch];
}

/** The name of `pkg`'s directory for `arch`: its agent, version, architecture and content. */
export async function hostAgentName(pkg: AgentPackage, arch: Architecture): Promise<string> {
  const tarball = pkg.tarballs[arch];
  const hash = await sha256Hex(
    [pkg.name, pkg.version, tarball.integrity, tarball.root, pkg.entrypoint].join("\0"),
  );
  return `${pkg.agent}-${pkg.version}-${arch}-${hash.slice(0, 12)}`;
}

/**
 * The host directory of `agent`'s files for this host's architecture, unpacked from its pinned
 * tarball when missing. Raises `image_build_failed` (exit 125) when the tarball can be neither
 * found in the cache nor downloaded, saying how to bring it here.
 */
export async function ensureHostAgent(
  agent: AgentCliName,
  options: HostAgentOptions = {},
): Promise<string> {
  const pkg = options.package ?? AGENT_PACKAGES[agent];
  const arch = hostArchitecture();
  if (!arch || !pkg.tarballs[arch]) {
    throw new SandboxError(
      "unsupported",
      `Cannot run ${agent} in sandbox mode local: ${pkg.name} has no pinned build for architecture "${Deno.build.arch}"`,
      { detail: `Pinned builds: ${Object.keys(pkg.tarballs).join(", ")}` },
    );
  }
  const agentsDir = options.agentsDir ?? hostAgentsDir();
  const dir = `${agentsDir}/${await hostAgentName(pkg, arch)}`;
  if (await isComplete(dir, pkg.entrypoint)) return dir;

  const tarball = pkg.tarballs[arch];
  const path = await fetchForLocal(agent, tarball, options);
  await Deno.mkdir(agentsDir, { recursive: true, mode: 0o755 });
  const partial = `${dir}.${Deno.pid}-${crypto.randomUUID().slice(0, 8)}.partial`;
  await Deno.mkdir(partial, { mode: 0o755 });
  const started = performance.now();
  options.onProgress?.(`Unpacking ${tarball.spec} into ${dir}`);
  try {
    await unpackTarball(tarball, path, partial, options.signal);
    if (!await isComplete(partial, pkg.entrypoint)) {
      throw new SandboxError(
        "image_build_failed",
        `Cannot install ${agent} for sandbox mode local: ${tarball.spec} has no "${pkg.entrypoint}"`,
      );
    }
    // Read-only for everyone, this user included: the agent's own files are not its to change.
    const locked = await run(["chmod", "-R", "a-w", "--", partial]);
    if (locked.exitCode !== 0) {
      throw new SandboxError(
        "image_build_failed",
        `Cannot make ${dir} read-only: ${locked.stderr.trim()}`,
      );
    }
    await placeOnce(partial, dir, pkg.entrypoint);
  } catch (error) {
    await removeTree(partial);
    throw error;
  }
  options.onProgress?.(
    `Unpacked ${agent} ${pkg.version} in ${((performance.now() - started) / 1000).toFixed(1)}s`,
  );
  return dir;
}

/** Is `dir` an unpacked agent (its program there)? */
async function isComplete(dir: string, entrypoint: string): Promise<boolean> {
  const info = await Deno.stat(`${dir}/${entrypoint}`).catch(() => undefined);
  return info?.isFile === true;
}

/**
 * Rename the finished `partial` to `dir`. When another run placed it first (the rename finds it
 * there), that one is used and `partial` removed.
 */
async function placeOnce(partial: string, dir: string, entrypoint: string): Promise<void> {
  try {
    await Deno.rename(partial, dir);
  } catch (error) {
    if (!await isComplete(dir, entrypoint)) throw error;
    await removeTree(partial);
  }
}

/** Remove a tree this module made read-only. */
async function removeTree(path: string): Promise<void> {
  await run(["chmod", "-R", "u+w", "--", path]);
  await Deno.remove(path, { recursive: true }).catch((error) => {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  });
}

/** The pinned tarball's path in the npm cache, fetched when missing; offline help when it cannot be. */
async function fetchForLocal(
  agent: AgentCliName,
  tarball: PlatformTarball,
  options: HostAgentOptions,
): Promise<string> {
  try {
    return await fetchTarball(tarball, options);
  } catch (error) {
    if (!(error instanceof RegistryError)) throw error;
    const cacheDir = options.cacheDir ?? npmCacheDir();
    throw new SandboxError(
      "image_build_failed",
      `Cannot install ${agent} for sandbox mode local: ${
        error.message.replace(/^Cannot/, "cannot")
      }`,
      {
        cause: error,
        detail: [
          `Mode local runs ${agent} from its pinned npm package, unpacked once on this machine. Either:`,
          `- fetch the package elsewhere (npm pack ${tarball.spec}) and copy ${
            cachedTarballName(tarball)
          } into ${cacheDir}/`,
          "- or point npm_config_registry at a registry mirror you can reach",
        ].join("\n"),
      },
    );
  }
}

export interface HostAgentPruneOptions {
  dryRun?: boolean;
  /** Where unpacked agents are kept (default: `hostAgentsDir()`). */
  agentsDir?: string;
  /** The packages whose directories stay (default: every agent's pin in `AGENT_PACKAGES`). */
  packages?: readonly AgentPackage[];
}

/**
 * Remove (or, dry, list) what `sandbox prune --images` finds in the host's agent directory: an
 * agent's files that no current pin names (left by an earlier version of the tool), and a partial
 * unpack whose process is gone (killed mid-unpack). A partial unpack whose process lives stays.
 */
export async function pruneHostAgents(
  options: HostAgentPruneOptions = {},
): Promise<{ removed: { name: string; bytes: number }[] }> {
  const agentsDir = options.agentsDir ?? hostAgentsDir();
  const arch = hostArchitecture();
  const packages = options.packages ?? Object.values(AGENT_PACKAGES);
  const current = new Set<string>();
  for (const pkg of packages) if (arch) current.add(await hostAgentName(pkg, arch));
  const removed: { name: string; bytes: number }[] = [];
  const entries = await Array.fromAsync(Deno.readDir(agentsDir)).catch((error) => {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  });
  for (const entry of entries) {
    if (current.has(entry.name) || await unpackingNow(entry.name)) continue;
    const path = `${agentsDir}/${entry.name}`;
    removed.push({ name: entry.name, bytes: await treeBytes(path) });
    if (!options.dryRun) await removeTree(path);
  }
  return { removed };
}

/** Is `name` a partial unpack (`<dir>.<pid>-<id>.partial`) whose process still runs? */
async function unpackingNow(name: string): Promise<boolean> {
  const pid = /\.(\d+)-[\w-]+\.partial$/.exec(name)?.[1];
  if (pid === undefined) return false;
  return await Deno.stat(`/proc/${pid}`).then(() => true, () => false);
}

/** Bytes of the files under `path` (symbolic links not followed). */
async function treeBytes(path: string): Promise<number> {
  let bytes = 0;
  for await (const entry of Deno.readDir(path)) {
    const child = `${path}/${entry.name}`;
    if (entry.isDirectory) bytes += await treeBytes(child);
    else if (entry.isFile) bytes += (await Deno.lstat(child)).size;
  }
  return bytes;
}
