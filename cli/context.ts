/**
 * What every command shares: the one stdout writer, stderr notes, the interrupt signal, the state
 * `main` turns into an exit code, and small argument parsers.
 */
import type { OptionValues } from "commander";
import {
  type Config,
  type ConfigSource,
  DEFAULT_PROFILE,
  type IgnoredConfig,
  loadConfig,
  namedConfigFile,
  resolveProfile,
} from "../lib/config.ts";
import { shellQuote } from "../lib/config_summary.ts";
import { ConfigError, EXIT, SandboxError } from "../lib/errors.ts";
import type { ProfileSandbox } from "../lib/sandbox/provider.ts";
import { isSecretName } from "../lib/secret_guard.ts";
import { isGoneOutput, StdoutWriter } from "../lib/output.ts";
import { escapeControls } from "../lib/run/transcript.ts";
import { parseDuration } from "../lib/units.ts";
import { trace } from "../lib/trace.ts";
import { clearSpinner, redrawSpinner } from "./progress.ts";
import { tellSupervisorReady } from "./supervise_first.ts";

/** Buffered: events join the write in flight instead of one awaited write each; flushed in main. */
export const stdout = new StdoutWriter(Deno.stdout, { buffered: true });
const encoder = new TextEncoder();

/**
 * Diagnostics and progress: stderr only, never stdout. Control characters (in a ref name the
 * agent made, a remote's answer) are shown escaped, as in the pretty transcript.
 */
export function note(message: string): void {
  clearSpinner();
  writeStderr(`sandbox: ${escapeControls(message)}\n`);
  redrawSpinner();
}

/**
 * Text to stderr; dropped when stderr is gone (a supervised run whose terminal closed or whose CLI
 * was killed goes on, and what matters of it is in its record).
 */
export function writeStderr(text: string): void {
  try {
    Deno.stderr.writeSync(encoder.encode(text));
  } catch (error) {
    if (!isGoneOutput(error)) throw error;
  }
}

/** Write a line to stderr as it is (a command's own stderr, passed through). */
export function stderrLine(line: string): void {
  clearSpinner();
  writeStderr(line + "\n");
  redrawSpinner();
}

/**
 * Cancelled by Ctrl-C or SIGTERM. A second signal is the user insisting: what follows is the entry
 * point's decision (cli.ts exits at once, with the code for an interruption), since only it exits.
 */
const interrupt = new AbortController();
let secondInterrupt: (() => void) | undefined;
function onSignal(): void {
  if (interrupt.signal.aborted) return secondInterrupt?.();
  interrupt.abort(new SandboxError("interrupted", "Interrupted"));
}

/** What a second Ctrl-C or SIGTERM does (by default nothing more than the first). */
export function onSecondInterrupt(handler: () => void): void {
  secondInterrupt = handler;
}
Deno.addSignalListener("SIGINT", onSignal);
Deno.addSignalListener("SIGTERM", onSignal);
// A run's supervisor: the CLI that holds its signals until now may pass them on.
tellSupervisorReady();
export const signal: AbortSignal = interrupt.signal;

/** What the command that ran decided, for `main` to turn into the exit code. */
export const cliState = {
  exitCode: EXIT.ok as number,
  /** Commands that end on a signal by design (`proxy`, `logs -f`): that is success, not an interruption. */
  endedBySignal: false,
};

interface GlobalOptions {
  config?: string;
}

/**
 * The command being run, as the actions see it: commander's `Command`, or what the fast path
 * (fast_path.ts) makes for `run` and `exec` without loading commander.
 */
export interface Invocation {
  optsWithGlobals(): OptionValues;
}

export function globals(command: Invocation): GlobalOptions {
  return command.optsWithGlobals() as GlobalOptions;
}

export interface LoadedConfig {
  config: Config;
  file?: string;
  source?: ConfigSource;
}

let loaded: Promise<LoadedConfig> | undefined;

/**
 * The configuration, loaded once per process. Project files ignored for want of trust are reported
 * on stderr (which file, what it would change, how to trust it); an invalid file is a ConfigError.
 */
