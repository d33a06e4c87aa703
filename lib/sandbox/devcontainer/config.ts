/**
 * A repository's devcontainer.json, read the way the sandbox may use it.
 *
 * The configuration is read from the committed tree of the base commit, never from the working
 * tree: what the image is built from is what the run receives, and nothing uncommitted (a `.env`,
 * a key file) can reach a build context. It is parsed as JSONC, its variables are substituted
 * (a `${localEnv:…}` that names a secret is refused, as everywhere), and it is split into what
 * builds the image, what shapes the sandbox at run time, and what is never applied, each with
 * the reason.
 */
import { parse, type ParseError, printParseErrorCode } from "jsonc-parser";
import { isSecretName } from "../../config.ts";
import { ConfigError, type ConfigIssue, SandboxError } from "../../errors.ts";
import { run } from "../../process.ts";

/** Looked for in the workspace folder, in order, when the profile names no file. */
export const CONFIG_CANDIDATES = [".devcontainer/devcontainer.json", ".devcontainer.json"] as const;

export const LIFECYCLE_HOOKS = [
  "onCreateCommand",
  "updateContentCommand",
  "postCreateCommand",
  "postStartCommand",
] as const;
export type LifecycleHook = typeof LIFECYCLE_HOOKS[number];
/** A lifecycle command: a shell string, an argv, or named commands that run in parallel. */
export type LifecycleCommand = string | string[] | Record<string, string | string[]>;

/**
 * One entry of the spec's image metadata (the `devcontainer.metadata` label that features, base
 * images and the configuration itself contribute to), reduced to what the sandbox reads.
 */
export interface MetadataEntry {
  id?: string;
  remoteUser?: string;
  containerUser?: string;
  containerEnv?: Record<string, string>;
  remoteEnv?: Record<string, string | null>;
  onCreateCommand?: LifecycleCommand;
  updateContentCommand?: LifecycleCommand;
  postCreateCommand?: LifecycleCommand;
  postStartCommand?: LifecycleCommand;
  postAttachCommand?: LifecycleCommand;
  privileged?: boolean;
  capAdd?: string[];
  securityOpt?: string[];
  mounts?: unknown[];
  init?: boolean;
  entrypoint?: string;
}

export type ImageSource =
  | { kind: "image"; image: string }
  | {
    kind: "build";
    /** Repository-relative path of the Dockerfile. */
    dockerfile: string;
    /** Repository-relative build context ("" is the repository's root). */
    context: string;
    args: Record<string, string>;
    target?: string;
  };

export interface DevcontainerConfig {
  /** The repository's top-level directory on the host. */
  repoPath: string;
  /** The commit the configuration was read from. */
  base: string;
  /** Repository-relative path of the devcontainer.json. */
  file: string;
  /** Repository-relative folder the devcontainer belongs to ("" is the root). */
  workspaceSubdir: string;
  /** Where the workspace appears in the container. */
  workspaceFolder: string;
  source: ImageSource;
  /** Repository-relative folders of local features (`./name`). */
  localFeatures: string[];
  /** Features fetched from a registry (OCI references or tarball URLs). */
  remoteFeatures: string[];
  /** The configuration as the image build gets it: build keys only, paths as written, variables substituted. */
  buildConfig: Record<string, unknown>;
  /** The run-time part of this configuration (the last metadata entry). */
  entry: MetadataEntry;
  /** One line per key that is never applied, saying why. */
  warnings: string[];
}

export interface ReadOptions {
  /** `sandbox.devcontainer.config`: the file, relative to the repository. */
  config?: string;
  /** `sandbox.devcontainer.workspace_folder`: a folder of the repository. */
  workspaceFolder?: string;
  /** Host environment for `${localEnv:…}` (default: the process environment). */
  hostEnv?: (name: string) => string | undefined;
}

/**
 * Keys that would undo the hardening, with the reason each is never applied. Checked on the
 * configuration and on every metadata entry (features and base images contribute them too).
 */
