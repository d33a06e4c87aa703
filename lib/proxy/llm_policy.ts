/**
 * What the credential proxy forwards: per route, the wire format, the request headers the API
 * needs, and the checks on the (strictly parsed) JSON body.
 *
 * The sandbox must not use the user's provider as a way out. Several provider features make the
 * provider reach the network or run code on the sandbox's behalf, around the egress allowlist and
 * on the user's bill: server-side tools (web fetch and search, code execution, MCP connectors),
 * models that search the web by themselves, and inputs given as URLs, which the provider fetches.
 * Unless the profile opts in (`llm.server_tools: allow`) such requests are refused with 403.
 *
 * The tool checks are allowlists: a tool passes only when it is one the client runs itself
 * (a plain function tool, or a provider-defined client tool such as bash or the text editor), so a
 * server-side tool that a provider adds tomorrow is refused until it is listed here. The
 * `anthropic-beta` filter is the opposite, a list of the server-side families: a beta flag alone
 * makes the provider do nothing (the tool in the body does, and that is checked), and agent CLIs
 * send many harmless flags that an allowlist would keep breaking.
 *
 * Sources (checked 2026):
 * - Anthropic tool reference, server vs client tools and their `type` strings:
 *   https://platform.claude.com/docs/en/agents-and-tools/tool-use/tool-reference
 *   (server: web_search_*, web_fetch_*, code_execution_*, advisor_*, tool_search_tool_*,
 *   mcp_toolset; client: bash_*, text_editor_*, computer_*, memory_*)
 * - Anthropic MCP connector (`mcp_servers`, beta `mcp-client-*`):
 *   https://platform.claude.com/docs/en/agents-and-tools/mcp-connector
 * - Anthropic code execution and its reusable `container`:
 *   https://platform.claude.com/docs/en/agents-and-tools/tool-use/code-execution-tool
 * - Anthropic URL sources for images and documents (`source: {type: "url"}`):
 *   https://platform.claude.com/docs/en/build-with-claude/vision
 * - OpenAI Chat Completions: tools of type `function` and `custom`; `web_search_options` and the
 *   search models (gpt-4o-search-preview, gpt-4o-mini-search-preview, gpt-5-search-api):
 *   https://platform.openai.com/docs/api-reference/chat/create,
 *   https://platform.openai.com/docs/guides/tools-web-search
 * - OpenAI Responses built-in tools (web_search*, file_search, code_interpreter, mcp,
 *   image_generation are server-side; computer_use_preview, local_shell, shell, apply_patch are
 *   client-side): https://platform.openai.com/docs/guides/tools; Codex 0.169.0 also sends
 *   `namespace` tools (a group of function tools) and `tool_search` with `execution: "client"`;
 *   a stored `prompt` can bring tools of its own, which the proxy cannot see
 *   (https://platform.openai.com/docs/api-reference/responses/create)
 * - OpenRouter server tools (`openrouter:*` tool types), `plugins` (web, file-parser) and the
 *   `:online` model suffix: https://openrouter.ai/docs/guides/features/server-tools,
 *   https://openrouter.ai/docs/guides/features/web-search
 */
import type { JsonObject, JsonValue } from "./strict_json.ts";

export type LlmApi = "openai" | "anthropic";

/** What a profile lets the sandbox ask of its provider (`llm.server_tools`, `llm.models`). */
export interface LlmPolicy {
  /** "allow": server-side tools, search models, URL inputs and their beta flags pass. */
  serverTools: "deny" | "allow";
  /** When set, a request must name one of these models. */
  models?: readonly string[];
}

export const DEFAULT_LLM_POLICY: LlmPolicy = { serverTools: "deny" };

/** Why a request was refused; `rule` says which setting would change the answer. */
export interface Refusal {
  rule: "server_tools" | "models";
  message: string;
}

export interface RouteRule {
  method: "GET" | "POST";
  /** The wire format; absent when the route exists in both (the provider's kind decides). */
  api?: LlmApi;
  /** Checks on the parsed body of a POST route: the first refusal, or undefined. */
  check?: (body: JsonObject, policy: LlmPolicy) => Refusal | undefined;
}

/** Path suffixes (after `/proxy/v1`) that are forwarded. */
export const ROUTES: Readonly<Record<string, RouteRule>> = {
  "/chat/completions": { method: "POST", api: "openai", check: checkChatCompletions },
  "/embeddings": { method: "POST", api: "openai", check: checkModel },
  "/messages": { method: "POST", api: "anthropic", check: checkMessages },
  // Claude Code sizes its context with it; the provider may fetch a URL source to count it.
  "/messages/count_tokens": { method: "POST", api: "anthropic", check: checkMessages },
  // The OpenAI Responses API, streamed or not: what Codex speaks.
  "/responses": { method: "POST", api: "openai", check: checkResponses },
  "/models": { method: "GET" },
};

