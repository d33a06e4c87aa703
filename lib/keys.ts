/**
 * Where API keys come from, and the one place that holds them.
 *
 * Keys live only in this host process's memory: they are never written to disk, never passed to
 * a sandbox (every resolved value is registered with the secret guard, which refuses it at every
 * boundary into one), and registered with a `Redactor` so that logs and error messages cannot echo it. Error messages name the source (a variable name, a program name) and
 * never the value, the command's arguments or its stdout.
 */
import { SandboxError } from "./errors.ts";
import { ProgramNotFoundError, run } from "./process.ts";
import type { Redactor } from "./redact.ts";
import { registerSecret } from "./secret_guard.ts";

/** A key read from an environment variable, or printed on stdout by a command (a password manager). */
export type KeySource = { env: string } | { command: string[] };

/** How long a key command may take: password managers may prompt, but not forever. */
export const KEY_COMMAND_TIMEOUT_MS = 30_000;

export interface KeyStoreOptions {
  /** Every resolved key is registered here. */
  redactor?: Redactor;
  /** Reads an environment variable; defaults to `Deno.env.get`. */
  env?: (name: string) => string | undefined;
  commandTimeoutMs?: number;
}

/** Resolves key sources on first use and caches the values in memory. */
export class KeyStore {
  readonly #redactor: Redactor | undefined;
  readonly #env: (name: string) => string | undefined;
  readonly #commandTimeoutMs: number;
  /** Cached by source; a promise, so concurrent first uses run a key command only once. */
  readonly #cache = new Map<string, Promise<string>>();

  constructor(options: KeyStoreOptions = {}) {
    this.#redactor = options.redactor;
    this.#env = options.env ?? ((name) => Deno.env.get(name));
    this.#commandTimeoutMs = options.commandTimeoutMs ?? KEY_COMMAND_TIMEOUT_MS;
  }

  /** The key for `source`; raises `SandboxError("config_invalid")` when it cannot be read. */
  resolve(source: KeySource, signal?: AbortSignal): Promise<string> {
    const cacheKey = JSON.stringify(source);
    let pending = this.#cache.get(cacheKey);
    if (pending === undefined) {
      pending = this.#read(source, signal).then((key) => {
        this.#redactor?.add(key);
        // From now on no value entering a sandbox may contain it (lib/secret_guard.ts).
        registerSecret(key, `the key from ${describeKeySource(source)}`);
        return key;
      });
      // A failure is not cached: the user may fix the variable or sign in to the password manager.
      pending.catch(() => this.#cache.delete(cacheKey));
      this.#cache.set(cacheKey, pending);
    }
    return pending;
  }

  /** A function that resolves `source` on each call (cached), as `UpstreamProvider.key` wants. */
  getter(source: KeySource): () => Promise<string> {
    return () => this.resolve(source);
  }

  /** Forget every cached key. */
  clear(): void {
    this.#cache.clear();
  }

  async #read(source: KeySource, signal?: AbortSignal): Promise<string> {
    if ("env" in source) return this.#readEnv(source.env);
    return await this.#readCommand(source.command, signal);
  }

  #readEnv(name: string): string {
    const value = this.#env(name)?.trim();
    if (!value) {
      throw new SandboxError(
        "config_invalid",
        `Cannot read API key: environment variable "${name}" is not set`,
      );
    }
    return value;
  }

  async #readCommand(argv: readonly string[], signal?: AbortSignal): Promise<string> {
    if (argv.length === 0) {
      throw new SandboxError("config_invalid", "Cannot read API key: the key command is empty");
    }
    // Only argv[0] is ever named: later arguments may hold a vault path or even a passphrase.
    const what = `Cannot read API key from command "${argv[0]}"`;
    let result;
    try {
      result = await run(argv, { signal, timeoutMs: this.#commandTimeoutMs });
    } catch (error) {
      if (error instanceof ProgramNotFoundError) {
        throw new SandboxError("config_invalid", `${what}: not found on PATH`, { cause: error });
      }
      // Spawn errors name the program, never its output: safe to keep as the cause.
      throw new SandboxError("config_invalid", `${what}: it could not be started`, {
        cause: error,
      });
    }
    if (result.aborted) throw new SandboxError("interrupted", `${what}: interrupted`);
    // The detail is the stderr tail (diagnostics such as "not signed in"); stdout is never shown.
    const detail = result.stderrTail || undefined;
    if (result.timedOut) {
      const message = `${what}: no answer after ${this.#commandTimeoutMs} ms`;
      throw new SandboxError("config_invalid", message, { detail });
    }
    if (result.exitCode !== 0) {
      throw new SandboxError("config_invalid", `${what}: exit code ${result.exitCode}`, { detail });
    }
    const value = result.stdout.trim();
    if (!value) throw new SandboxError("config_invalid", `${what}: it printed nothing`);
    return value;
  }
}

/** A human label for a source, safe to show: the variable name or the program name. */
export function describeKeySource(source: KeySource): string {
  return "env" in source
    ? `environment variable "${source.env}"`
    : `command "${source.command[0] ?? ""}"`;
}
