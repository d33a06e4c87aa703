/**
 * Profiles: finding, parsing, interpolating and validating the configuration file.
 *
 * Validation happens once, here, at the boundary; everything downstream receives a typed,
 * defaulted `Profile`. An explicitly named file that fails is an error, never a fallback.
 */
import { z } from "zod";
import YAML from "yaml";
import { type ConfigIssue, ConfigError, SandboxError } from "./errors.ts";
import { parseDuration, parseSize } from "./units.ts";

/** File names looked for in the current directory and the repository root, in order. */
export const CONFIG_FILE_NAMES = ["sandbox.yaml", "sandbox.yml", ".sandbox.yaml"] as const;
export const DEFAULT_PROFILE = "default";
/** The base image built locally from Debian packages when it cannot be pulled. */
export const DEFAULT_BASE_IMAGE = "sandbox-base:bookworm";

/**
 * Environment variable names that never enter a sandbox, whatever the configuration says.
 * Keys reach upstreams through the host-side credential proxy instead.
 */
const SECRET_NAME = /(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|AUTH|COOKIE|SESSION|DSN|DATABASE_URL)/i;
const SECRET_NAMES_EXACT = new Set(["SSH_AUTH_SOCK", "DOCKER_HOST", "KUBECONFIG", "NETRC"]);

