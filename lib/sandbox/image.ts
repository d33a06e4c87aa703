/**
 * The sandbox image: built from the embedded Dockerfile on top of the profile's base image,
 * tagged by a hash of what it is built from, rebuilt only when that changes.
 *
 * The hash covers the bytes of every file in the build context (Dockerfile, exec wrapper, worker
 * and relay bundles, deno runtime) and nothing about how this CLI was packaged, so the bundled CLI and a
 * checkout of the same sources build, and share, the same image.
 *
 * A build reports phases (base image, sandbox image) with their elapsed time; the full output of
 * docker goes to a log file in the state directory, named in the phase line and in any error.
 */
import { BUILD_BASE_IMAGE_SCRIPT, IMAGE_CONTEXT } from "./assets.ts";
import { DEFAULT_BASE_IMAGE, userStateDir } from "../config.ts";
import { daemonDown, type DockerCli, LABEL, labelArgs } from "./docker.ts";
import { dockerEngine, unless } from "./engine.ts";
import { CommandExitError, SandboxError, tail } from "../errors.ts";
import { run } from "../process.ts";
import { fileSha256, sha256Hex } from "../hash.ts";
import { withHostLock } from "../lock.ts";
import {
  denoBinaryPath,
  relayBundlePath,
  relayContentHash,
  workerBundlePath,
  workerContentHash,
} from "./worker_bundle.ts";

export const IMAGE_REPOSITORY = "sandbox-runtime";

/** "begin": a slow step starts (a terminal may show a spinner until the next line); "end": it ended. */
export type ProgressPhase = "begin" | "end";

export interface ImageOptions {
  /** Phase lines for stderr: what is being built, then how long it took. */
  onProgress?: (line: string, phase?: ProgressPhase) => void;
  signal?: AbortSignal;
  /** Rebuild even when an image with the right content hash exists. */
  force?: boolean;
}

export interface ImageInfo {
  /** `sandbox-runtime:<hash>`. */
  tag: string;
  /** Hash of the base image id and every build-context file. */
  contentHash: string;
  built: boolean;
  /** The build's full docker output, when this call built the image. */
  log?: string;
}

/** Where full build output is kept: `<state dir>/builds/`. */
export function buildLogDir(): string {
  return `${userStateDir()}/builds`;
}

/**
 * The image tag for a base: a pure function of the base's name and the context files, so that
 * the fast path (container already up) needs no docker call to know which image it wants.
 */
export async function imageTagFor(baseImage: string): Promise<string> {
  return `${IMAGE_REPOSITORY}:${(await contextHash(baseImage)).slice(0, 16)}`;
}

let contextDigest: Promise<string> | undefined;

/**
 * One line per build-context file, `name sha256`, sorted: the content the image is built from.
 * The deno binary's hash is cached under its identity (it is 100 MB); the rest costs ~30 ms once
 * per process.
 */
function contextFilesDigest(onProgress?: ImageOptions["onProgress"]): Promise<string> {
  contextDigest ??= (async () => {
    const lines: string[] = [];
    for (const name of Object.keys(IMAGE_CONTEXT)) {
      lines.push(`${name} ${await sha256Hex(IMAGE_CONTEXT[name])}`);
    }
    lines.push(`worker.js ${await workerContentHash(onProgress)}`);
    lines.push(`relay.js ${await relayContentHash(onProgress)}`);
    lines.push(`deno ${await fileSha256(denoBinaryPath(), `${userStateDir()}/cache`)}`);
    return lines.sort().join("\n");
  })();
  contextDigest.catch(() => contextDigest = undefined);
  return contextDigest;
}

/** Hash of everything the image is built from, plus `extra` (base name, and for labels its id). */
async function contextHash(...extra: string[]): Promise<string> {
  return await sha256Hex([...extra, await contextFilesDigest()].join("\0\0"));
}

/** The labels of a local image, or undefined when it is absent. */
async function imageLabels(
  docker: DockerCli,
  ref: string,
  signal?: AbortSignal,
): Promise<Record<string, string> | undefined> {
  const image = await unless(
    ["image-missing"],
    () => dockerEngine(docker.program).inspectImage(ref, signal),
  );
  return image ? image.Config?.Labels ?? {} : undefined;
}

/** Id of a local image, or undefined when absent. */
async function imageId(
  docker: DockerCli,
  ref: string,
  signal?: AbortSignal,
): Promise<string | undefined> {
  return (await unless(
    ["image-missing"],
    () => dockerEngine(docker.program).inspectImage(ref, signal),
  ))?.Id;
}