const NEVER_APPLIED: Record<string, string> = {
  privileged: "a privileged container holds every capability and the host's devices",
  capAdd: "the sandbox keeps every capability dropped",
  securityOpt: "security options could turn off seccomp, AppArmor or no-new-privileges",
  runArgs: "docker run arguments could add host mounts, devices, the host network or capabilities",
  mounts:
    "mounts could expose host paths or the Docker socket; the repository comes in as git objects",
  workspaceMount: "nothing of the host is mounted; the repository comes in as git objects",
  forwardPorts: "the sandbox takes no inbound connections",
  appPort: "the sandbox takes no inbound connections",
  initializeCommand: "it would run on the host, outside the sandbox",
  postAttachCommand: "nothing attaches to a sandbox",
  entrypoint: "the sandbox starts its own command as the container's only entrypoint",
  hostRequirements: "the sandbox's resources come from the profile",
};
const BUILD_NEVER_APPLIED: Record<string, string> = {
  options: "extra docker build options could give the build the host network or host files",
  cacheFrom: "build caches come from this engine's local layers only",
};
/** Values in runArgs or mounts worth naming in the warning: they show what the repository asked for. */
const NOTABLE =
  /(^--?(privileged|net|network|pid|ipc|uts|userns|cap-add|security-opt|device|gpus|volume|mount|v)\b)|docker\.sock/;

/** Read, check and resolve the devcontainer configuration of `repoPath` at commit `base`. */
export async function readDevcontainerConfig(
  repoPath: string,
  base: string,
  options: ReadOptions = {},
): Promise<DevcontainerConfig> {
  const hostEnv = options.hostEnv ?? ((name: string) => Deno.env.get(name));
  const workspaceSubdir = await workspaceSubdirOf(repoPath, base, options.workspaceFolder);
  const file = await findConfigFile(repoPath, base, workspaceSubdir, options.config);
  const where = `${repoPath}/${file}`;
  const text = await git(repoPath, ["cat-file", "blob", `${base}:${file}`], `read ${file}`);
  const raw = parseJsoncObject(text, where);
  const localFolder = workspaceSubdir ? `${repoPath}/${workspaceSubdir}` : repoPath;
  const { config, workspaceFolder } = substituteVariables(raw, localFolder, hostEnv, where);

  const issues: ConfigIssue[] = [];
  const configDir = dirname(file);
  const checked = checkShape(config, issues);
  const warnings = neverApplied(config, "devcontainer.json");
  if ("dockerComposeFile" in config) {
    issues.push({
      path: "dockerComposeFile",
      message: "Docker Compose devcontainers are not supported: use image or build",
    });
  }
  const source = imageSource(config, configDir, issues);
  const { localFeatures, remoteFeatures } = featureSources(config, configDir, issues);
  if (workspaceFolderProblem(workspaceFolder)) {
    issues.push({ path: "workspaceFolder", message: workspaceFolderProblem(workspaceFolder)! });
  }
  if (issues.length > 0) throw new ConfigError(where, issues);
  await checkCommittedFiles(repoPath, base, source, localFeatures, where);

  return {
    repoPath,
    base,
    file,
    workspaceSubdir,
    workspaceFolder,
    source,
    localFeatures,
    remoteFeatures,
    buildConfig: buildConfigOf(config),
    entry: checked,
    warnings,
  };
}

/**
 * sandbox.devcontainer.workspace_folder as a path relative to the repository's root ("" for the
 * root itself), which must be a directory at `base`.
 */