/** True when a variable name looks like it carries a secret. */
export function isSecretName(name: string): boolean {
  return SECRET_NAME.test(name) || SECRET_NAMES_EXACT.has(name.toUpperCase());
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const PROFILE_NAME = /^[a-z0-9][a-z0-9_.-]{0,62}$/;
/** `example.com`, `*.example.com`, either with an optional `:port`. */
const DOMAIN_PATTERN = /^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(:\d{1,5})?$/i;

const size = (example: string) =>
  z.string({ invalid_type_error: `expected a size like "${example}"` }).refine(
    (v) => (parseSize(v) ?? 0) > 0,
    { message: `expected a size like "${example}"` },
  );

const duration = z.string({ invalid_type_error: 'expected a duration like "30m"' }).refine(
  (v) => (parseDuration(v) ?? 0) > 0,
  { message: 'expected a duration like "30m", "90s" or "1h"' },
);

const envName = z.string().regex(ENV_NAME, { message: "expected an environment variable name" });

const noSecret = (name: string) => !isSecretName(name);
const SECRET_MESSAGE =
  "looks like a secret; secrets never enter the sandbox (the credential proxy attaches keys on the host)";

const NetworkSchema = z.object({
  mode: z.enum(["none", "allowlist", "full"]).default("allowlist"),
  allow: z.array(
    z.string().regex(DOMAIN_PATTERN, {
      message: 'expected a domain like "example.com", "*.example.com" or "example.com:8443"',
    }).refine((v) => {
      const port = v.split(":")[1];
      return port === undefined || (Number(port) >= 1 && Number(port) <= 65535);
    }, { message: "port must be between 1 and 65535" }),
  ).default([
    "registry.npmjs.org",
    "pypi.org",
    "files.pythonhosted.org",
    "github.com",
    "codeload.github.com",
    "deb.debian.org",
  ]),
  /** Static name → IP map the egress proxy consults before DNS (like /etc/hosts). */
  hosts: z.record(
    z.string().regex(DOMAIN_PATTERN, { message: "expected a host name" }),
    z.string().regex(/^((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)$|^[0-9a-f]*:[0-9a-f:.]*$/i, { message: "expected an IP address" }),
  ).default({}),
}).strict();

const ResourcesSchema = z.object({
  memory: size("4g").default("4g"),
  cpus: z.number({ invalid_type_error: "expected a number of CPUs like 2 or 0.5" }).positive()
    .max(256).optional(),
  pids: z.number({ invalid_type_error: "expected a whole number of processes like 512" }).int()
    .min(16).max(1_000_000).default(512),
  disk: size("10g").default("10g"),
  timeout: duration.default("30m"),
}).strict();

const EnvironmentSchema = z.object({
  passthrough: z.array(envName.refine(noSecret, { message: SECRET_MESSAGE })).default([]),
  set: z.record(z.string(), z.union([z.string(), z.number(), z.boolean()]).transform(String))
    .superRefine((record, ctx) => {
      for (const name of Object.keys(record)) {
        if (!ENV_NAME.test(name)) {
          ctx.addIssue({ code: "custom", path: [name], message: "expected an environment variable name" });
        } else if (isSecretName(name)) {
          ctx.addIssue({ code: "custom", path: [name], message: SECRET_MESSAGE });
        }
      }
    }).default({}),
}).strict();

const SandboxSchema = z.object({
  mode: z.enum(["none", "container", "devcontainer"]).default("container"),
  /** The base image the sandbox image is layered on. */
  image: z.string().min(1).default(DEFAULT_BASE_IMAGE),
  /** `shared`: runs share the profile's long-lived container; `fresh`: one container per run. */
  container: z.enum(["shared", "fresh"]).default("shared"),
  network: NetworkSchema.default({}),
  resources: ResourcesSchema.default({}),
  environment: EnvironmentSchema.default({}),
}).strict();

const KeySourceSchema = z.union([
  z.object({ env: envName }).strict(),
  z.object({ command: z.array(z.string().min(1)).min(1, { message: "expected a command as a list of arguments" }) }).strict(),
], { errorMap: () => ({ message: 'expected {env: NAME} or {command: [program, args...]}' }) });

const LlmSchema = z.object({
  /** A built-in provider, or `custom` with `base_url`, `api` and `key`. */
  provider: z.enum(["openai", "anthropic", "openrouter", "custom"]).default("openai"),
  model: z.string().min(1).optional(),
  /** Only for `custom`: built-in providers' keys never go anywhere but their own endpoint. */
  base_url: z.string().url({ message: 'expected a URL like "https://llm.example.com/v1"' }).optional(),
  /** The wire format of a `custom` provider. */
  api: z.enum(["openai", "anthropic"]).optional(),
  key: KeySourceSchema.optional(),
  max_request_body: size("10m").default("10m"),
}).strict().superRefine((llm, ctx) => {
  if (llm.provider === "custom") {
    if (!llm.base_url) ctx.addIssue({ code: "custom", path: ["base_url"], message: "required for provider custom" });
    if (!llm.key) {
      ctx.addIssue({ code: "custom", path: ["key"], message: "required for provider custom: name the key source explicitly" });
    }
  } else if (llm.base_url) {
    ctx.addIssue({
      code: "custom",
      path: ["base_url"],
      message: `only provider custom takes a base_url (a ${llm.provider} key is sent only to ${llm.provider})`,
    });
  }
});

const GitSchema = z.object({
  /** Token for remote repositories (sent as x-access-token); default: `git credential fill`. */
  token: KeySourceSchema.optional(),
}).strict();

const ProfileSchema = z.object({
  description: z.string().optional(),
  llm: LlmSchema.default({}),
  git: GitSchema.default({}),
  sandbox: SandboxSchema.default({}),
}).strict();

const ConfigSchema = z.object({
  default_profile: z.string().regex(PROFILE_NAME, { message: "expected a profile name" }).optional(),
  profiles: z.record(z.string(), ProfileSchema).superRefine((profiles, ctx) => {
    for (const name of Object.keys(profiles)) {
      if (!PROFILE_NAME.test(name)) {
        ctx.addIssue({
          code: "custom",
          path: [name],
          message: "profile names are lowercase letters, digits, '.', '_' and '-' (at most 63)",
        });
      }
    }
  }).default({}),
}).strict();

export type Config = z.infer<typeof ConfigSchema>;
export type ProfileConfig = z.infer<typeof ProfileSchema>;
export type SandboxConfig = z.infer<typeof SandboxSchema>;
export type NetworkMode = SandboxConfig["network"]["mode"];
export type LlmConfig = ProfileConfig["llm"];

/** A profile with its name, ready for the engine: units parsed, defaults applied. */
export interface Profile {
  name: string;
  description?: string;
  llm: LlmConfig;
  git: ProfileConfig["git"];
  sandbox: SandboxConfig;
  resources: {
    memoryBytes: number;
    cpus: number;
    pids: number;
    diskBytes: number;
    timeoutMs: number;
  };
}

export type ConfigLoadResult =
  | { kind: "ok"; config: Config; file: string | undefined }
  | { kind: "invalid"; file: string | undefined; issues: ConfigIssue[] };

/** Format a zod path as `profiles.work.sandbox.allow[0]`. */
function formatPath(path: readonly (string | number)[]): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out ? `.${part}` : part;
  }
  return out;
}

