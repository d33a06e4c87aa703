/**
 * What every command shares: the one stdout writer, stderr notes, the interrupt signal, the state
 * `main` turns into an exit code, and small argument parsers.
 */
import { type Command, Option } from "commander";
import { loadConfigOrThrow, resolveProfile } from "../lib/config.ts";
import { EXIT, SandboxError } from "../lib/errors.ts";
import { StdoutWriter } from "../lib/output.ts";
import { parseDuration } from "../lib/units.ts";

/** Buffered: events join the write in flight instead of one awaited write each; flushed in main. */
export const stdout = new StdoutWriter(Deno.stdout, { buffered: true });
const encoder = new TextEncoder();

/** Diagnostics and progress: stderr only, never stdout. */
export function note(message: string): void {
  Deno.stderr.writeSync(encoder.encode(`sandbox: ${message}\n`));
}

/** Write a line to stderr as it is (a command's own stderr, passed through). */
export function stderrLine(line: string): void {
  Deno.stderr.writeSync(encoder.encode(line + "\n"));
}

/** Cancelled by Ctrl-C or SIGTERM; a second signal exits at once. */
const interrupt = new AbortController();
function onSignal(): void {
  if (interrupt.signal.aborted) Deno.exit(EXIT.interrupted);
  interrupt.abort(new SandboxError("interrupted", "Interrupted"));
}
Deno.addSignalListener("SIGINT", onSignal);
Deno.addSignalListener("SIGTERM", onSignal);
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

export function globals(command: Command): GlobalOptions {
  return command.optsWithGlobals() as GlobalOptions;
}

export async function profileFor(command: Command, name?: string) {
  const { config } = await loadConfigOrThrow({ explicit: globals(command).config });
  return resolveProfile(config, name);
}

export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

export function parseEnvPairs(pairs: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf("=");
    if (eq <= 0) throw new SandboxError("usage", `Invalid --env "${pair}": expected KEY=VALUE`);
    env[pair.slice(0, eq)] = pair.slice(eq + 1);
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

export async function readInput(path: string, what: string): Promise<string> {
  try {
    return path === "-"
      ? await new Response(Deno.stdin.readable).text()
      : await Deno.readTextFile(path);
  } catch (error) {
    throw new SandboxError("usage", `Cannot read ${what} "${path}": ${(error as Error).message}`);
  }
}

export const jsonOption = () => new Option("--json", "machine-readable output on stdout");
export const profileOption = () =>
  new Option(
    "-p, --profile <name>",
    'profile to use (default: $SANDBOX_PROFILE, default_profile, or "default")',
  );