async function workspaceSubdirOf(
  repoPath: string,
  base: string,
  workspaceFolder: string | undefined,
): Promise<string> {
  const workspaceSubdir = repoRelative(
    "",
    workspaceFolder ?? ".",
    "sandbox.devcontainer.workspace_folder",
  );
  if (workspaceSubdir && (await treeEntry(repoPath, base, workspaceSubdir))?.type !== "tree") {
    throw new SandboxError(
      "usage",
      `Workspace folder "${workspaceSubdir}" is not a directory of "${repoPath}" at ${
        base.slice(0, 12)
      }`,
      {
        detail:
          "sandbox.devcontainer.workspace_folder names a folder of the repository, relative to its root",
      },
    );
  }
  return workspaceSubdir;
}

/** The file's JSONC (comments and trailing commas allowed) as an object; `ConfigError` otherwise. */
function parseJsoncObject(text: string, where: string): Record<string, unknown> {
  const errors: ParseError[] = [];
  const doc = parse(text, errors, { allowTrailingComma: true, disallowComments: false });
  if (errors.length > 0) {
    throw new ConfigError(
      where,
      errors.map((e) => ({
        path: "",
        message: `JSONC syntax at ${position(text, e.offset)}: ${printParseErrorCode(e.error)}`,
      })),
    );
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    throw new ConfigError(where, [{ path: "", message: "expected an object" }]);
  }
  return doc as Record<string, unknown>;
}

/**
 * The configuration with its `${...}` variables replaced. The container's workspace folder is
 * resolved first (it may use the local variables only), since every other value may name it.
 */
function substituteVariables(
  raw: Record<string, unknown>,
  localFolder: string,
  hostEnv: (name: string) => string | undefined,
  where: string,
): { config: Record<string, unknown>; workspaceFolder: string } {
  const issues: ConfigIssue[] = [];
  const vars = {
    localWorkspaceFolder: localFolder,
    localWorkspaceFolderBasename: basename(localFolder),
  };
  const local = (value: unknown, path: string) =>
    substituteLocal(value, vars, hostEnv, issues, path);
  const workspaceFolder = normalizeAbsolute(
    typeof raw.workspaceFolder === "string"
      ? local(raw.workspaceFolder, "workspaceFolder") as string
      : `/workspaces/${vars.localWorkspaceFolderBasename}`,
  );
  const allVars = {
    ...vars,
    containerWorkspaceFolder: workspaceFolder,
    containerWorkspaceFolderBasename: basename(workspaceFolder),
  };
  const config = substituteLocal(raw, allVars, hostEnv, issues, "") as Record<string, unknown>;
  if (issues.length > 0) throw new ConfigError(where, issues);
  return { config, workspaceFolder };
}

/** The configuration file: the profile's, else the first candidate the commit has. */
async function findConfigFile(
  repoPath: string,
  base: string,
  subdir: string,
  explicit?: string,
): Promise<string> {
  if (explicit) {
    const file = repoRelative("", explicit, "sandbox.devcontainer.config");
    const entry = await treeEntry(repoPath, base, file);
    if (entry?.type !== "blob" || entry.mode === "120000") {
      throw new SandboxError(
        "usage",
        `No devcontainer configuration "${file}" in "${repoPath}" at ${base.slice(0, 12)}`,
        {
          detail:
            "sandbox.devcontainer.config names a committed file, relative to the repository's root (uncommitted files are not used)",
        },
      );
    }
    return file;
  }
  const tried: string[] = [];
  for (const candidate of CONFIG_CANDIDATES) {
    const file = subdir ? `${subdir}/${candidate}` : candidate;
    tried.push(file);
    const entry = await treeEntry(repoPath, base, file);
    if (entry?.type === "blob" && entry.mode !== "120000") return file;
  }
  throw new SandboxError(
    "usage",
    `No devcontainer configuration in "${repoPath}" at ${base.slice(0, 12)}`,
    {
      detail: `Looked for ${
        tried.join(" and ")
      } in the committed tree (uncommitted files are not used). Commit one, or set sandbox.devcontainer.config`,
    },
  );
}

