/**
 * The devcontainer's image: built from the repository's committed configuration with the reference
 * implementation, `@devcontainers/cli` (its `build` only, never its `up`), then readied for the
 * sandbox layer (missing tools, the user mapped to the sandbox uid, the workspace link).
 *
 * The image is tagged by a hash of everything it is built from — the build part of the
 * configuration, the git object ids of its Dockerfile, build context and local features, the id
 * of an `image`, the CLI's version and the prelude script — so a change rebuilds and nothing else
 * does: an unchanged configuration costs a few `git` calls and one `docker image inspect`.
 */
import { userCacheDir } from "../../paths.ts";
import { DEVCONTAINER_PRELUDE_SCRIPT } from "../assets.ts";
import { type DockerCli, LABEL, labelArgs, OWNER } from "../docker.ts";
import { ensureBaseImage } from "../image.ts";
import { CommandExitError, SandboxError, tail } from "../../errors.ts";
import { sha256Hex } from "../../hash.ts";
import { withHostLock } from "../../lock.ts";
import { run, spawn } from "../../process.ts";
import { type DevcontainerConfig, isRecord, type MetadataEntry, treeEntry } from "./config.ts";

const STACK_LINE = /^\s+at .*(\(|file:|ext:|node:)/;
/** The reference implementation, run by this process's deno from its own cache directory. */
export const DEVCONTAINER_CLI = "npm:@devcontainers/cli@0.89.0";
/** What `@devcontainers/cli build` produces (an intermediate, untagged once the final image exists). */
export const BUILT_REPOSITORY = "sandbox-devcontainer-build";
/** The devcontainer's image readied for the sandbox layer: what `sandbox.image` becomes. */
export const IMAGE_REPOSITORY = "sandbox-devcontainer";
/** The repository an image was built for, for humans and for cleaning up (`docker images --filter`). */
export const SOURCE_LABEL = "dev.sandbox.devcontainer.source";
const METADATA_LABEL = "devcontainer.metadata";
const IMAGE_USER_LABEL = "dev.sandbox.devcontainer.image-user";

/** Tools the sandbox layer and the tool's own commands need in the image, with their Debian packages. */
const REQUIRED_TOOLS: Record<string, string> = {
  // The exec wrapper (scripts/sandbox-exec) is a Perl script: Debian's essential perl-base.
  perl: "perl-base",
  setsid: "util-linux",
  pkill: "procps",
  ps: "procps",
  useradd: "passwd",
  groupadd: "passwd",
  usermod: "passwd",
  groupmod: "passwd",
  getent: "libc-bin",
  git: "git",
  tar: "tar",
};

export interface DevcontainerImageOptions {
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
  /** Rebuild even when an image with the right content hash exists (`sandbox image build`). */
  force?: boolean;
  /**
   * The user the devcontainer runs as, from the image's metadata (its features and base image
   * contribute to it); may throw to refuse (root). Undefined: the sandbox's own user.
   */
  userFor: (metadata: MetadataEntry[], imageUser: string) => string | undefined;
}

export interface DevcontainerImage {
  /** `sandbox-devcontainer:<hash>`. */
  tag: string;
  contentHash: string;
  built: boolean;
  /** The spec's image metadata: base image, features and the configuration's build part, in order. */
  metadata: MetadataEntry[];
  /** The image's environment (for `${containerEnv:…}`). */
  env: Record<string, string>;
  /** Volumes the image declares: Docker gives the container anonymous volumes there. */
  volumes: string[];
  /** The user the devcontainer's image itself runs as (its `USER`), before the sandbox layer. */
  imageUser: string;
}

interface InspectedImage {
  Id: string;
  Config: {
    Env: string[] | null;
    User: string;
    Labels: Record<string, string> | null;
    Volumes: Record<string, unknown> | null;
    Entrypoint: string[] | null;
  };
}

/** `$XDG_CACHE_HOME/sandbox/devcontainer-cli`: the CLI's own deno cache, filled once from npm. */
export function cliCacheDir(): string {
  return `${userCacheDir()}/devcontainer-cli`;
}

/** Make sure the devcontainer's image exists for the configuration's current content. */
export async function ensureDevcontainerImage(
  docker: DockerCli,
  config: DevcontainerConfig,
  options: DevcontainerImageOptions,
): Promise<DevcontainerImage> {
  const contentHash = await devcontainerContentHash(docker, config, options);
  const tag = `${IMAGE_REPOSITORY}:${contentHash.slice(0, 16)}`;
  const existing = await inspectImage(docker, tag, options.signal);
  if (!options.force && existing?.Config.Labels?.[LABEL.contentHash] === contentHash) {
    // The user decision is checked on every use, not only at build time: a profile may have
    // stopped allowing what an earlier build accepted.
    const described = describe(existing);
    options.userFor(described.metadata, described.imageUser);
    return { tag, contentHash, built: false, ...described };
  }
  // The CLI builds feature content under one fixed image name, so builds on one engine take turns.
  return await withHostLock("devcontainer-build", async () => {
    const again = await inspectImage(docker, tag, options.signal);
    if (!options.force && again?.Config.Labels?.[LABEL.contentHash] === contentHash) {
      return { tag, contentHash, built: false, ...describe(again) };
    }
    options.onProgress?.(
      `Building devcontainer image ${tag} from ${config.file} (${config.base.slice(0, 12)})`,
    );
    const built = `${BUILT_REPOSITORY}:${contentHash.slice(0, 16)}`;
    await cliBuild(docker, config, built, options);
    try {
      const inspected = await inspectImage(docker, built, options.signal);
      if (!inspected) {
        throw new SandboxError(
          "image_build_failed",
          `The devcontainer build did not produce "${built}"`,
        );
      }
      const { metadata } = describe(inspected);
      const imageUser = inspected.Config.User ?? "";
      const user = options.userFor(metadata, imageUser);
      const packages = await missingPackages(docker, built, config, options.signal);
      await buildPrelude(docker, {
        from: built,
        tag,
        contentHash,
        config,
        user,
        imageUser,
        packages,
      }, options);
    } finally {
      // Only the tag when the final image was made from it (a parent keeps its layers); all of it otherwise.
      await docker.run(["image", "rm", built]);
    }
    const final = await inspectImage(docker, tag, options.signal);
    if (!final) {
      throw new SandboxError(
        "image_build_failed",
        `Devcontainer image "${tag}" is missing after building it`,
      );
    }
    return { tag, contentHash, built: true, ...describe(final) };
  });
}

/** The hash of everything the image is built from. */
export async function devcontainerContentHash(
  docker: DockerCli,
  config: DevcontainerConfig,
  options: { signal?: AbortSignal; onProgress?: (line: string) => void } = {},
): Promise<string> {
  const parts: string[] = [
    DEVCONTAINER_CLI,
    DEVCONTAINER_PRELUDE_SCRIPT,
    config.workspaceFolder,
    stableJson(config.buildConfig),
  ];
  for (const path of inputPaths(config)) {
    const entry = await treeEntry(config.repoPath, config.base, path);
    parts.push(`${path}\0${entry?.oid ?? "-"}`);
  }
  if (config.source.kind === "image") {
    // Pulled first when missing, so that the first build and the next use hash alike.
    parts.push(await ensureBaseImage(docker, config.source.image, options));
  }
  return await sha256Hex(parts.join("\0\0"));
}

/** Repository paths the build reads (the configuration itself is written anew, sanitised). */
function inputPaths(config: DevcontainerConfig): string[] {
  const paths = new Set<string>(config.localFeatures);
  if (config.source.kind === "build") {
    paths.add(config.source.dockerfile);
    paths.add(config.source.context);
  }
  const dir = config.file.includes("/")
    ? config.file.slice(0, config.file.lastIndexOf("/") + 1)
    : "";
  const name = config.file.slice(dir.length);
  paths.add(`${dir}${name.startsWith(".") ? ".devcontainer-lock.json" : "devcontainer-lock.json"}`);
  return [...paths].sort();
}

/**
 * `@devcontainers/cli build` on a copy of the committed files, with the configuration reduced to
 * what builds (no run arguments, mounts, build options or commands), from a minimal environment.
 */
async function cliBuild(
  docker: DockerCli,
  config: DevcontainerConfig,
  tag: string,
  options: DevcontainerImageOptions,
): Promise<void> {
  await ensureCli(options);
  const dir = await Deno.makeTempDir({ prefix: "sandbox-devcontainer-" });
  const lines: string[] = [];
  try {
    await extract(config, dir, options.signal);
    const configPath = `${dir}/${config.file}`;
    await Deno.mkdir(configPath.slice(0, configPath.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(configPath, JSON.stringify(config.buildConfig, null, 2));
    const argv = [
      Deno.execPath(),
      "run",
      "--allow-all",
      "--no-config",
      "--no-lock",
      "--cached-only",
      "--quiet",
      DEVCONTAINER_CLI,
      "build",
      "--workspace-folder",
      config.workspaceSubdir ? `${dir}/${config.workspaceSubdir}` : dir,
      "--config",
      configPath,
      "--image-name",
      tag,
      "--docker-path",
      docker.program,
      "--oci-auth-hardening",
      "--label",
      `${LABEL.owner}=${OWNER}`,
      "--label",
      `${SOURCE_LABEL}=${config.repoPath}`,
      "--log-format",
      "text",
    ];
    const result = await run(argv, {
      cwd: dir,
      clearEnv: true,
      env: cliEnv(),
      signal: options.signal,
      onStderrLine: (line) => {
        // The CLI's own stack traces say nothing to a user whose Dockerfile failed.
        if (STACK_LINE.test(line)) return;
        lines.push(line);
        options.onProgress?.(line);
      },
    });
    if (result.aborted) throw new SandboxError("interrupted", "Devcontainer build interrupted");
    if (result.exitCode !== 0) throw buildError(config, result, lines);
  } finally {
    await removeTemporary(dir, options.onProgress);
    await removeBuildLeftovers(docker, lines);
  }
}

/**
 * Docker's legacy builder leaves the result of each stage of a multi-stage build as an untagged
 * image (and the container of a step that failed), and the CLI stages feature content under one
 * fixed tag: remove what this build left — containers of its steps that still exist (stopped:
 * `rm` without force), images it printed that are now dangling (never a tagged image, never one
 * with children) — and that tag.
 */
async function removeBuildLeftovers(docker: DockerCli, lines: string[]): Promise<void> {
  const printed = new Set<string>();
  const steps = new Set<string>();
  for (const line of lines) {
    const started = line.match(/Running in ([0-9a-f]{12})\b/);
    if (started) steps.add(started[1]);
    const removed = line.match(/Removing intermediate container ([0-9a-f]{12})\b/);
    if (removed) steps.delete(removed[1]);
    const match = line.match(/(?:--->|Successfully built)\s+([0-9a-f]{12})\b/);
    if (match) printed.add(match[1]);
  }
  // The legacy builder keeps the container of a failed step: it goes before its image.
  for (const id of steps) await docker.run(["container", "rm", id]);
  await docker.run(["image", "rm", "dev_container_feature_content_temp"]);
  const dangling = await docker.run(["images", "--filter", "dangling=true", "--quiet"]);
  const ours = dangling.stdout.split("\n").map((l) => l.trim()).filter((id) =>
    printed.has(id.slice(0, 12))
  );
  // Newest first, so that a stage goes before the stage it was built on.
  for (const id of ours) await docker.run(["image", "rm", id]);
}

/** The committed files the build reads, from the base commit, into `dir` (no working tree, no host path). */
async function extract(
  config: DevcontainerConfig,
  dir: string,
  signal?: AbortSignal,
): Promise<void> {
  const wanted = inputPaths(config);
  const present: string[] = [];
  for (const path of wanted) {
    if (path === "" || await treeEntry(config.repoPath, config.base, path)) present.push(path);
  }
  const whole = present.includes("");
  const archive = spawn(
    [
      "git",
      "-C",
      config.repoPath,
      "archive",
      "--format=tar",
      config.base,
      ...(whole ? [] : ["--", ...present]),
    ],
    { signal },
  );
  const untar = spawn(["tar", "-x", "-C", dir, "--no-same-owner"], {
    stdin: archive.stdout,
    signal,
  });
  const [packed, unpacked] = await Promise.all([
    archive.finished,
    untar.finished,
    new Response(untar.stdout).text(),
  ]);
  if (packed.exitCode !== 0) {
    throw new CommandExitError(
      "image_build_failed",
      `Cannot read the devcontainer's files from "${config.repoPath}"`,
      packed,
    );
  }
  if (unpacked.exitCode !== 0) {
    throw new CommandExitError(
      "image_build_failed",
      "Cannot unpack the devcontainer's files",
      unpacked,
    );
  }
}

/** Only what the CLI and docker need: no keys, tokens or other host variables reach the build. */
function cliEnv(): Record<string, string> {
  const env: Record<string, string> = {
    DENO_DIR: cliCacheDir(),
    DENO_NO_UPDATE_CHECK: "1",
    NO_COLOR: "1",
  };
  // Docker's own settings, and the host's trusted certificates (registries behind a TLS proxy).
  const names = [
    "HOME",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
  ];
  names.push(
    "DENO_CERT",
    "DENO_TLS_CA_STORE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
  );
  for (const name of names) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/** Fetch the CLI from npm into its cache once; afterwards every build runs it offline (`--cached-only`). */
async function ensureCli(
  options: { signal?: AbortSignal; onProgress?: (line: string) => void },
): Promise<void> {
  const base = [Deno.execPath(), "run", "--allow-all", "--no-config", "--no-lock", "--quiet"];
  const probe = await run([...base, "--cached-only", DEVCONTAINER_CLI, "--version"], {
    clearEnv: true,
    env: cliEnv(),
    signal: options.signal,
  });
  if (probe.exitCode === 0) return;
  if (!/not found in cache|--cached-only/.test(probe.stderr)) {
    throw new CommandExitError(
      "image_build_failed",
      `Cannot run ${DEVCONTAINER_CLI.slice(4)}`,
      probe,
    );
  }
  options.onProgress?.(
    `Fetching ${DEVCONTAINER_CLI.slice(4)} from npm into ${cliCacheDir()} (once)`,
  );
  const fetched = await run([
    Deno.execPath(),
    "cache",
    "--no-config",
    "--no-lock",
    "--quiet",
    DEVCONTAINER_CLI,
  ], {
    clearEnv: true,
    env: { ...cliEnv(), ...proxyEnv() },
    signal: options.signal,
  });
  if (fetched.exitCode !== 0) {
    throw new CommandExitError(
      "image_build_failed",
      `Cannot fetch ${DEVCONTAINER_CLI.slice(4)} from npm`,
      fetched,
      {
        detail: `${
          tail(fetched.stderr, 5)
        }\nDevcontainer mode builds images with it; it is fetched once (about 2 MB), then works offline`,
      },
    );
  }
}

/** The host's proxy and registry settings, for fetching from npm (on the host; nothing enters a sandbox). */
function proxyEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (
    const name of [
      "HTTPS_PROXY",
      "https_proxy",
      "HTTP_PROXY",
      "http_proxy",
      "NO_PROXY",
      "no_proxy",
      "NPM_CONFIG_REGISTRY",
      "DENO_AUTH_TOKENS",
    ]
  ) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/** A failed CLI build as an error that says what failed and what to do. */
function buildError(
  config: DevcontainerConfig,
  result: { argv: readonly string[]; exitCode: number; stderr: string; stdout: string },
  lines: string[],
): SandboxError {
  const outcome = parseOutcome(result.stdout);
  const reason = outcome?.message ?? (tail(result.stderr, 1) || `exit code ${result.exitCode}`);
  const network =
    /ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ECONNRESET|EHOSTUNREACH|ENETUNREACH|getaddrinfo|fetch failed|certificate|TLS|dns error|tcp connect/i;
  if (config.remoteFeatures.length > 0 && network.test(`${reason}\n${result.stderr}`)) {
    // The CLI names the feature it was resolving; else every remote one is a suspect.
    const named = config.remoteFeatures.filter((id) =>
      lines.some((line) => line.includes(`'${id}'`) || line.includes(`"${id}"`))
    );
    const features = named.length > 0 ? named : config.remoteFeatures;
    const list = features.map((f) => `"${f}"`).join(", ");
    const registry = registryOf(features[0]);
    return new SandboxError(
      "image_build_failed",
      `Cannot build the devcontainer of "${config.repoPath}": feature ${list} cannot be fetched from ${registry} (${reason})`,
      {
        detail:
          `Remote features are fetched from their registry when the image is built. Make ${registry} reachable from this machine, ` +
          `or copy the feature into the repository (a folder with devcontainer-feature.json and install.sh, e.g. .devcontainer/${
            featureName(features[0])
          }/) ` +
          `and name it "./${featureName(features[0])}" in ${config.file}`,
      },
    );
  }
  // The CLI's message repeats the whole docker command line; its description and the build's
  // last lines say what failed.
  const what = outcome?.description?.replace(/\.$/, "") ?? reason;
  const last = lines.filter((l) => l.trim() && !/^Error: Command failed/.test(l)).slice(-8).join(
    "\n",
  );
  return new CommandExitError(
    "image_build_failed",
    `Cannot build the devcontainer of "${config.repoPath}": ${what}`,
    {
      argv: result.argv,
      exitCode: result.exitCode,
      stderrTail: last,
    },
  );
}

function parseOutcome(
  stdout: string,
): { outcome: string; message?: string; description?: string } | undefined {
  for (const line of stdout.trim().split("\n").reverse()) {
    try {
      const value = JSON.parse(line);
      if (isRecord(value) && typeof value.outcome === "string") {
        return value as { outcome: string; message?: string; description?: string };
      }
    } catch {
      // Not the outcome line.
    }
  }
  return undefined;
}

/** `ghcr.io` of `ghcr.io/devcontainers/features/node:1`; the host of a tarball URL. */
function registryOf(feature: string): string {
  if (/^https?:\/\//.test(feature)) return new URL(feature).host;
  return feature.split("/")[0];
}

function featureName(feature: string): string {
  return feature.replace(/[@:][^/]*$/, "").split("/").pop()!.replace(/\.tgz$/, "").replace(
    /[^A-Za-z0-9_.-]/g,
    "-",
  ) || "feature";
}

/**
 * What the sandbox layer needs and the image lacks, as Debian packages to add. Without apt-get, a
 * lack is an error naming what is missing. Checked in a throwaway container without network or
 * capabilities.
 */
async function missingPackages(
  docker: DockerCli,
  image: string,
  config: DevcontainerConfig,
  signal?: AbortSignal,
): Promise<string[]> {
  const loader = Deno.build.arch === "aarch64"
    ? "/lib/ld-linux-aarch64.so.1"
    : "/lib64/ld-linux-x86-64.so.2";
  const script =
    `for t in ${
      Object.keys(REQUIRED_TOOLS).join(" ")
    }; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done; ` +
    `[ -e ${loader} ] || echo glibc; command -v apt-get >/dev/null 2>&1 && echo +apt-get; exit 0`;
  const result = await docker.run([
    "run",
    "--rm",
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--user",
    "0:0",
    "--entrypoint",
    "/bin/sh",
    ...labelArgs({ [LABEL.owner]: OWNER }),
    image,
    "-c",
    script,
  ], { signal, timeoutMs: 120_000 });
  const what = `Cannot use the devcontainer image of "${config.repoPath}"`;
  if (result.exitCode !== 0) {
    if (/\/bin\/sh|no such file or directory|executable file not found/i.test(result.stderr)) {
      throw new SandboxError("image_build_failed", `${what}: it has no shell (/bin/sh)`, {
        detail:
          "The sandbox layer needs /bin/sh, perl, setsid, pkill, ps, useradd/groupadd/usermod/groupmod, getent, git and tar: base the devcontainer on an image that has them (Debian-like)",
      });
    }
    throw new CommandExitError("image_build_failed", `${what}: cannot check what it holds`, result);
  }
  const out = result.stdout.split("\n").map((l) => l.trim()).filter(Boolean);
  const hasApt = out.includes("+apt-get");
  const missing = out.filter((l) => !l.startsWith("+"));
  if (missing.includes("glibc")) {
    throw new SandboxError("image_build_failed", `${what}: it is not glibc-based (no ${loader})`, {
      detail:
        "The sandbox's worker runtime needs glibc: base the devcontainer on a Debian- or Ubuntu-like image",
    });
  }
  if (missing.length === 0) return [];
  if (!hasApt) {
    throw new SandboxError(
      "image_build_failed",
      `${what}: it lacks ${missing.join(", ")} (and apt-get to add them)`,
      {
        detail: `The sandbox layer needs them. Install ${
          [...new Set(missing.map((t) => REQUIRED_TOOLS[t]))].join(", ")
        } (or your distribution's equivalents) in the devcontainer's Dockerfile`,
      },
    );
  }
  return [...new Set(missing.map((t) => REQUIRED_TOOLS[t]))].sort();
}

/** The prelude layer: missing packages, the user mapped to the sandbox uid, the workspace link, no entrypoint. */
async function buildPrelude(
  docker: DockerCli,
  input: {
    from: string;
    tag: string;
    contentHash: string;
    config: DevcontainerConfig;
    user?: string;
    imageUser: string;
    packages: string[];
  },
  options: DevcontainerImageOptions,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "sandbox-devcontainer-prelude-" });
  try {
    await Deno.writeTextFile(`${dir}/prelude.sh`, DEVCONTAINER_PRELUDE_SCRIPT);
    await Deno.writeTextFile(
      `${dir}/Dockerfile`,
      [
        "ARG BASE_IMAGE",
        "FROM ${BASE_IMAGE}",
        "USER root",
        "ARG SANDBOX_USER=",
        "ARG SANDBOX_WORKSPACE=",
        "ARG SANDBOX_PACKAGES=",
        "COPY prelude.sh /usr/local/lib/sandbox/devcontainer-prelude.sh",
        'RUN sh /usr/local/lib/sandbox/devcontainer-prelude.sh "$SANDBOX_USER" "$SANDBOX_WORKSPACE" "$SANDBOX_PACKAGES"',
        // The sandbox starts its own command; an entrypoint of the image would run in front of it.
        "ENTRYPOINT []",
        "",
      ].join("\n"),
    );
    if (input.packages.length > 0) {
      options.onProgress?.(`Adding what the sandbox layer needs: ${input.packages.join(" ")}`);
    }
    const result = await docker.run([
      "build",
      "--build-arg",
      `BASE_IMAGE=${input.from}`,
      "--build-arg",
      `SANDBOX_USER=${input.user ?? ""}`,
      "--build-arg",
      `SANDBOX_WORKSPACE=${input.config.workspaceFolder}`,
      "--build-arg",
      `SANDBOX_PACKAGES=${input.packages.join(" ")}`,
      ...labelArgs({
        [LABEL.owner]: OWNER,
        [LABEL.contentHash]: input.contentHash,
        [SOURCE_LABEL]: input.config.repoPath,
        [IMAGE_USER_LABEL]: input.imageUser,
      }),
      "--tag",
      input.tag,
      dir,
    ], {
      signal: options.signal,
      onStderrLine: options.onProgress,
      env: { DOCKER_CLI_HINTS: "false" },
    });
    if (result.exitCode !== 0) {
      throw new CommandExitError(
        "image_build_failed",
        `Cannot ready the devcontainer image "${input.tag}" for the sandbox`,
        result,
        {
          detail: tail(result.stdout + result.stderr),
        },
      );
    }
    for (const line of result.stdout.split("\n")) if (line.trim()) options.onProgress?.(line);
  } finally {
    await removeTemporary(dir, options.onProgress);
  }
}

async function inspectImage(
  docker: DockerCli,
  ref: string,
  signal?: AbortSignal,
): Promise<InspectedImage | undefined> {
  const result = await docker.run(["image", "inspect", "--format", "{{json .}}", ref], { signal });
  return result.exitCode === 0 ? JSON.parse(result.stdout) as InspectedImage : undefined;
}

function describe(
  image: InspectedImage,
): Pick<DevcontainerImage, "metadata" | "env" | "volumes" | "imageUser"> {
  let metadata: MetadataEntry[] = [];
  const label = image.Config.Labels?.[METADATA_LABEL];
  if (label) {
    try {
      const parsed = JSON.parse(label);
      metadata = (Array.isArray(parsed) ? parsed : [parsed]).filter(isRecord) as MetadataEntry[];
    } catch {
      // A label that is not JSON carries nothing we can use.
    }
  }
  const env: Record<string, string> = {};
  for (const pair of image.Config.Env ?? []) {
    const eq = pair.indexOf("=");
    if (eq > 0) env[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  const imageUser = image.Config.Labels?.[IMAGE_USER_LABEL] ?? image.Config.User ?? "";
  return { metadata, env, volumes: Object.keys(image.Config.Volumes ?? {}), imageUser };
}

/** JSON with sorted keys: the same configuration always hashes alike. */
function stableJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stableJson).join(",")}]`;
  if (isRecord(value)) {
    return `{${
      Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${stableJson(value[k])}`).join(",")
    }}`;
  }
  return JSON.stringify(value) ?? "null";
}

/** Removes a temporary build directory; one that stays behind is named in a warning. */
async function removeTemporary(
  dir: string,
  onProgress: ((line: string) => void) | undefined,
): Promise<void> {
  await Deno.remove(dir, { recursive: true }).catch((error) =>
    onProgress?.(`warning: cannot remove the temporary directory "${dir}": ${error.message}`)
  );
}