/**
 * Request headers forwarded to each API, besides the credential (which the proxy sets) and
 * `content-type` (which the proxy sets to JSON for the JSON body it checked). Everything else the
 * sandbox sends is dropped: SDK telemetry, organisation and project selectors (`openai-organization`
 * would bill another organisation of the key), `openai-beta` (only the Assistants and Realtime
 * APIs use it, and they are not routed), cookies, and whatever an attacker invents next.
 */
export const FORWARDED_HEADERS: Readonly<Record<LlmApi, readonly string[]>> = {
  openai: ["accept"],
  anthropic: ["accept", "anthropic-version", "anthropic-beta"],
};

/** `anthropic-beta` flags that switch on a server-side tool family; dropped unless allowed. */
const SERVER_SIDE_BETA = /^(web-fetch|web-search|code-execution|mcp-client|skills|advisor-tool)-/i;

/** The headers to forward for `api`, from what the sandbox sent. */
export function forwardedHeaders(api: LlmApi, incoming: Headers, policy: LlmPolicy): Headers {
  const headers = new Headers();
  for (const name of FORWARDED_HEADERS[api]) {
    const value = incoming.get(name);
    if (value === null) continue;
    if (name === "anthropic-beta") {
      const flags = value.split(",").map((flag) => flag.trim()).filter((flag) =>
        flag !== "" && (policy.serverTools === "allow" || !SERVER_SIDE_BETA.test(flag))
      );
      if (flags.length > 0) headers.set(name, flags.join(","));
      continue;
    }
    headers.set(name, value);
  }
  return headers;
}

// ---------------------------------------------------------------------------------------------
// Body checks

/** Chat Completions tool types the client runs itself. */
const OPENAI_CHAT_CLIENT_TOOLS = new Set(["function", "custom"]);
/** Anthropic-defined tools that the client executes (custom tools have no type, or "custom"). */
const ANTHROPIC_CLIENT_TOOL = /^(bash|text_editor|computer|memory)_\d{8}$/;
/** OpenAI's search models search the web on every request, tool or not. */
const SEARCH_MODEL = /-search-(preview|api)(-|$)/i;
/** Keys under which Chat Completions content parts carry a URL the provider would fetch. */
const URL_KEYS = new Set(["url", "image_url", "video_url", "audio_url", "file_url", "file_data"]);

function isObject(value: JsonValue | undefined): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function present(value: JsonValue | undefined): boolean {
  return value !== undefined && value !== null && !(Array.isArray(value) && value.length === 0);
}

/** A URL with a scheme the provider would fetch: anything but inline `data:`. */
function isRemoteUrl(value: JsonValue | undefined): value is string {
  return typeof value === "string" && /^[a-z][a-z0-9+.-]*:/i.test(value.trim()) &&
    !/^data:/i.test(value.trim());
}

function serverSide(message: string): Refusal {
  return { rule: "server_tools", message };
}

/** `llm.models`, and models that search on the provider's side. */
function checkModel(body: JsonObject, policy: LlmPolicy): Refusal | undefined {
  const model = body.model;
  if (
    policy.models !== undefined && (typeof model !== "string" || !policy.models.includes(model))
  ) {
    return {
      rule: "models",
      message: model === undefined
        ? "the request names no model"
        : `model ${JSON.stringify(model)} is not allowed`,
    };
  }
  if (policy.serverTools === "allow" || typeof model !== "string") return undefined;
  const base = model.slice(model.lastIndexOf("/") + 1);
  if (SEARCH_MODEL.test(base)) {
    return serverSide(`model "${model}" searches the web on the provider's side`);
  }
  // OpenRouter: a model name ending in ":online" adds its web search plugin.
  if (/:online$/i.test(model)) {
    return serverSide(`model "${model}" searches the web on the provider's side (":online")`);
  }
  return undefined;
}

/** OpenAI Chat Completions (and OpenRouter's extensions of it). */
function checkChatCompletions(body: JsonObject, policy: LlmPolicy): Refusal | undefined {
  const model = checkModel(body, policy);
  if (model !== undefined || policy.serverTools === "allow") return model;
  if (present(body.web_search_options)) {
    return serverSide("web_search_options asks the provider to search the web");
  }
  if (present(body.plugins)) {
    return serverSide("plugins (web search, file parsing) run on the provider's side");
  }
  const tools = body.tools;
  if (Array.isArray(tools)) {
    for (const [index, tool] of tools.entries()) {
      const type = isObject(tool) ? tool.type : undefined;
      if (typeof type !== "string" || !OPENAI_CHAT_CLIENT_TOOLS.has(type)) {
        return serverSide(
          `tools[${index}] has type ${JSON.stringify(type ?? null)}, not a tool the client runs ` +
            `(only "function" and "custom" are)`,
        );
      }
    }
  }
  const messages = body.messages;
  if (Array.isArray(messages)) {
    for (const [index, message] of messages.entries()) {
      const content = isObject(message) ? message.content : undefined;
      if (!Array.isArray(content)) continue;
      for (const [partIndex, part] of content.entries()) {
        const url = partUrl(part);
        if (url !== undefined) {
          return serverSide(
            `messages[${index}].content[${partIndex}] gives a URL the provider would fetch ` +
              `(send the data inline instead)`,
          );
        }
      }
    }
  }
  return undefined;
}