/** Type checks of the keys the sandbox uses; returns the run-time metadata entry. */
function checkShape(config: Record<string, unknown>, issues: ConfigIssue[]): MetadataEntry {
  const entry: MetadataEntry = {};
  for (const key of ["remoteUser", "containerUser"] as const) {
    if (config[key] === undefined) continue;
    if (
      typeof config[key] !== "string" ||
      !/^[A-Za-z0-9_][A-Za-z0-9_.-]*$|^\d+$/.test(config[key] as string)
    ) {
      issues.push({ path: key, message: "expected a user name" });
    } else entry[key] = config[key] as string;
  }
  for (const key of ["containerEnv", "remoteEnv"] as const) {
    const value = config[key];
    if (value === undefined) continue;
    if (!isRecord(value)) {
      issues.push({ path: key, message: "expected an object of variable names to strings" });
      continue;
    }
    for (const [name, v] of Object.entries(value)) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
        issues.push({ path: `${key}.${name}`, message: "expected an environment variable name" });
      } else if (typeof v !== "string" && !(key === "remoteEnv" && v === null)) {
        issues.push({ path: `${key}.${name}`, message: "expected a string" });
      }
    }
    entry[key] = value as Record<string, string>;
  }
  for (const hook of LIFECYCLE_HOOKS) {
    const value = config[hook];
    if (value === undefined) continue;
    const problem = lifecycleProblem(value);
    if (problem) issues.push({ path: hook, message: problem });
    else entry[hook] = value as LifecycleCommand;
  }
  if (config.workspaceFolder !== undefined && typeof config.workspaceFolder !== "string") {
    issues.push({ path: "workspaceFolder", message: "expected an absolute path" });
  }
  if (
    config.overrideFeatureInstallOrder !== undefined &&
    !isStringArray(config.overrideFeatureInstallOrder)
  ) {
    issues.push({ path: "overrideFeatureInstallOrder", message: "expected a list of feature ids" });
  }
  return entry;
}

/** Why a lifecycle command is malformed, or undefined when it is fine. */
export function lifecycleProblem(value: unknown): string | undefined {
  const single = (v: unknown) =>
    (typeof v === "string" && v.trim() !== "") || (isStringArray(v) && v.length > 0 && v[0] !== "");
  if (single(value)) return undefined;
  if (isRecord(value) && Object.values(value).every(single)) return undefined;
  return "expected a command string, a list of arguments, or an object of named commands";
}

function imageSource(
  config: Record<string, unknown>,
  configDir: string,
  issues: ConfigIssue[],
): ImageSource {
  const build = config.build ??
    (config.dockerFile !== undefined
      ? { dockerfile: config.dockerFile, context: config.context }
      : undefined);
  if (build !== undefined) {
    if (!isRecord(build) || typeof build.dockerfile !== "string" || build.dockerfile === "") {
      issues.push({
        path: "build.dockerfile",
        message: "expected the path of a Dockerfile, relative to devcontainer.json",
      });
      return { kind: "image", image: "" };
    }
    const args = build.args ?? {};
    if (!isRecord(args) || !Object.values(args).every((v) => typeof v === "string")) {
      issues.push({
        path: "build.args",
        message: "expected an object of build argument names to strings",
      });
    }
    if (build.target !== undefined && typeof build.target !== "string") {
      issues.push({ path: "build.target", message: "expected a stage name" });
    }
    if (build.context !== undefined && typeof build.context !== "string") {
      issues.push({
        path: "build.context",
        message: "expected a folder, relative to devcontainer.json",
      });
    }
    const dockerfile = safeRepoRelative(configDir, build.dockerfile, "build.dockerfile", issues);
    const context = safeRepoRelative(
      configDir,
      typeof build.context === "string" ? build.context : ".",
      "build.context",
      issues,
    );
    return {
      kind: "build",
      dockerfile,
      context,
      args: isRecord(args) ? args as Record<string, string> : {},
      target: typeof build.target === "string" ? build.target : undefined,
    };
  }
  if (typeof config.image === "string" && config.image.trim() !== "") {
    return { kind: "image", image: config.image };
  }
  issues.push({ path: "", message: 'expected "image" or "build" (with "dockerfile")' });
  return { kind: "image", image: "" };
}

