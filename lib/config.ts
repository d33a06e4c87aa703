/**
 * Profiles: finding, parsing, interpolating and validating the configuration file.
 *
 * Validation happens once, here, at the boundary; everything downstream receives a typed,
 * defaulted `Profile`. An explicitly named file that fails is an error, never a fallback.
 */
import { z } from "zod";
import { AGENTS, DEFAULT_AGENT } from "./agents/packages.ts";
import { loadYaml, parseYamlDocument, yamlDeferred, type YamlDocument } from "./yaml.ts";
import { parsedDocument } from "./config_cache.ts";
import { ConfigError, type ConfigIssue, SandboxError } from "./errors.ts";
import { parseDuration, parseSize } from "./units.ts";
import { decodeUtf8, formatLimit, MAX_CONFIG_BYTES, readBounded } from "./input_file.ts";
import { joinPath, userConfigDir } from "./paths.ts";
import { findSecret, isSecretName, knownSecrets } from "./secret_guard.ts";
import { shellQuote, summarizeConfig } from "./config_summary.ts";
import { trustStateOf } from "./trust.ts";
import { refusedEnvReason, withoutRefusedEnv } from "./refused_env.ts";
import { parseAge } from "./run/retention.ts";

// `parseConfig()` is synchronous: YAML is ready when this module is, unless the CLI deferred it.
if (!yamlDeferred()) await loadYaml();

export { isSecretName } from "./secret_guard.ts";
export { userConfigDir, userStateDir } from "./paths.ts";

/** File names looked for in the current directory and the repository root, in order. */
export const CONFIG_FILE_NAMES = ["sandbox.yaml", "sandbox.yml", ".sandbox.yaml"] as const;
export const DEFAULT_PROFILE = "default";
/** The base image built locally from Debian packages when it cannot be pulled. */
export const DEFAULT_BASE_IMAGE = "sandbox-base:bookworm";

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const PROFILE_NAME = /^[a-z0-9][a-z0-9_.-]{0,62}$/;
/** `example.com`, `*.example.com`, either with an optional `:port`. */
const DOMAIN_PATTERN =
  /^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(:\d{1,5})?$/i;

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
    z.string().regex(
      /^((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)$|^[0-9a-f]*:[0-9a-f:.]*$/i,
      { message: "expected an IP address" },
    ),
  ).default({}),
}).strict();

const ResourcesSchema = z.object({
  memory: size("4g").default("4g"),
  cpus: z.number({ invalid_type_error: "expected a number of CPUs like 2 or 0.5" })
    .positive({ message: "expected a number of CPUs above 0, like 2 or 0.5" })
    .max(256, { message: "expected at most 256 CPUs" }).optional(),
  pids: z.number({ invalid_type_error: "expected a whole number of processes like 512" })
    .int({ message: "expected a whole number of processes like 512" })
    .min(16, { message: "expected at least 16 processes (the sandbox's own tools need them)" })
    .max(1_000_000, { message: "expected at most 1000000 processes" }).default(512),
  disk: size("10g").default("10g"),
  timeout: duration.default("30m"),
}).strict();

const EnvironmentSchema = z.object({
  passthrough: z.array(envName.refine(noSecret, { message: SECRET_MESSAGE })).default([]),
  set: z.record(z.string(), z.union([z.string(), z.number(), z.boolean()]).transform(String))
    .superRefine((record, ctx) => {
      for (const name of Object.keys(record)) {
        if (!ENV_NAME.test(name)) {
          ctx.addIssue({
            code: "custom",
            path: [name],
            message: "expected an environment variable name",
          });
        } else if (isSecretName(name)) {
          ctx.addIssue({ code: "custom", path: [name], message: SECRET_MESSAGE });
        }
      }
    }).default({}),
}).strict();