export function configFor(command: Invocation): Promise<LoadedConfig> {
  loaded ??= (async () => {
    const result = await loadConfig({ explicit: globals(command).config });
    trace("cli: configuration loaded");
    for (const ignored of result.ignored ?? []) reportIgnored(ignored);
    if (result.kind === "invalid") throw new ConfigError(result.file, result.issues);
    return result;
  })();
  return loaded;
}

function reportIgnored(ignored: IgnoredConfig): void {
  const why = ignored.state === "changed" ? "it changed since you trusted it" : "it is not trusted";
  note(
    `ignoring ${
      shellQuote(ignored.file)
    }: ${why} (a configuration file that comes with a project may be hostile)`,
  );
  note("  it would set:");
  for (const line of ignored.summary) note(`    ${line}`);
  note(
    "  the built-in defaults (or your user config) apply as if it were absent; after reviewing it, trust it with:",
  );
  note(`    ${ignored.trustCommand}`);
}

/**
 * Every command runs this first: a configuration named with --config or $SANDBOX_CONFIG must exist
 * and be valid, whether or not the command needs it, so that a typo never goes unnoticed.
 */
export async function checkNamedConfigFirst(_program: unknown, action: Invocation): Promise<void> {
  if (namedConfigFile({ explicit: globals(action).config })) await configFor(action);
}

export async function profileFor(command: Invocation, name?: string) {
  const { config } = await configFor(command);
  const profile = resolveProfile(config, name);
  for (const warning of profile.warnings ?? []) note(`warning: ${warning}`);
  return profile;
}

/**
 * The profile whose sandboxes `down` removes, found by name alone: a broken, changed or removed
 * configuration never stops a cleanup. The name is `-p`, else `$SANDBOX_PROFILE`, else the
 * configuration's `default_profile` (which needs a valid configuration), else "default".
 */
export async function profileToRemove(command: Invocation, name?: string): Promise<string> {
  let chosen = name ?? (Deno.env.get("SANDBOX_PROFILE") || undefined);
  if (chosen === undefined) {
    try {
      chosen = (await configFor(command)).config.default_profile ?? DEFAULT_PROFILE;
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error;
      throw new SandboxError(
        "config_invalid",
        `Cannot tell which profile's sandbox to remove: ${error.message}`,
        {
          detail:
            `${error.detail}\nName the profile to remove its sandbox whatever the configuration says: sandbox down -p PROFILE`,
        },
      );
    }
  }
  return chosen;
}

/**
 * The profile's sandbox, found by its name as in every mode that has one (lib/sandbox/providers.ts
 * `namedSandbox`): `stop`, `start` and `cp` act on what exists and build nothing (a devcontainer's
 * image included). With `existing`, a run's own sandbox of that profile instead.
 */
export async function sandboxByName(
  command: Invocation,
  name?: string,
  options: { existing?: string } = {},
): Promise<ProfileSandbox> {
  const profile = await profileFor(command, name);
  const { namedSandbox } = await import("../lib/sandbox/providers.ts");
  return namedSandbox(profile, options);
}

export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

export function parseEnvPairs(pairs: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf("=");
    if (eq <= 0) throw new SandboxError("usage", `Invalid --env "${pair}": expected KEY=VALUE`);
    const name = pair.slice(0, eq);
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
      throw new SandboxError(
        "usage",
        `Invalid --env "${name}": expected an environment variable name`,
      );
    }
    // The same rule as the configuration's environment: secrets never enter the sandbox.
    if (isSecretName(name)) {
      throw new SandboxError("usage", `Refusing --env "${name}": the name looks like a secret`, {
        detail:
          "Secrets never enter the sandbox; LLM keys and git tokens reach their upstreams through the host-side proxies",
      });
    }
    env[name] = pair.slice(eq + 1);
  }
  return env;
}

export function parseTimeout(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const ms = parseDuration(text);
  if (!ms) {
    throw new SandboxError(
      "usage",
      `Invalid --timeout "${text}": expected a duration like "30m", "90s" or "1h"`,
    );
  }
  return ms;
}