function issuesFromZod(error: z.ZodError): ConfigIssue[] {
  return error.issues.map((issue) => {
    const path = formatPath(issue.path);
    if (issue.code === "unrecognized_keys") {
      const keys = issue.keys.map((k) => `"${k}"`).join(", ");
      return { path, message: `unknown key${issue.keys.length > 1 ? "s" : ""} ${keys}` };
    }
    if (issue.code === "invalid_enum_value") {
      return {
        path,
        message: `expected one of ${issue.options.map((o) => `"${String(o)}"`).join(", ")}`,
      };
    }
    return { path, message: issue.message };
  });
}

/**
 * Replace `${VAR}` and `${VAR:-fallback}` in every string of a parsed document. `$${` is a literal
 * `${`. A reference to an unset variable without a fallback is an issue at that value's path.
 */
export function interpolate(
  value: unknown,
  env: (name: string) => string | undefined,
  issues: ConfigIssue[],
  path: (string | number)[] = [],
): unknown {
  if (typeof value === "string") {
    return value.replace(
      /\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g,
      (match, escaped, name, fallback) => {
        if (escaped) return match.slice(1);
        const found = env(name);
        if (found !== undefined && found !== "") return found;
        if (fallback !== undefined) return fallback;
        issues.push({
          path: formatPath(path),
          message: `environment variable "${name}" is not set (use \${${name}:-default} for a fallback)`,
        });
        return "";
      },
    );
  }
  if (Array.isArray(value)) return value.map((v, i) => interpolate(v, env, issues, [...path, i]));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [k, interpolate(v, env, issues, [...path, k])]),
    );
  }
  return value;
}

/** Validate configuration text. `file` is only used in messages. */
export function parseConfig(
  text: string,
  file?: string,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): ConfigLoadResult {
  const doc = YAML.parseDocument(text, { prettyErrors: true });
  if (doc.errors.length > 0) {
    return {
      kind: "invalid",
      file,
      issues: doc.errors.map((e) => ({ path: "", message: `YAML syntax: ${e.message}` })),
    };
  }
  const issues: ConfigIssue[] = [];
  const raw = interpolate(doc.toJS() ?? {}, env, issues);
  if (issues.length > 0) return { kind: "invalid", file, issues };
  const parsed = ConfigSchema.safeParse(raw);
  if (!parsed.success) return { kind: "invalid", file, issues: issuesFromZod(parsed.error) };
  const config = parsed.data;
  if (config.default_profile && config.default_profile !== DEFAULT_PROFILE &&
    !(config.default_profile in config.profiles)) {
    return {
      kind: "invalid",
      file,
      issues: [{ path: "default_profile", message: `no profile named "${config.default_profile}"` }],
    };
  }
  return { kind: "ok", config, file };
}

export interface FindConfigOptions {
  /** An explicitly named file (`--config`); when given, nothing else is searched. */
  explicit?: string;
  cwd?: string;
}

/**
 * Where the configuration comes from: `--config`, else `$SANDBOX_CONFIG`, else a
 * `sandbox.yaml` in the current directory or the repository root, else the user config
 * directory. `undefined` means none was found and the built-in defaults apply.
 */
export async function findConfigFile(options: FindConfigOptions = {}): Promise<string | undefined> {
  const explicit = options.explicit ?? Deno.env.get("SANDBOX_CONFIG");
  if (explicit) return explicit;
  const cwd = options.cwd ?? Deno.cwd();
  const candidates = CONFIG_FILE_NAMES.map((name) => joinPath(cwd, name));
  const root = await findRepoRoot(cwd);
  if (root && root !== cwd) candidates.push(...CONFIG_FILE_NAMES.map((name) => joinPath(root, name)));
  candidates.push(joinPath(userConfigDir(), "sandbox", "config.yaml"));
  for (const candidate of candidates) {
    if (await isFile(candidate)) return candidate;
  }
  return undefined;
}

/** Load and validate the configuration; errors for an unreadable explicit file. */
export async function loadConfig(options: FindConfigOptions = {}): Promise<ConfigLoadResult> {
  const file = await findConfigFile(options);
  if (file === undefined) return parseConfig("profiles: {}", undefined);
  let text: string;
  try {
    text = await Deno.readTextFile(file);
  } catch (error) {
    const reason = error instanceof Deno.errors.NotFound ? "file not found" : String((error as Error).message);
    return { kind: "invalid", file, issues: [{ path: "", message: `cannot read: ${reason}` }] };
  }
  const result = parseConfig(text, file);
  const named = options.explicit ?? Deno.env.get("SANDBOX_CONFIG");
  const trusted = named !== undefined || file.startsWith(`${userConfigDir()}/`);
  return trusted ? result : rejectHostCommands(result);
}