/** Mode devcontainer: where the repository's devcontainer.json is, and what it may ask for. */
const DevcontainerSchema = z.object({
  /** The devcontainer.json, relative to the repository (default: .devcontainer/devcontainer.json, then .devcontainer.json). */
  config: z.string().min(1).optional(),
  /** The folder of the repository the devcontainer belongs to and the agent works in (default: its root). */
  workspace_folder: z.string().min(1).optional(),
  /** Accept a devcontainer that asks for root; it still runs as the unprivileged sandbox user. */
  allow_root: z.boolean().default(false),
}).strict();

/** A DNS-1123 label: a Kubernetes namespace or runtime class name. */
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

/** Mode kubernetes: which cluster, where, and which image its pods run (docs/kubernetes.md). */
const KubernetesSchema = z.object({
  /** The kubeconfig context (default: its current context); ignored with `in_cluster`. */
  context: z.string().min(1).optional(),
  /** Use the service account of the pod `sandbox` itself runs in instead of a kubeconfig. */
  in_cluster: z.boolean().default(false),
  namespace: z.string().regex(DNS_LABEL, { message: "expected a namespace name (DNS-1123 label)" })
    .default("default"),
  /** The image reference the cluster pulls (`sandbox image push`); default: the local image's tag. */
  image: z.string().min(1).optional(),
  /** A RuntimeClass for the pods (gVisor `runsc`, Kata), when the cluster has one. */
  runtime_class_name: z.string().regex(DNS_LABEL, { message: "expected a RuntimeClass name" })
    .optional(),
  /** How long a pod may stay pending (scheduling, pulling its image) before the run fails. */
  start_timeout_s: z.number().int().min(1).max(3600).default(120),
  /**
   * The warm pool: agent-sandbox's `SandboxWarmPool` and `SandboxClaim` (`agent-sandbox`), the
   * tool's own labelled pods (`own`), or agent-sandbox when the cluster serves its resources
   * (`auto`).
   */
  pool: z.enum(["auto", "agent-sandbox", "own"]).default("auto"),
}).strict();

const SandboxSchema = z.object({
  mode: z.enum(["none", "container", "devcontainer", "kubernetes", "local"]).default("container"),
  devcontainer: DevcontainerSchema.default({}),
  kubernetes: KubernetesSchema.default({}),
  /** The base image the sandbox image is layered on. */
  image: z.string().min(1).default(DEFAULT_BASE_IMAGE),
  /**
   * How many fresh sandboxes the profile keeps started ahead (per agent and repository), each
   * claimed by exactly one run and destroyed after it (lib/sandbox/pool.ts); 0: every run starts
   * its own, cold.
   */
  pool: z.number().int().min(0).max(16).default(1),
  network: NetworkSchema.default({}),
  resources: ResourcesSchema.default({}),
  environment: EnvironmentSchema.default({}),
}).strict();

const KeySourceSchema = z.union([
  z.object({ env: envName }).strict(),
  z.object({
    command: z.array(z.string().min(1)).min(1, {
      message: "expected a command as a list of arguments",
    }),
  }).strict(),
], { errorMap: () => ({ message: "expected {env: NAME} or {command: [program, args...]}" }) });

const LlmSchema = z.object({
  /** A built-in provider, or `custom` with `base_url`, `api` and `key`. */
  provider: z.enum(["openai", "anthropic", "openrouter", "custom"]).default("openai"),
  model: z.string().min(1).optional(),
  /** Only for `custom`: built-in providers' keys never go anywhere but their own endpoint. */
  base_url: z.string().url({ message: 'expected a URL like "https://llm.example.com/v1"' })
    .optional(),
  /** The wire format of a `custom` provider. */
  api: z.enum(["openai", "anthropic"]).optional(),
  key: KeySourceSchema.optional(),
  max_request_body: size("10m").default("10m"),
  /** `allow`: the provider may reach the network or run code for the sandbox (server-side tools). */
  server_tools: z.enum(["deny", "allow"]).default("deny"),
  /** When set, the credential proxy refuses requests naming any other model. */
  models: z.array(z.string().min(1)).min(1, { message: "expected at least one model" }).optional(),
  /** The agent `run agentic` starts: the built-in worker, or an agent CLI from its own image layer. */
  agent: z.enum(AGENTS).default(DEFAULT_AGENT),
}).strict().superRefine((llm, ctx) => {
  if (llm.models && llm.model && !llm.models.includes(llm.model)) {
    ctx.addIssue({
      code: "custom",
      path: ["model"],
      message: `"${llm.model}" is not one of llm.models`,
    });
  }
  if (llm.provider === "custom") {
    if (!llm.base_url) {
      ctx.addIssue({ code: "custom", path: ["base_url"], message: "required for provider custom" });
    }
    if (!llm.key) {
      ctx.addIssue({
        code: "custom",
        path: ["key"],
        message: "required for provider custom: name the key source explicitly",
      });
    }
  } else if (llm.base_url) {
    ctx.addIssue({
      code: "custom",
      path: ["base_url"],
      message:
        `only provider custom takes a base_url (a ${llm.provider} key is sent only to ${llm.provider})`,
    });
  }
});

