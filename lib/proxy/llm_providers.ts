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
      },
      model: model ?? "default",
      policy,
    };
  }
  const builtin = BUILTIN_PROVIDERS[llm.provider];
  return {
    upstream: {
      name: llm.provider,
      kind: builtin.kind,
      baseUrl: builtin.baseUrl,
      key: keys.getter(llm.key ?? builtin.key),
    },
    model: model ?? builtin.defaultModel,
    policy,
  };
}