function seconds(since: number): string {
  return `${((performance.now() - since) / 1000).toFixed(1)}s`;
}

/** A build log file: every line of output as it arrives, so a killed build leaves its log too. */
async function openBuildLog(
  name: string,
): Promise<{ path: string; line: (text: string) => void; close: () => void }> {
  const dir = buildLogDir();
  await Deno.mkdir(dir, { recursive: true });
  const path = `${dir}/${name.replace(/[^A-Za-z0-9_.-]+/g, "-")}.log`;
  const file = await Deno.open(path, { write: true, create: true, truncate: true, mode: 0o600 });
  const encoder = new TextEncoder();
  let open = true;
  return {
    path,
    line(text: string) {
      if (!open) return;
      let bytes = encoder.encode(text + "\n");
      while (bytes.length > 0) bytes = bytes.subarray(file.writeSync(bytes));
    },
    close() {
      if (open) file.close();
      open = false;
    },
  };
}

/**
 * The last lines of a build log for an error's detail, plus the last of stderr (where the reason
 * usually is) when they are not among them: the two streams reach the log in arrival order.
 */
async function logTail(path: string, stderrTail = ""): Promise<string> {
  // A log that cannot be read leaves the error's detail shorter, nothing else.
  const last = tail(await Deno.readTextFile(path).catch(() => ""), 12);
  const shown = new Set(last.split("\n"));
  const missing = tail(stderrTail, 5).split("\n").filter((line) => line.trim() && !shown.has(line));
  return [last, ...missing].filter(Boolean).join("\n");
}

/**
 * Make sure the base image exists: pull it, or for the default base (which no registry serves
 * here) build it from Debian packages with the embedded bootstrap script, once.
 */
export async function ensureBaseImage(
  docker: DockerCli,
  baseImage: string,
  options: ImageOptions = {},
): Promise<string> {
  const existing = await imageId(docker, baseImage, options.signal);
  if (existing) return existing;
  const started = performance.now();
  const log = await openBuildLog(`base-${baseImage}`);
  try {
    if (baseImage === DEFAULT_BASE_IMAGE) {
      options.onProgress?.(
        `Building base image ${baseImage} from Debian packages (once; log: ${log.path})`,
        "begin",
      );
      const script = await Deno.makeTempFile({ prefix: "sandbox-build-base-", suffix: ".sh" });
      try {
        await Deno.writeTextFile(script, BUILD_BASE_IMAGE_SCRIPT);
        const result = await run(["bash", script, baseImage], {
          signal: options.signal,
          env: { DOCKER: docker.program },
          onStderrLine: log.line,
        });
        for (const line of result.stdout.split("\n")) if (line) log.line(line);
        if (result.exitCode !== 0) {
          throw new CommandExitError(
            "image_build_failed",
            `Cannot build base image "${baseImage}"`,
            result,
            {
              detail: `${await logTail(
                log.path,
                result.stderrTail,
              )}\nIt needs root (debootstrap) and Debian's package mirror\nFull build log: ${log.path}`,
            },
          );
        }
      } finally {
        // A temporary file left behind costs nothing; the build's outcome stands either way.
        await Deno.remove(script).catch(() => {});
      }
      options.onProgress?.(`Built base image ${baseImage} in ${seconds(started)}`, "end");
    } else {
      options.onProgress?.(`Pulling base image ${baseImage} (log: ${log.path})`, "begin");
      const result = await docker.run(["pull", baseImage], {
        signal: options.signal,
        onStderrLine: log.line,
      });
      for (const line of result.stdout.split("\n")) if (line) log.line(line);
      if (result.exitCode !== 0) {
        throw new CommandExitError(
          "image_build_failed",
          `Cannot pull base image "${baseImage}"`,
          result,
          {
            detail: `${
              tail(result.stderr)
            }\nBuild or load it locally, or set sandbox.image to an image you have\nFull log: ${log.path}`,
          },
        );
      }
      options.onProgress?.(`Pulled base image ${baseImage} in ${seconds(started)}`, "end");
    }
  } finally {
    log.close();
  }
  const id = await imageId(docker, baseImage, options.signal);
  if (!id) {
    throw new SandboxError(
      "image_build_failed",
      `Base image "${baseImage}" is still missing after building it`,
    );
  }
  return id;
}

/**
 * Put `source` at `target` cheaply: a hard link when on one filesystem and of the wanted `mode`
 * (a link shares the source's mode, which must not be changed), else a copy given that mode.
 */
