/**
 * A run's workspace in the devcontainer: the workspace folder pointed at the run's worktree, then
 * the lifecycle commands, in the hardened container, as the sandbox user, under the profile's
 * network policy, their output on stderr.
 *
 * Every run gets a fresh worktree, so every run is a newly created workspace: onCreateCommand,
 * updateContentCommand, postCreateCommand and postStartCommand run, in that order, before the
 * agent starts. A command's background processes end with it, like every exec's.
 */
import { SandboxError, tail } from "../../errors.ts";
import type { SandboxProvider } from "../provider.ts";
import type { LifecycleStep } from "./runtime.ts";

/** Inside the workspace volume: each run points it at its worktree; the workspace folder links to it. */
export const WORKSPACE_LINK = "/workspace/.devcontainer-workspace";
/** The only session variables lifecycle commands get: the egress proxy, not the LLM token. */
const LIFECYCLE_ENV = /^((HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy)$/;

export interface WorkspaceOptions {
  /** The run's worktree in the sandbox. */
  worktree: string;
  /** Folder of the repository the devcontainer belongs to ("" is the root). */
  subdir: string;
  /** The devcontainer's workspaceFolder (a link to the run's folder, made at build time). */
  workspaceFolder: string;
  lifecycle: LifecycleStep[];
  /** The session's environment; lifecycle commands get only its egress proxy variables. */
  env: Record<string, string>;
  timeoutMs: number;
  signal?: AbortSignal;
  /** Lifecycle output and notes, for stderr. */
  onProgress?: (line: string) => void;
}

/** Point the workspace folder at the run's worktree and run the lifecycle commands; returns the agent's cwd. */
export async function prepareWorkspace(
  provider: SandboxProvider,
  options: WorkspaceOptions,
): Promise<string> {
  const folder = options.subdir ? `${options.worktree}/${options.subdir}` : options.worktree;
  const script =
    'ln -sfn "$1" "$2" && if [ -L "$3" ] && [ "$(readlink "$3")" = "$2" ]; then echo "$3"; else echo "$1"; fi';
  const linked = await provider.exec([
    "sh",
    "-c",
    script,
    "sh",
    folder,
    WORKSPACE_LINK,
    options.workspaceFolder,
  ], {
    signal: options.signal,
    timeoutMs: 30_000,
  });
  if (linked.exitCode !== 0) {
    throw new SandboxError(
      "exec_failed",
      `Cannot link the devcontainer's workspace folder to "${folder}"`,
      {
        detail: tail(linked.stderr),
      },
    );
  }
  const cwd = linked.stdout.trim();
  if (cwd !== options.workspaceFolder) {
    options.onProgress?.(
      `note: the image already has files at ${options.workspaceFolder}; the agent works in ${folder}`,
    );
  }
  const env = Object.fromEntries(
    Object.entries(options.env).filter(([name]) => LIFECYCLE_ENV.test(name)),
  );
  await runLifecycle(provider, options.lifecycle, { ...options, cwd, env });
  return cwd;
}

/** Run the steps in order; an object's named commands run in parallel. The first failure ends it. */
export async function runLifecycle(
  provider: SandboxProvider,
  steps: LifecycleStep[],
  options: {
    cwd: string;
    env: Record<string, string>;
    timeoutMs: number;
    signal?: AbortSignal;
    onProgress?: (line: string) => void;
  },
): Promise<void> {
  for (const step of steps) {
    const commands = typeof step.command === "string" || Array.isArray(step.command)
      ? [[step.hook, step.command] as const]
      : Object.entries(step.command).map(([name, command]) =>
        [`${step.hook}.${name}`, command] as const
      );
    await Promise.all(
      commands.map(([label, command]) => runOne(provider, label, step.source, command, options)),
    );
  }
}

async function runOne(
  provider: SandboxProvider,
  label: string,
  source: string,
  command: string | string[],
  options: {
    cwd: string;
    env: Record<string, string>;
    timeoutMs: number;
    signal?: AbortSignal;
    onProgress?: (line: string) => void;
  },
): Promise<void> {
  const argv = typeof command === "string" ? ["/bin/sh", "-c", command] : command;
  const shown = typeof command === "string" ? command : JSON.stringify(command);
  const say = (line: string) => options.onProgress?.(`${label}: ${line}`);
  say(`running ${clip(shown)}${source === "devcontainer.json" ? "" : ` (from ${source})`}`);
  const stream = provider.execStream(argv, {
    cwd: options.cwd,
    env: options.env,
    signal: options.signal,
    timeoutMs: options.timeoutMs,
    onStderrLine: say,
  });
  try {
    for await (const line of stream) say(line);
  } catch (error) {
    throw failure(label, source, shown, error);
  }
  const outcome = await stream.outcome.catch((error) => {
    throw failure(label, source, shown, error);
  });
  if (outcome.exitCode !== 0) {
    throw new SandboxError(
      "exec_failed",
      `Devcontainer ${label} failed: ${clip(shown)} exited with code ${outcome.exitCode}`,
      {
        detail: `${
          source === "devcontainer.json" ? "" : `It comes from ${source}. `
        }Its output is above; fix the command, or remove it from the configuration`,
      },
    );
  }
}

function failure(label: string, source: string, shown: string, error: unknown): SandboxError {
  if (error instanceof SandboxError && (error.code === "interrupted" || error.code === "timeout")) {
    return new SandboxError(
      error.code,
      `Devcontainer ${label} (${clip(shown)}${
        source === "devcontainer.json" ? "" : `, from ${source}`
      }): ${error.message}`,
      { cause: error },
    );
  }
  if (error instanceof SandboxError) return error;
  return new SandboxError(
    "exec_failed",
    `Devcontainer ${label} failed: ${(error as Error).message}`,
    { cause: error },
  );
}

function clip(text: string): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return JSON.stringify(flat.length > 120 ? `${flat.slice(0, 117)}...` : flat);
}
