/**
 * What a devcontainer asks of the sandbox at run time — its user, environment and lifecycle
 * commands — merged from the image's metadata (base image, features) and the configuration as the
 * spec merges them, and reduced to what the hardening allows.
 */
import { SandboxError } from "../../errors.ts";
import {
  type DevcontainerConfig,
  LIFECYCLE_HOOKS,
  type LifecycleCommand,
  type LifecycleHook,
  type MetadataEntry,
  neverApplied,
  substituteContainerEnv,
} from "./config.ts";
import { refusedEnvReason } from "../../refused_env.ts";

/** One lifecycle command, where it came from, and what runs. */
export interface LifecycleStep {
  hook: LifecycleHook;
  /** `devcontainer.json`, `feature "<id>"` or `image metadata`. */
  source: string;
  command: LifecycleCommand;
}

export interface DevcontainerRuntime {
  /** The devcontainer's user, mapped to the sandbox uid; undefined: the sandbox's own user. */
  user?: string;
  /** containerEnv and remoteEnv, variables resolved: set in the container. */
  env: Record<string, string>;
  lifecycle: LifecycleStep[];
  /** What is never applied, and why: one line each. */
  warnings: string[];
}

/** Variables the sandbox itself sets: a devcontainer may not override them. */
const RESERVED_ENV =
  /^(HOME|USER|IS_SANDBOX|DENO_DIR|SANDBOX_.*|OPENAI_.*|ANTHROPIC_.*|(HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy)$/;

/** The user the devcontainer runs as: `remoteUser`, else `containerUser`, else the image's own non-root user. */
export function userFor(
  config: DevcontainerConfig,
  metadata: MetadataEntry[],
  imageUser: string,
  allowRoot: boolean,
): string | undefined {
  const entries = [...metadata, config.entry];
  const named = last(entries, "remoteUser") ?? last(entries, "containerUser");
  const fromImage = imageUser.split(":")[0];
  if (named === undefined) return fromImage && !isRoot(fromImage) ? fromImage : undefined;
  if (!isRoot(named)) return named;
  if (allowRoot) return undefined;
  throw new SandboxError(
    "config_invalid",
    `The devcontainer of "${config.repoPath}" asks to run as root (user "${named}")`,
    {
      detail: "A sandbox never runs as root. Set remoteUser to a non-root user in " + config.file +
        ", or set sandbox.devcontainer.allow_root: true in the profile to run it as the unprivileged sandbox user (uid 10001, no capabilities)",
    },
  );
}

/** Merge and resolve the run-time settings. */
export function resolveRuntime(
  config: DevcontainerConfig,
  image: { metadata: MetadataEntry[]; env: Record<string, string>; volumes: string[] },
  options: { allowRoot: boolean; imageUser?: string },
): DevcontainerRuntime {
  const warnings = [...config.warnings];
  const entries = [...image.metadata, config.entry];
  // Features and base images: the CLI baked their containerEnv into the image already; what they
  // ask of the container at run time is checked like the configuration's own keys.
  for (const entry of image.metadata) {
    const source = entry.id ? `feature "${entry.id}"` : "image metadata";
    for (const warning of neverApplied(entry as Record<string, unknown>, source)) {
      if (!warnings.includes(warning)) warnings.push(warning);
    }
  }
  for (const volume of image.volumes) {
    warnings.push(
      `image: VOLUME ${volume} gets an anonymous Docker volume (not a host path), removed with the container only by docker rm --volumes`,
    );
  }
  const named = last(entries, "remoteUser") ?? last(entries, "containerUser");
  if (named !== undefined && isRoot(named) && options.allowRoot) {
    warnings.push(
      `user "${named}" runs as the unprivileged sandbox user (uid 10001, no capabilities): allow_root never gives root`,
    );
  }
  const containerEnv = config.entry.containerEnv ?? {};
  const remoteEnv: Record<string, string | null> = Object.assign(
    {},
    ...entries.map((e) => e.remoteEnv ?? {}),
  );
  const imageEnv = { ...image.env, ...containerEnv };
  const env: Record<string, string> = {};
  const merged: Record<string, string | null> = {
    ...containerEnv,
    ...substituteContainerEnv(remoteEnv, imageEnv),
  };
  for (const [name, value] of Object.entries(merged)) {
    if (RESERVED_ENV.test(name)) {
      warnings.push(
        `devcontainer.json: environment variable "${name}" is ignored: the sandbox sets it`,
      );
      continue;
    }
    const refused = value === null ? undefined : refusedEnvReason(name);
    if (refused) {
      warnings.push(
        `devcontainer.json: "${
          name in remoteEnv ? "remoteEnv" : "containerEnv"
        }.${name}" is refused and not set: ${refused}`,
      );
      continue;
    }
    if (value !== null) env[name] = value;
  }
  const lifecycle: LifecycleStep[] = [];
  for (const hook of LIFECYCLE_HOOKS) {
    for (const entry of entries) {
      const command = entry[hook];
      if (command === undefined) continue;
      const source = entry === config.entry
        ? "devcontainer.json"
        : entry.id
        ? `feature "${entry.id}"`
        : "image metadata";
      lifecycle.push({
        hook,
        source,
        command: substituteContainerEnv(command, { ...imageEnv, ...env }),
      });
    }
  }
  return {
    user: userFor(config, image.metadata, options.imageUser ?? "", options.allowRoot),
    env,
    lifecycle,
    warnings,
  };
}

function last<K extends "remoteUser" | "containerUser">(
  entries: MetadataEntry[],
  key: K,
): string | undefined {
  for (let i = entries.length - 1; i >= 0; i--) {
    const value = entries[i][key];
    if (typeof value === "string" && value !== "") return value;
  }
  return undefined;
}

function isRoot(user: string): boolean {
  const name = user.split(":")[0];
  return name === "root" || name === "0";
}