const GitSchema = z.object({
  /** Token for remote repositories (sent as x-access-token); default: `git credential fill`. */
  token: KeySourceSchema.optional(),
}).strict();

const wholeNumber = (example: string) =>
  z.number({ invalid_type_error: `expected a whole number like ${example}` })
    .int({ message: `expected a whole number like ${example}` })
    .positive({ message: `expected a whole number above 0, like ${example}` });

/** Limits on what a run may spend (lib/proxy/budget.ts); an absent one is no limit. */
const BudgetLimitsSchema = z.object({
  /** LLM input + output tokens, as the upstream reports them. */
  tokens: wholeNumber("2000000").optional(),
  /** Estimated USD, from the price table (lib/run/prices.ts). */
  cost_usd: z.number({ invalid_type_error: "expected an amount in USD like 5 or 0.5" })
    .positive({ message: "expected an amount in USD above 0, like 5 or 0.5" }).optional(),
  /** LLM calls. */
  requests: wholeNumber("200").optional(),
  /** Bytes through the egress proxy, both ways. */
  egress_bytes: size("1g").optional(),
  /** Requests through the egress proxy (each CONNECT, each plain HTTP request). */
  egress_requests: wholeNumber("1000").optional(),
}).strict();

const BudgetSchema = BudgetLimitsSchema.extend({
  /** The same limits for all the profile's runs of one UTC day, kept in the state store. */
  per_day: BudgetLimitsSchema.optional(),
}).strict();

const ProfileSchema = z.object({
  description: z.string().optional(),
  llm: LlmSchema.default({}),
  git: GitSchema.default({}),
  sandbox: SandboxSchema.default({}),
  budget: BudgetSchema.optional(),
}).strict();

/**
 * What happens to the user's run records (the state directory): `retention` prunes finished runs
 * at the end of each run, as `sandbox prune` does (lib/run/retention.ts). Absent: kept forever.
 */
const StateSchema = z.object({
  retention: z.object({
    /** Finished runs that ended longer ago than this go. */
    older_than: z.string({ invalid_type_error: 'expected an age like "30d"' }).refine(
      (v) => parseAge(v) !== undefined,
      { message: 'expected an age like "30d", "12h" or "2w"' },
    ).optional(),
    /** The newest this many finished runs stay, whatever their age. */
    keep: z.number({ invalid_type_error: "expected a whole number of runs like 100" })
      .int({ message: "expected a whole number of runs like 100" })
      .min(0, { message: "expected a whole number of runs like 100" }).optional(),
  }).strict().refine((r) => r.older_than !== undefined || r.keep !== undefined, {
    message: "expected older_than, keep or both",
  }).optional(),
}).strict();