async function place(source: string, target: string, mode?: number): Promise<void> {
  const linkable = mode === undefined || (((await Deno.stat(source)).mode ?? 0) & 0o7777) === mode;
  if (linkable) {
    try {
      await Deno.link(source, target);
      return;
    } catch {
      // Another filesystem (or links refused): copied below.
    }
  }
  await Deno.copyFile(source, target);
  if (mode !== undefined) await Deno.chmod(target, mode);
}

/**
 * Make sure the sandbox image for `baseImage` exists and was built from the current content
 * (base image id + context files). Builds it when missing or stale.
 */
export async function ensureImage(
  docker: DockerCli,
  baseImage: string,
  options: ImageOptions = {},
): Promise<ImageInfo> {
  const baseId = await ensureBaseImage(docker, baseImage, options);
  await contextFilesDigest(options.onProgress);
  const tag = await imageTagFor(baseImage);
  const contentHash = await contextHash(baseImage, baseId);
  // An image of an older version carried the owner label, which every container started from it
  // inherits (a hand-made one too, so teardown would take it): such an image is rebuilt.
  const current = async () => {
    const labels = await imageLabels(docker, tag, options.signal);
    return labels?.[LABEL.contentHash] === contentHash && labels[LABEL.owner] === undefined;
  };
  if (!options.force && await current()) return { tag, contentHash, built: false };
  // One build of a tag at a time on this host: runs that start together (each in a container of
  // its own) wait for the one build, then find the image there.
  return await withHostLock(`image-${tag.replace(/[^A-Za-z0-9_.-]/g, "_")}`, async () => {
    if (!options.force && await current()) return { tag, contentHash, built: false };
    return await buildImage(docker, { baseImage, tag, contentHash }, options);
  });
}

async function buildImage(
  docker: DockerCli,
  { baseImage, tag, contentHash }: { baseImage: string; tag: string; contentHash: string },
  options: ImageOptions,
): Promise<ImageInfo> {
  const started = performance.now();
  const log = await openBuildLog(tag);
  options.onProgress?.(`Building sandbox image ${tag} on ${baseImage} (log: ${log.path})`, "begin");
  // Exactly the files the Dockerfile copies, in a directory of their own: the build context.
  const dir = await Deno.makeTempDir({ prefix: "sandbox-image-" });
  try {
    for (const [name, content] of Object.entries(IMAGE_CONTEXT)) {
      await Deno.writeTextFile(`${dir}/${name}`, content);
      // The wrappers are programs: their mode travels with the COPY (no chmod layer after it).
      if (name !== "Dockerfile") await Deno.chmod(`${dir}/${name}`, 0o755);
    }
    await place(await workerBundlePath(options.onProgress), `${dir}/worker.js`);
    await place(await relayBundlePath(options.onProgress), `${dir}/relay.js`);
    await place(denoBinaryPath(), `${dir}/deno`, 0o755);
    const child = docker.spawn([
      "build",
      "--build-arg",
      `BASE_IMAGE=${baseImage}`,
      // Only the content hash: ownership labels go on what the tool creates from the image (see
      // the container's and volume's labels), never on the image, whose labels every container
      // started from it would inherit.
      ...labelArgs({ [LABEL.contentHash]: contentHash }),
      "--tag",
      tag,
      dir,
    ], {
      signal: options.signal,
      // Both builders write to either stream; all of it, deprecation notices included, is log.
      onStderrLine: log.line,
      env: { DOCKER_CLI_HINTS: "false" },
    });
    for await (const line of child.lines()) log.line(line);
    const outcome = await child.finished;
    if (outcome.exitCode !== 0 && !outcome.aborted && !await docker.reachable()) {
      throw daemonDown(outcome.stderrTail);
    }
    if (outcome.aborted) {
      throw new SandboxError("interrupted", `Building sandbox image "${tag}" was interrupted`);
    }
    if (outcome.exitCode !== 0) {
      throw new CommandExitError(
        "image_build_failed",
        `Cannot build sandbox image "${tag}"`,
        outcome,
        {
          detail: `${await logTail(log.path, outcome.stderrTail)}\nFull build log: ${log.path}`,
        },
      );
    }
  } finally {
    log.close();
    // A temporary directory left behind costs disk space only; the build's outcome stands.
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  options.onProgress?.(`Built sandbox image ${tag} in ${seconds(started)}`, "end");
  return { tag, contentHash, built: true, log: log.path };
}