function featureSources(config: Record<string, unknown>, configDir: string, issues: ConfigIssue[]) {
  const localFeatures: string[] = [];
  const remoteFeatures: string[] = [];
  if (config.features === undefined) return { localFeatures, remoteFeatures };
  if (!isRecord(config.features)) {
    issues.push({ path: "features", message: "expected an object of feature ids to options" });
    return { localFeatures, remoteFeatures };
  }
  for (const [id, options] of Object.entries(config.features)) {
    if (!(isRecord(options) || typeof options === "string" || typeof options === "boolean")) {
      issues.push({
        path: `features.${id}`,
        message: "expected an object of options, a version string or true",
      });
    }
    if (id.startsWith("./") || id.startsWith("../")) {
      localFeatures.push(safeRepoRelative(configDir, id, `features.${id}`, issues));
    } else remoteFeatures.push(id);
  }
  return { localFeatures, remoteFeatures };
}

/** What the image build receives: nothing that runs or mounts anything, only what builds. */
function buildConfigOf(config: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const build = config.build ??
    (config.dockerFile !== undefined
      ? { dockerfile: config.dockerFile, context: config.context }
      : undefined);
  if (isRecord(build)) {
    out.build = Object.fromEntries(
      Object.entries(build).filter(([key]) =>
        ["dockerfile", "context", "args", "target"].includes(key)
      ),
    );
  } else out.image = config.image;
  for (const key of ["features", "overrideFeatureInstallOrder", "remoteUser", "containerUser"]) {
    if (config[key] !== undefined) out[key] = config[key];
  }
  return out;
}

/** One warning per key that is never applied, from the configuration or a metadata entry named `source`. */
export function neverApplied(entry: Record<string, unknown>, source: string): string[] {
  const warnings: string[] = [];
  for (const [key, reason] of Object.entries(NEVER_APPLIED)) {
    const value = entry[key];
    if (value === undefined || value === false || (Array.isArray(value) && value.length === 0)) {
      continue;
    }
    if (key === "hostRequirements" && !isRecord(value)) continue;
    warnings.push(`${source}: "${key}"${notable(value)} is ignored: ${reason}`);
  }
  if (entry.init === false) {
    warnings.push(
      `${source}: "init": false is ignored: the sandbox always runs under Docker's init`,
    );
  }
  if (isRecord(entry.build)) {
    for (const [key, reason] of Object.entries(BUILD_NEVER_APPLIED)) {
      const value = entry.build[key];
      if (value === undefined || (Array.isArray(value) && value.length === 0)) continue;
      warnings.push(`${source}: "build.${key}"${notable(value)} is ignored: ${reason}`);
    }
  }
  return warnings;
}

/** The dangerous values of a list, shown in the warning: ` (--network=host, /var/run/docker.sock…)`. */
function notable(value: unknown): string {
  if (!Array.isArray(value)) return "";
  const shown = value.map((v) => typeof v === "string" ? v : JSON.stringify(v)).filter((v) =>
    NOTABLE.test(v)
  );
  return shown.length > 0
    ? ` (${shown.slice(0, 4).join(", ")}${shown.length > 4 ? ", …" : ""})`
    : "";
}

/**
 * Substitute `${localEnv:NAME}`, `${localEnv:NAME:default}` and the workspace variables in every
 * string. `${containerEnv:…}` and unknown variables stay as written (the spec leaves them too).
 */
