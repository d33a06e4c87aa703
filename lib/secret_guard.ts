/**
 * The rule that no secret this process knows enters a sandbox, whatever carries it.
 *
 * Refusing secret-looking variable NAMES is not enough: `environment.set: {NOTES: "${OPENAI_API_KEY}"}`
 * or `exec -e NOTES=sk-...` carry a key under an innocent name. So every value that crosses into a
 * sandbox — container environment, exec environment, exec argv, files the tool writes — is checked
 * against the secrets known here: keys and tokens resolved by `KeyStore` (registered with
 * `registerSecret`), and the values of host environment variables whose names look secret. A match
 * is refused with an error naming the place and the secret's source, never the value.
 */
import { SandboxError } from "./errors.ts";
import { MIN_SECRET_CHARS } from "./redact.ts";

/**
 * The rules a variable name is a secret by: a word anywhere in the name, or an exact name. Each
 * rule has its own entry so that tests can hold each one to account (`secretNameRules`).
 */
const SECRET_WORDS = [
  "KEY",
  "TOKEN",
  "SECRET",
  "PASSWORD",
  "PASSWD",
  "PASSPHRASE",
  "CREDENTIAL",
  "PRIVATE",
  "AUTH",
  "COOKIE",
  "SESSION",
  "DSN",
  "DATABASE_URL",
] as const;
/** Names that carry access without a telling word: sockets and files that grant it. */
const SECRET_NAMES_EXACT = ["SSH_AUTH_SOCK", "DOCKER_HOST", "KUBECONFIG", "NETRC"] as const;

/** Which rules call `name` a secret (empty when none does). Case-insensitive. */
export function secretNameRules(name: string): string[] {
  const upper = name.toUpperCase();
  return [
    ...SECRET_WORDS.filter((word) => upper.includes(word)),
    ...SECRET_NAMES_EXACT.filter((exact) => upper === exact),
  ];
}

/** True when a variable name looks like it carries a secret. */
export function isSecretName(name: string): boolean {
  return secretNameRules(name).length > 0;
}

/** A secret and a description of where it came from that is safe to show. */
export interface KnownSecret {
  value: string;
  /** e.g. `environment variable "OPENAI_API_KEY"`; never the value. */
  source: string;
}

/** Secrets resolved by this process (keys, tokens), by value. */
const registered = new Map<string, string>();

/**
 * Remember a secret this process resolved (an LLM key, a git token) so that it is refused at every
 * boundary into a sandbox from now on. Values shorter than `MIN_SECRET_CHARS` are not remembered:
 * matching them would refuse ordinary text, and no real key is that short.
 */
export function registerSecret(value: string, source: string): void {
  if (value.length >= MIN_SECRET_CHARS && !registered.has(value)) registered.set(value, source);
}

/** The host environment, or nothing when this process may not read all of it. */
function hostEnvironment(): Record<string, string> {
  try {
    return Deno.env.toObject();
  } catch {
    // Without permission to read the environment, nothing could have been copied out of it either.
    return {};
  }
}

/**
 * Every secret known now: the registered ones, the values of host variables whose names look
 * secret, and the values of `alsoSecret` variables (key sources with innocent names).
 */
export function knownSecrets(
  env: Record<string, string> = hostEnvironment(),
  alsoSecret: readonly string[] = [],
): KnownSecret[] {
  const secrets: KnownSecret[] = [...registered].map(([value, source]) => ({ value, source }));
  for (const [name, value] of Object.entries(env)) {
    const trimmed = value.trim();
    if (trimmed.length < MIN_SECRET_CHARS) continue;
    if (isSecretName(name) || alsoSecret.includes(name)) {
      secrets.push({ value: trimmed, source: `environment variable "${name}"` });
    }
  }
  return secrets;
}

/** The first known secret that occurs in `text`. */
export function findSecret(text: string, secrets: readonly KnownSecret[]): KnownSecret | undefined {
  if (text.length < MIN_SECRET_CHARS) return undefined;
  return secrets.find((secret) => text.includes(secret.value));
}

/** What is about to enter a sandbox. */
export interface SandboxInput {
  /** Environment variables (name and value are both checked). */
  env?: Record<string, string>;
  /** Which environment this is, for the message: "container environment", "exec environment". */
  envKind?: string;
  argv?: readonly string[];
  /** A file the tool writes into the sandbox. */
  file?: { path: string; data: string | Uint8Array };
  /** Text handed in another way (a worker's job on its input): `what` names it in the message. */
  texts?: { what: string; data: string }[];
}

/**
 * Raise `SandboxError("config_invalid")` when anything in `input` contains a known secret. `target`
 * names the sandbox (`sandbox "sandbox-work"`). The message names the variable, argument or file and
 * the secret's source, never the value.
 */
export function assertNoSecrets(
  target: string,
  input: SandboxInput,
  secrets: readonly KnownSecret[] = knownSecrets(),
): void {
  if (secrets.length === 0) return;
  const refuse = (where: string, secret: KnownSecret): never => {
    throw new SandboxError(
      "config_invalid",
      `Refusing to pass a secret into ${target}: ${where} contains the value of ${secret.source}`,
      {
        detail:
          "Secrets never enter a sandbox: LLM keys and git tokens reach their upstreams through the host-side proxies",
      },
    );
  };
  for (const [name, value] of Object.entries(input.env ?? {})) {
    const found = findSecret(value, secrets) ?? findSecret(name, secrets);
    if (found) refuse(`${input.envKind ?? "environment"} variable "${name}"`, found);
  }
  (input.argv ?? []).forEach((arg, index) => {
    const found = findSecret(arg, secrets);
    if (found) refuse(`argv[${index}] of the command`, found);
  });
  if (input.file) {
    const { path, data } = input.file;
    const text = typeof data === "string" ? data : new TextDecoder().decode(data);
    const found = findSecret(text, secrets);
    if (found) refuse(`file "${path}"`, found);
  }
  for (const { what, data } of input.texts ?? []) {
    const found = findSecret(data, secrets);
    if (found) refuse(what, found);
  }
}
