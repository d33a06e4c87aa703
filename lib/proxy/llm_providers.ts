/** The registry of LLM upstreams a profile can name, and turning a profile's choice into one. */
import type { LlmConfig } from "../config.ts";
import type { UpstreamProvider } from "./credential_proxy.ts";
import type { KeySource, KeyStore } from "../keys.ts";
import type { LlmPolicy } from "./llm_policy.ts";

interface BuiltinProvider {
  kind: "openai" | "anthropic";
  baseUrl: string;
  key: KeySource;
  defaultModel: string;
}

/** Built-in providers. Their keys go only to their own base URL, which config cannot change. */
export const BUILTIN_PROVIDERS: Readonly<
  Record<"openai" | "anthropic" | "openrouter", BuiltinProvider>
> = {
  openai: {
    kind: "openai",
    baseUrl: "https://api.openai.com/v1",
    key: { env: "OPENAI_API_KEY" },
    defaultModel: "gpt-4.1-mini",
  },
  anthropic: {
    kind: "anthropic",
    baseUrl: "https://api.anthropic.com/v1",
    key: { env: "ANTHROPIC_API_KEY" },
    defaultModel: "claude-sonnet-4-5",
  },
  openrouter: {
    kind: "openai",
    baseUrl: "https://openrouter.ai/api/v1",
    key: { env: "OPENROUTER_API_KEY" },
    defaultModel: "openai/gpt-4.1-mini",
  },
};

/**
 * Claude Code's long-lived subscription token (what `claude setup-token` prints), read on the host
 * like a key. A key source naming this variable is a subscription: the credential proxy sends it
 * as Claude Code does, `Authorization: Bearer` with the OAuth beta flag, never as `x-api-key`.
 */
export const OAUTH_TOKEN_ENV = "CLAUDE_CODE_OAUTH_TOKEN";

/**
 * Where a profile's key comes from: `llm.key`, else its built-in provider's variable; for the
 * built-in `anthropic` provider, the subscription token when `ANTHROPIC_API_KEY` is not set and
 * `CLAUDE_CODE_OAUTH_TOKEN` is.
 */
export function keySourceFor(
  llm: Pick<LlmConfig, "provider" | "key">,
  env: (name: string) => string | undefined = (name) => Deno.env.get(name),
): KeySource {
  if (llm.key) return llm.key;
  // Schema validation guarantees a key for custom providers.
  const builtin = BUILTIN_PROVIDERS[llm.provider as keyof typeof BUILTIN_PROVIDERS].key;
  const subscription = llm.provider === "anthropic" && !env("ANTHROPIC_API_KEY")?.trim() &&
    Boolean(env(OAUTH_TOKEN_ENV)?.trim());
  return subscription ? { env: OAUTH_TOKEN_ENV } : builtin;
}

/** How the credential proxy presents a key from `source` to an Anthropic-format upstream. */
export function authFor(source: KeySource): "oauth" | undefined {
  return "env" in source && source.env === OAUTH_TOKEN_ENV ? "oauth" : undefined;
}

/** What the worker needs to know about the upstream: never the key. */
export interface LlmTarget {
  upstream: UpstreamProvider;
  model: string;
  /** What the sandbox may ask of the upstream (the credential proxy enforces it). */
  policy: LlmPolicy;
}

/** The credential proxy's policy for a profile's `llm` section. */
export function llmPolicy(llm: Pick<LlmConfig, "server_tools" | "models">): LlmPolicy {
  return { serverTools: llm.server_tools ?? "deny", models: llm.models };
}

/** The upstream for a profile's `llm` section; the key is read lazily, on the first request. */
export function llmTarget(llm: LlmConfig, keys: KeyStore): LlmTarget {
  const policy = llmPolicy(llm);
  // The first allowed model is the default, so that an unset `model` never names a refused one.
  const model = llm.model ?? llm.models?.[0];
  if (llm.provider === "custom") {
    // Schema validation guarantees base_url and key for custom providers.
    const source = llm.key!;
    return {
      upstream: {
        name: "custom",
        kind: llm.api ?? "openai",
        baseUrl: llm.base_url!.replace(/\/+$/, ""),
        key: keys.getter(source),
        auth: authFor(source),
      },
      model: model ?? "default",
      policy,
    };
  }
  const builtin = BUILTIN_PROVIDERS[llm.provider];
  const source = keySourceFor(llm);
  return {
    upstream: {
      name: llm.provider,
      kind: builtin.kind,
      baseUrl: builtin.baseUrl,
      key: keys.getter(source),
      auth: authFor(source),
    },
    model: model ?? builtin.defaultModel,
    policy,
  };
}