function substituteLocal(
  value: unknown,
  vars: Record<string, string>,
  hostEnv: (name: string) => string | undefined,
  issues: ConfigIssue[],
  path: string,
): unknown {
  if (typeof value === "string") {
    return value.replace(
      /\$\{([A-Za-z]+)(?::([^}:]*))?(?::([^}]*))?\}/g,
      (match, kind, name, fallback) => {
        if (kind === "localEnv" || kind === "env") {
          if (!name) return match;
          if (isSecretName(name)) {
            issues.push({
              path,
              message:
                `\${localEnv:${name}} names a secret; secrets never enter the sandbox (the credential proxy attaches keys on the host)`,
            });
            return "";
          }
          return hostEnv(name) ?? fallback ?? "";
        }
        if (name === undefined && kind in vars) return vars[kind];
        return match;
      },
    );
  }
  if (Array.isArray(value)) {
    return value.map((v, i) => substituteLocal(v, vars, hostEnv, issues, `${path}[${i}]`));
  }
  if (isRecord(value)) {
    return Object.fromEntries(
      Object.entries(value).map((
        [k, v],
      ) => [k, substituteLocal(v, vars, hostEnv, issues, path ? `${path}.${k}` : k)]),
    );
  }
  return value;
}

/** Substitute `${containerEnv:NAME}` and `${containerEnv:NAME:default}` from the container's environment. */
export function substituteContainerEnv<T>(value: T, env: Record<string, string>): T {
  if (typeof value === "string") {
    return value.replace(
      /\$\{containerEnv:([^}:]+)(?::([^}]*))?\}/g,
      (_m, name, fallback) => env[name] ?? fallback ?? "",
    ) as T;
  }
  if (Array.isArray(value)) return value.map((v) => substituteContainerEnv(v, env)) as T;
  if (isRecord(value)) {
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [k, substituteContainerEnv(v, env)]),
    ) as T;
  }
  return value;
}

/** Where the workspace may not appear: system folders, and the sandbox's own. */
function workspaceFolderProblem(folder: string): string | undefined {
  if (!folder.startsWith("/")) return "expected an absolute path";
  const reserved = [
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/home",
    "/workspace",
    "/opt/sandbox",
    "/home/sandbox",
  ];
  if (reserved.includes(folder)) {
    return `"${folder}" is a system folder: use a folder of its own, like /workspaces/name`;
  }
  const inside = [
    "/proc/",
    "/sys/",
    "/dev/",
    "/tmp/",
    "/workspace/",
    "/home/sandbox/",
    "/opt/sandbox/",
    "/usr/",
    "/etc/",
    "/bin/",
    "/sbin/",
    "/lib/",
    "/lib64/",
  ];
  if (inside.some((prefix) => folder.startsWith(prefix))) {
    return `"${folder}" is inside a folder the sandbox or the system owns: use one like /workspaces/name`;
  }
  return undefined;
}

/** The committed files the build reads must be what they claim: no symlink can point the host at its own files. */
async function checkCommittedFiles(
  repoPath: string,
  base: string,
  source: ImageSource,
  features: string[],
  where: string,
): Promise<void> {
  const issues: ConfigIssue[] = [];
  if (source.kind === "build") {
    const dockerfile = await treeEntry(repoPath, base, source.dockerfile);
    if (dockerfile?.type !== "blob") {
      issues.push({
        path: "build.dockerfile",
        message: `"${source.dockerfile}" is not a committed file`,
      });
    } else if (dockerfile.mode === "120000") {
      issues.push({
        path: "build.dockerfile",
        message: `"${source.dockerfile}" is a symbolic link; name the file itself`,
      });
    }
    const context = source.context
      ? await treeEntry(repoPath, base, source.context)
      : { type: "tree" };
    if (context?.type !== "tree") {
      issues.push({
        path: "build.context",
        message: `"${source.context}" is not a committed folder`,
      });
    }
  }
  for (const feature of features) {
    const entry = await treeEntry(repoPath, base, feature);
    if (entry?.type !== "tree") {
      issues.push({
        path: "features",
        message: `local feature "${feature}" is not a committed folder`,
      });
      continue;
    }
    const files = await git(
      repoPath,
      ["ls-tree", "-r", "-z", base, "--", `${feature}/`],
      `list feature ${feature}`,
    );
    const names = new Set<string>();
    for (const line of files.split("\0").filter(Boolean)) {
      const [meta, name] = line.split("\t");
      names.add(name.slice(feature.length + 1));
      if (meta.startsWith("120000")) {
        issues.push({
          path: "features",
          message:
            `local feature "${feature}" holds a symbolic link ("${name}"): features are copied on the host, so links are refused`,
        });
      }
    }
    for (const required of ["devcontainer-feature.json", "install.sh"]) {
      if (!names.has(required)) {
        issues.push({ path: "features", message: `local feature "${feature}" has no ${required}` });
      }
    }
  }
  if (issues.length > 0) throw new ConfigError(where, issues);
}