const ConfigSchema = z.object({
  state: StateSchema.optional(),
  default_profile: z.string().regex(PROFILE_NAME, { message: "expected a profile name" })
    .optional(),
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
export type BudgetConfig = z.infer<typeof BudgetSchema>;

/** A profile with its name, ready for the engine: units parsed, defaults applied. */
export interface Profile {
  name: string;
  description?: string;
  llm: LlmConfig;
  git: ProfileConfig["git"];
  sandbox: SandboxConfig;
  /** What each run, and all runs of a day, may spend (`egress_bytes` still a size string). */
  budget?: BudgetConfig;
  /**
   * What of the profile is not applied, one line each: environment variables no configuration may
   * set in a sandbox (lib/refused_env.ts), named by their key.
   */
  warnings?: string[];
  resources: {
    memoryBytes: number;
    cpus: number;
    pids: number;
    diskBytes: number;
    timeoutMs: number;
  };
}

/** Where a configuration file came from; only `project` files need the user's trust. */
export type ConfigSource = "named" | "project" | "user";

/** A project file that was not used because the user has not trusted this content of it. */
export interface IgnoredConfig {
  file: string;
  /** `untrusted`: never trusted; `changed`: trusted once, with other content. */
  state: "untrusted" | "changed";
  /** What it would set, one line per section, safe to print on a terminal. */
  summary: string[];
  /** The command that trusts it, ready to paste. */
  trustCommand: string;
}

export type ConfigLoadResult =
  | {
    kind: "ok";
    config: Config;
    file: string | undefined;
    source?: ConfigSource;
    ignored?: IgnoredConfig[];
  }
  | {
    kind: "invalid";
    file: string | undefined;
    issues: ConfigIssue[];
    source?: ConfigSource;
    ignored?: IgnoredConfig[];
  };

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
          message:
            `environment variable "${name}" is not set (use \${${name}:-default} for a fallback)`,
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
  return checkDocument(parseYamlDocument(text), file, env);
}

/** Validate a parsed document (see `parseConfig`). */
function checkDocument(
  doc: YamlDocument,
  file?: string,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): ConfigLoadResult {
  if (doc.kind === "invalid") {
    return { kind: "invalid", file, issues: doc.errors.map((message) => ({ path: "", message })) };
  }
  const issues: ConfigIssue[] = [];
  const raw = interpolate(doc.value, env, issues);
  if (issues.length > 0) return { kind: "invalid", file, issues };
  const parsed = ConfigSchema.safeParse(raw);
  if (!parsed.success) return { kind: "invalid", file, issues: issuesFromZod(parsed.error) };
  const config = parsed.data;
  if (
    config.default_profile && config.default_profile !== DEFAULT_PROFILE &&
    !(config.default_profile in config.profiles)
  ) {
    return {
      kind: "invalid",
      file,
      issues: [{
        path: "default_profile",
        message: `no profile named "${config.default_profile}"`,
      }],
    };
  }
  return { kind: "ok", config, file };
}

export interface FindConfigOptions {
  /** An explicitly named file (`--config`); when given, nothing else is searched. */
  explicit?: string;
  cwd?: string;
  /** The trust store to consult (default: `trusted.json` in the user's state directory). */
  trustStore?: string;
}

/** The file named with `--config`, else `$SANDBOX_CONFIG`; empty values name nothing. */
export function namedConfigFile(options: FindConfigOptions = {}): string | undefined {
  return options.explicit || Deno.env.get("SANDBOX_CONFIG") || undefined;
}

/** The project files sandbox looks for: in `cwd`, then in its repository root. */
export async function projectConfigCandidates(cwd: string = Deno.cwd()): Promise<string[]> {
  const candidates = CONFIG_FILE_NAMES.map((name) => joinPath(cwd, name));
  const root = await findRepoRoot(cwd);
  if (root && root !== cwd) {
    candidates.push(...CONFIG_FILE_NAMES.map((name) => joinPath(root, name)));
  }
  return candidates;
}

/** The first project file that exists (trusted or not): what `sandbox trust` trusts by default. */
export async function findProjectConfigFile(cwd?: string): Promise<string | undefined> {
  for (const candidate of await projectConfigCandidates(cwd)) {
    if (await isFile(candidate)) return candidate;
  }
  return undefined;
}

type Selection =
  | {
    kind: "found";
    file: string;
    source: ConfigSource;
    bytes: Uint8Array;
    ignored: IgnoredConfig[];
  }
  | {
    kind: "unreadable";
    file: string;
    source: ConfigSource;
    reason: string;
    ignored: IgnoredConfig[];
  }
  | { kind: "none"; ignored: IgnoredConfig[] };

/**
 * A configuration file's bytes, at most `MAX_CONFIG_BYTES` of them (a named file may be a FIFO, a
 * device, anything): a file past the limit is unreadable, and never read whole.
 */
export async function readConfigBytes(
  file: string,
): Promise<{ kind: "ok"; bytes: Uint8Array } | { kind: "unreadable"; reason: string }> {
  const read = await readBounded(file, MAX_CONFIG_BYTES);
  if (read.kind === "too_large") {
    return {
      kind: "unreadable",
      reason: `larger than ${formatLimit(MAX_CONFIG_BYTES)}, the limit for a configuration file`,
    };
  }
  return read;
}

/**
 * Choose the configuration: `--config`, else `$SANDBOX_CONFIG`, else a project file (`sandbox.yaml`
 * in the current directory, then the repository root) whose content the user trusts, else the user
 * config directory. An untrusted or changed project file is skipped as if it were absent, and
 * reported in `ignored`. The file is read once: the bytes checked for trust are the bytes parsed.
 */
async function selectConfig(options: FindConfigOptions): Promise<Selection> {
  const named = namedConfigFile(options);
  if (named) {
    const read = await readConfigBytes(named);
    if (read.kind === "unreadable") {
      return { kind: "unreadable", file: named, source: "named", reason: read.reason, ignored: [] };
    }
    return { kind: "found", file: named, source: "named", bytes: read.bytes, ignored: [] };
  }
  const ignored: IgnoredConfig[] = [];
  const candidates: { file: string; source: ConfigSource }[] = [
    ...(await projectConfigCandidates(options.cwd)).map((file) => ({
      file,
      source: "project" as const,
    })),
    { file: joinPath(userConfigDir(), "sandbox", "config.yaml"), source: "user" },
  ];
  for (const { file, source } of candidates) {
    if (!await isFile(file)) continue;
    const read = await readConfigBytes(file);
    if (read.kind === "unreadable") {
      return { kind: "unreadable", file, source, reason: read.reason, ignored };
    }
    const { bytes } = read;
    if (source === "project") {
      const state = await trustStateOf(file, bytes, options.trustStore);
      if (state !== "trusted") {
        await loadYaml();
        ignored.push({
          file,
          state,
          summary: summarizeConfig(new TextDecoder().decode(bytes)),
          trustCommand: `sandbox trust ${shellQuote(file)}`,
        });
        continue;
      }
    }
    return { kind: "found", file, source, bytes, ignored };
  }
  return { kind: "none", ignored };
}

/**
 * The configuration file sandbox uses: `--config`, else `$SANDBOX_CONFIG`, else a trusted
 * `sandbox.yaml` in the current directory or the repository root, else the user config directory.
 * `undefined` means none applies and the built-in defaults do.
 */
export async function findConfigFile(options: FindConfigOptions = {}): Promise<string | undefined> {
  const selected = await selectConfig(options);
  return selected.kind === "none" ? undefined : selected.file;
}

/**
 * Load and validate the configuration (see `findConfigFile` for which). A named file that cannot be
 * read is invalid, never a fallback. Project files ignored for want of trust are in `ignored`.
 */
export async function loadConfig(options: FindConfigOptions = {}): Promise<ConfigLoadResult> {
  const selected = await selectConfig(options);
  const { ignored } = selected;
  if (selected.kind === "none") {
    return { ...checkDocument({ kind: "ok", value: { profiles: {} } }), ignored };
  }
  const { file, source } = selected;
  if (selected.kind === "unreadable") {
    return {
      kind: "invalid",
      file,
      source,
      issues: [{ path: "", message: `cannot read: ${selected.reason}` }],
      ignored,
    };
  }
  const decoded = decodeUtf8(selected.bytes);
  if (decoded.kind === "invalid") {
    return { kind: "invalid", file, source, issues: [notUtf8(decoded.offset)], ignored };
  }
  const { text } = decoded;
  return { ...validateConfigText(text, file, source, await parsedDocument(text)), source, ignored };
}

/** The issue of a configuration file that is not UTF-8 text. */
export function notUtf8(offset: number): ConfigIssue {
  return { path: "", message: `not UTF-8 text: invalid byte at offset ${offset}` };
}

/**
 * Every rule a configuration from `source` must pass: the schema, no secret in a value that enters
 * the sandbox, and for a project file no key command.
 */
export function validateConfigText(
  text: string,
  file: string | undefined,
  source: ConfigSource,
  /** `text` already parsed (e.g. from the parse cache). */
  parsed?: YamlDocument,
): ConfigLoadResult {
  let result = parsed ? checkDocument(parsed, file) : parseConfig(text, file);
  if (source === "project") result = rejectUserSettings(rejectHostCommands(result));
  return rejectSecretValues(result);
}

/**
 * A configuration found in the working directory or repository comes with the code, and may be
 * hostile: even once trusted, it may not make the host run commands (key sources of kind `command`).
 * Such sources are honoured only from the user's own configuration or a file named with --config.
 */
function rejectHostCommands(result: ConfigLoadResult): ConfigLoadResult {
  if (result.kind !== "ok") return result;
  const issues = Object.entries(result.config.profiles)
    .flatMap(([name, profile]) => [
      ...(profile.llm.key && "command" in profile.llm.key
        ? [`profiles.${name}.llm.key.command`]
        : []),
      ...(profile.git.token && "command" in profile.git.token
        ? [`profiles.${name}.git.token.command`]
        : []),
    ])
    .map((path) => ({
      path,
      message:
        "a key command runs on the host, so it is only honoured from ~/.config/sandbox/config.yaml or a file named with --config, not from a project's sandbox.yaml",
    }));
  return issues.length > 0 ? { kind: "invalid", file: result.file, issues } : result;
}

/**
 * The state directory is the user's, shared by every project: only the user's own configuration
 * or a file named with --config says what is removed from it, never a project's sandbox.yaml.
 */
function rejectUserSettings(result: ConfigLoadResult): ConfigLoadResult {
  if (result.kind !== "ok" || result.config.state?.retention === undefined) return result;
  return {
    kind: "invalid",
    file: result.file,
    issues: [{
      path: "state.retention",
      message:
        "removes run records of every project, so it is only honoured from ~/.config/sandbox/config.yaml or a file named with --config, not from a project's sandbox.yaml",
    }],
  };
}

/**
 * No configured value that enters the sandbox may carry a secret this process knows, whatever the
 * variable is called: `environment.set: {NOTES: "${OPENAI_API_KEY}"}` is refused like
 * `OPENAI_API_KEY` itself. Known secrets are the values of host variables with secret-looking names
 * and of the variables the profiles name as key sources. Issues name the place, never the value.
 */
export function secretValueIssues(
  config: Config,
  env: Record<string, string> = Deno.env.toObject(),
): ConfigIssue[] {
  const keyVariables = Object.values(config.profiles).flatMap((profile) =>
    [profile.llm.key, profile.git.token].flatMap((source) =>
      source && "env" in source ? [source.env] : []
    )
  );
  const secrets = knownSecrets(env, keyVariables);
  if (secrets.length === 0) return [];
  const issues: ConfigIssue[] = [];
  const refuse = (path: string, value: string | undefined, what = "contains") => {
    const found = value === undefined ? undefined : findSecret(value, secrets);
    if (found) {
      issues.push({
        path,
        message: `${what} the value of ${found.source}; secrets never enter the sandbox`,
      });
    }
  };
  for (const [name, profile] of Object.entries(config.profiles)) {
    const at = `profiles.${name}`;
    for (const [variable, value] of Object.entries(profile.sandbox.environment.set)) {
      refuse(`${at}.sandbox.environment.set.${variable}`, value);
    }
    profile.sandbox.environment.passthrough.forEach((variable, i) =>
      refuse(
        `${at}.sandbox.environment.passthrough[${i}]`,
        env[variable],
        "its value on this host contains",
      )
    );
    refuse(`${at}.llm.model`, profile.llm.model);
  }
  return issues;
}

function rejectSecretValues(result: ConfigLoadResult): ConfigLoadResult {
  if (result.kind !== "ok") return result;
  let env: Record<string, string>;
  try {
    env = Deno.env.toObject();
  } catch {
    // Without access to the environment no value could have been interpolated from it.
    return result;
  }
  const issues = secretValueIssues(result.config, env);
  return issues.length > 0 ? { kind: "invalid", file: result.file, issues } : result;
}

/** Load, validate and throw `ConfigError` when invalid. */
export async function loadConfigOrThrow(
  options: FindConfigOptions = {},
): Promise<{ config: Config; file?: string; source?: ConfigSource; ignored?: IgnoredConfig[] }> {
  const result = await loadConfig(options);
  if (result.kind === "invalid") throw new ConfigError(result.file, result.issues);
  return result;
}

/** The profile to use: `name`, else `$SANDBOX_PROFILE`, else `default_profile`, else "default". */
export function resolveProfile(config: Config, name?: string): Profile {
  const chosen = name ?? Deno.env.get("SANDBOX_PROFILE") ?? config.default_profile ??
    DEFAULT_PROFILE;
  let profile = config.profiles[chosen];
  if (!profile) {
    if (chosen !== DEFAULT_PROFILE) {
      const known = [
        DEFAULT_PROFILE,
        ...Object.keys(config.profiles).filter((p) => p !== DEFAULT_PROFILE),
      ];
      throw new SandboxError("usage", `Unknown profile "${chosen}"`, {
        detail: `Defined profiles: ${known.join(", ")}`,
      });
    }
    profile = ProfileSchema.parse({});
  }
  const r = profile.sandbox.resources;
  const environment = withoutRefusedNames(chosen, profile.sandbox.environment);
  return {
    name: chosen,
    description: profile.description,
    llm: profile.llm,
    git: profile.git,
    sandbox: { ...profile.sandbox, environment: environment.environment },
    ...(profile.budget ? { budget: profile.budget } : {}),
    ...(environment.warnings.length > 0 ? { warnings: environment.warnings } : {}),
    resources: {
      memoryBytes: parseSize(r.memory)!,
      cpus: r.cpus ?? Math.min(2, navigator.hardwareConcurrency || 1),
      pids: r.pids,
      diskBytes: parseSize(r.disk)!,
      timeoutMs: parseDuration(r.timeout)!,
    },
  };
}

/** A profile's environment without the names no configuration may set in a sandbox, each named in a warning. */
function withoutRefusedNames(
  profile: string,
  environment: SandboxConfig["environment"],
): { environment: SandboxConfig["environment"]; warnings: string[] } {
  const at = `profiles.${profile}.sandbox.environment`;
  const { env: set, warnings } = withoutRefusedEnv(environment.set, (name) => `${at}.set.${name}`);
  const passthrough = environment.passthrough.filter((name) => {
    const reason = refusedEnvReason(name);
    if (reason) warnings.push(`${at}.passthrough "${name}" is refused and not passed: ${reason}`);
    return reason === undefined;
  });
  return { environment: { set, passthrough }, warnings };
}

/** Every profile a configuration offers, including the implicit "default". */
export function profileNames(config: Config): string[] {
  const names = Object.keys(config.profiles);
  return names.includes(DEFAULT_PROFILE) ? names : [DEFAULT_PROFILE, ...names];
}

/**
 * A profile named `name` with every default: enough to find and remove its sandbox by name when its
 * configuration is broken or gone (`sandbox down -p NAME`).
 */
export function bareProfile(name: string): Profile {
  if (!PROFILE_NAME.test(name)) {
    throw new SandboxError("usage", `Invalid profile name "${name}"`, {
      detail: "Profile names are lowercase letters, digits, '.', '_' and '-' (at most 63)",
    });
  }
  return resolveProfile({ profiles: { [name]: ProfileSchema.parse({}) } }, name);
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