/**
 * A configuration found in the working directory or repository comes with the code, and may be
 * hostile: it may not make the host run commands (key sources of kind `command`). Such sources are
 * honoured only from the user's own configuration or a file named with --config.
 */
function rejectHostCommands(result: ConfigLoadResult): ConfigLoadResult {
  if (result.kind !== "ok") return result;
  const issues = Object.entries(result.config.profiles)
    .flatMap(([name, profile]) => [
      ...(profile.llm.key && "command" in profile.llm.key ? [`profiles.${name}.llm.key.command`] : []),
      ...(profile.git.token && "command" in profile.git.token ? [`profiles.${name}.git.token.command`] : []),
    ])
    .map((path) => ({
      path,
      message: "a key command runs on the host, so it is only honoured from ~/.config/sandbox/config.yaml or a file named with --config, not from a project's sandbox.yaml",
    }));
  return issues.length > 0 ? { kind: "invalid", file: result.file, issues } : result;
}

/** Load, validate and throw `ConfigError` when invalid. */
export async function loadConfigOrThrow(options: FindConfigOptions = {}): Promise<{ config: Config; file?: string }> {
  const result = await loadConfig(options);
  if (result.kind === "invalid") throw new ConfigError(result.file, result.issues);
  return result;
}

/** The profile to use: `name`, else `$SANDBOX_PROFILE`, else `default_profile`, else "default". */
export function resolveProfile(config: Config, name?: string): Profile {
  const chosen = name ?? Deno.env.get("SANDBOX_PROFILE") ?? config.default_profile ?? DEFAULT_PROFILE;
  let profile = config.profiles[chosen];
  if (!profile) {
    if (chosen !== DEFAULT_PROFILE) {
      const known = [DEFAULT_PROFILE, ...Object.keys(config.profiles).filter((p) => p !== DEFAULT_PROFILE)];
      throw new SandboxError("usage", `Unknown profile "${chosen}"`, {
        detail: `Defined profiles: ${known.join(", ")}`,
      });
    }
    profile = ProfileSchema.parse({});
  }
  const r = profile.sandbox.resources;
  return {
    name: chosen,
    description: profile.description,
    llm: profile.llm,
    git: profile.git,
    sandbox: profile.sandbox,
    resources: {
      memoryBytes: parseSize(r.memory)!,
      cpus: r.cpus ?? Math.min(2, navigator.hardwareConcurrency || 1),
      pids: r.pids,
      diskBytes: parseSize(r.disk)!,
      timeoutMs: parseDuration(r.timeout)!,
    },
  };
}

/** Every profile a configuration offers, including the implicit "default". */
export function profileNames(config: Config): string[] {
  const names = Object.keys(config.profiles);
  return names.includes(DEFAULT_PROFILE) ? names : [DEFAULT_PROFILE, ...names];
}

/** `$XDG_CONFIG_HOME`, else `~/.config`. */
export function userConfigDir(): string {
  return Deno.env.get("XDG_CONFIG_HOME") || joinPath(homeDir(), ".config");
}

/** `$XDG_STATE_HOME/sandbox`, else `~/.local/state/sandbox`: run logs and locks. */
export function userStateDir(): string {
  const base = Deno.env.get("XDG_STATE_HOME") || joinPath(homeDir(), ".local", "state");
  return joinPath(base, "sandbox");
}

function homeDir(): string {
  return Deno.env.get("HOME") ?? "/tmp";
}

function joinPath(...parts: string[]): string {
  return parts.join("/").replace(/\/+/g, "/");
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await Deno.stat(path)).isFile;
  } catch {
    return false;
  }
}

/** The nearest ancestor of `dir` that holds `.git`, found without spawning git. */
async function findRepoRoot(dir: string): Promise<string | undefined> {
  let current = dir;
  while (true) {
    try {
      await Deno.stat(joinPath(current, ".git"));
      return current;
    } catch {
      const parent = current.replace(/\/[^/]*$/, "") || "/";
      if (parent === current) return undefined;
      current = parent;
    }
  }
}