interface TreeEntry {
  mode: string;
  type: string;
  oid: string;
}

/** The entry `path` in commit `base`, or undefined when it has none. */
export async function treeEntry(
  repoPath: string,
  base: string,
  path: string,
): Promise<TreeEntry | undefined> {
  if (path === "") {
    const oid = (await git(repoPath, ["rev-parse", `${base}^{tree}`], "read the commit's tree"))
      .trim();
    return { mode: "040000", type: "tree", oid };
  }
  const out = await git(
    repoPath,
    ["ls-tree", "-z", "--full-tree", base, "--", path],
    `look up ${path}`,
  );
  const line = out.split("\0").find((l) => l.endsWith(`\t${path}`));
  if (!line) return undefined;
  const [mode, type, oid] = line.split("\t")[0].split(" ");
  return { mode, type, oid };
}

async function git(repoPath: string, args: string[], what: string): Promise<string> {
  const result = await run(["git", "-C", repoPath, ...args], { env: { GIT_TERMINAL_PROMPT: "0" } });
  if (result.exitCode !== 0) {
    throw new SandboxError(
      "exec_failed",
      `Cannot ${what} in "${repoPath}": ${result.stderr.trim().split("\n")[0]}`,
    );
  }
  return result.stdout;
}

/** `rel` resolved against the repository folder `dir`; throws a usage error when it leaves the repository. */
function repoRelative(dir: string, rel: string, what: string): string {
  const resolved = normalizeRelative(dir, rel);
  if (resolved === undefined) {
    throw new SandboxError("usage", `Invalid ${what} "${rel}": it must stay inside the repository`);
  }
  return resolved;
}

function safeRepoRelative(dir: string, rel: string, path: string, issues: ConfigIssue[]): string {
  const resolved = normalizeRelative(dir, rel);
  if (resolved === undefined) {
    issues.push({
      path,
      message: `"${rel}" leaves the repository; only its own committed files can be used`,
    });
    return "";
  }
  return resolved;
}

/** `dir/rel`, normalised, relative to the repository root ("" for the root); undefined outside it. */
export function normalizeRelative(dir: string, rel: string): string | undefined {
  if (rel.startsWith("/")) return undefined;
  const parts: string[] = [];
  for (const part of `${dir}/${rel}`.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (parts.length === 0) return undefined;
      parts.pop();
    } else parts.push(part);
  }
  return parts.join("/");
}

function normalizeAbsolute(path: string): string {
  if (!path.startsWith("/")) return path;
  return "/" + (normalizeRelative("", path.slice(1)) ?? "");
}

function dirname(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash === -1 ? "" : path.slice(0, slash);
}

function basename(path: string): string {
  return path.replace(/\/+$/, "").split("/").pop() ?? "";
}

function position(text: string, offset: number): string {
  const before = text.slice(0, offset).split("\n");
  return `line ${before.length}, column ${before.at(-1)!.length + 1}`;
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function isStringArray(value: unknown): value is string[] {
  return Array.isArray(value) && value.every((v) => typeof v === "string");
}