/** A remote URL in a content part (`image_url`, `file.file_data`…), one level deep. */
function partUrl(part: JsonValue): string | undefined {
  if (!isObject(part)) return undefined;
  for (const [key, value] of Object.entries(part)) {
    if (URL_KEYS.has(key) && isRemoteUrl(value)) return value;
    if (!isObject(value)) continue;
    for (const [innerKey, inner] of Object.entries(value)) {
      if (URL_KEYS.has(innerKey) && isRemoteUrl(inner)) return inner;
    }
  }
  return undefined;
}

/** Responses API tool types the client runs itself. */
const OPENAI_RESPONSES_CLIENT_TOOLS = new Set([
  "function",
  "custom",
  "local_shell",
  "shell",
  "apply_patch",
  "computer_use_preview",
]);

/** Why a Responses API tool is not one the client runs, or undefined when it is. */
function responsesToolRefusal(tool: JsonValue, where: string): Refusal | undefined {
  const type = isObject(tool) ? tool.type : undefined;
  if (typeof type === "string" && OPENAI_RESPONSES_CLIENT_TOOLS.has(type)) return undefined;
  // Searching the request's own deferred tools, run by the client when it says so.
  if (type === "tool_search" && isObject(tool) && tool.execution === "client") return undefined;
  // A group of tools: allowed when every tool in it is.
  if (type === "namespace" && isObject(tool) && Array.isArray(tool.tools)) {
    for (const [index, inner] of tool.tools.entries()) {
      const refusal = responsesToolRefusal(inner, `${where}.tools[${index}]`);
      if (refusal !== undefined) return refusal;
    }
    return undefined;
  }
  return serverSide(
    `${where} has type ${JSON.stringify(type ?? null)}, not a tool the client runs (the provider ` +
      `would reach the network or run code for the sandbox)`,
  );
}

/** OpenAI Responses API. */
function checkResponses(body: JsonObject, policy: LlmPolicy): Refusal | undefined {
  const model = checkModel(body, policy);
  if (model !== undefined || policy.serverTools === "allow") return model;
  if (present(body.prompt)) {
    return serverSide("prompt names a stored prompt, whose tools the proxy cannot see");
  }
  const tools = body.tools;
  if (Array.isArray(tools)) {
    for (const [index, tool] of tools.entries()) {
      const refusal = responsesToolRefusal(tool, `tools[${index}]`);
      if (refusal !== undefined) return refusal;
    }
  }
  const input = body.input;
  if (Array.isArray(input)) {
    for (const [index, item] of input.entries()) {
      const content = isObject(item) ? item.content : undefined;
      if (!Array.isArray(content)) continue;
      for (const [partIndex, part] of content.entries()) {
        if (partUrl(part) !== undefined) {
          return serverSide(
            `input[${index}].content[${partIndex}] gives a URL the provider would fetch ` +
              `(send the data inline instead)`,
          );
        }
      }
    }
  }
  return undefined;
}

/** Anthropic Messages. */
function checkMessages(body: JsonObject, policy: LlmPolicy): Refusal | undefined {
  const model = checkModel(body, policy);
  if (model !== undefined || policy.serverTools === "allow") return model;
  if (present(body.mcp_servers)) {
    return serverSide("mcp_servers asks the provider to connect to MCP servers");
  }
  if (present(body.container)) {
    return serverSide("container asks for a code execution container on the provider's side");
  }
  const tools = body.tools;
  if (Array.isArray(tools)) {
    for (const [index, tool] of tools.entries()) {
      if (!isObject(tool)) continue;
      const type = tool.type;
      if (type === undefined || type === null || type === "custom") continue;
      if (typeof type === "string" && ANTHROPIC_CLIENT_TOOL.test(type)) continue;
      return serverSide(
        `tools[${index}] has type ${
          JSON.stringify(type)
        }, a server-side tool: the provider would ` +
          `reach the network or run code for the sandbox`,
      );
    }
  }
  const messages = body.messages;
  if (Array.isArray(messages)) {
    for (const [index, message] of messages.entries()) {
      const content = isObject(message) ? message.content : undefined;
      if (Array.isArray(content) && hasUrlSource(content)) {
        return serverSide(
          `messages[${index}] has a block with a URL source, which the provider would fetch ` +
            `(send the data inline instead)`,
        );
      }
    }
  }
  return undefined;
}

/** An image or document block whose source is a URL, at any depth of tool results. */
function hasUrlSource(blocks: JsonValue[]): boolean {
  for (const block of blocks) {
    if (!isObject(block)) continue;
    const source = block.source;
    if (isObject(source)) {
      if (source.type === "url") return true;
      if (Array.isArray(source.content) && hasUrlSource(source.content)) return true;
    }
    if (Array.isArray(block.content) && hasUrlSource(block.content)) return true;
  }
  return false;
}
