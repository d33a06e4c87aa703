/**
 * A scripted fake LLM on 127.0.0.1 (port 0), for worker and end-to-end tests. It speaks the OpenAI
 * Chat Completions API (`POST …/v1/chat/completions`) and the Anthropic Messages API
 * (`POST …/v1/messages`), each served at `/v1/` and at `/proxy/v1/`, where the credential proxy
 * would sit. Each request takes the next step of one shared script:
 *
 * - a tool call step: the assistant asks for one or more tool calls (finish_reason "tool_calls",
 *   or Anthropic `tool_use` blocks with stop_reason "tool_use")
 * - a text step: the assistant answers with text (finish_reason "stop" / stop_reason "end_turn")
 * - an HTTP error step: an error status with the API's error body
 *
 * OpenAI responses are plain JSON, or SSE for `stream: true`; Anthropic responses are plain JSON
 * only (`stream: true` gets a 400). Every response reports usage (in OpenAI SSE as the final chunk
 * when `stream_options.include_usage` is set), and `usage` sums what was reported so tests can
 * compare token totals. A request after the script is exhausted gets a 500. Every request is
 * recorded (headers and parsed body); tests synchronise on `nextRequest()`.
 *
 * Like a real provider it checks credentials: a request must carry exactly its `key` (default
 * `FAKE_LLM_KEY`), as `Authorization: Bearer KEY` or `x-api-key: KEY` and no other credential
 * header, or it is answered 401 (without taking a step of the script). End-to-end tests configure
 * the profile's key as `FAKE_LLM_KEY`, so a proxy that forwarded the sandbox's token instead of
 * the key would fail them; worker tests, where the fake stands in for the proxy, give it the token.
 */

export interface FakeToolCall {
  name: string;
  args: Record<string, unknown>;
  /** Defaults to `call_<n>`, unique within this fake. */
  id?: string;
}

export interface FakeUsage {
  promptTokens: number;
  completionTokens: number;
}

export type FakeStep =
  | { kind: "tool_calls"; calls: FakeToolCall[]; text?: string; usage?: FakeUsage }
  | { kind: "text"; text: string; usage?: FakeUsage }
  | { kind: "http_error"; status: number; message: string };

export interface FakeLlmRequest {
  path: string;
  headers: Headers;
  // deno-lint-ignore no-explicit-any
  body: any;
}

/** The key a `FakeLlm` accepts unless it is given another. */
export const FAKE_LLM_KEY = "sk-fake-llm-key-5f2c9a7e41d3b8";

export interface FakeLlmOptions {
  /** The only API key it accepts (default `FAKE_LLM_KEY`). */
  key?: string;
}

/** Usage reported for a step that does not set its own. */
export const DEFAULT_USAGE: FakeUsage = { promptTokens: 101, completionTokens: 17 };

/** A step asking for one tool call. */
export function toolCall(name: string, args: Record<string, unknown>, id?: string): FakeStep {
  return { kind: "tool_calls", calls: [{ name, args, id }] };
}

/** A step answering with text (the final answer of an agent, or a generate result). */
export function text(content: string, usage?: FakeUsage): FakeStep {
  return { kind: "text", text: content, usage };
}

/** A step failing with an HTTP error. */
export function httpError(status: number, message: string): FakeStep {
  return { kind: "http_error", status, message };
}

/**
 * The canonical agent run: write `content` to `file` with the write_file tool, run `command` with
 * the execute tool, then answer `answer`.
 */
export function writeThenExecute(
  file: string,
  content: string,
  command: string,
  answer = "Done: wrote the file and ran the command",
): FakeStep[] {
  return [
    toolCall("write_file", { file_path: file, content }),
    toolCall("execute", { command }),
    text(answer),
  ];
}

export class FakeLlm implements AsyncDisposable {
  /** Steps not yet served, in order. Tests may push more. */
  readonly script: FakeStep[];
  readonly requests: FakeLlmRequest[] = [];

  /** The last tool result in the last request it received: what the agent's last command printed. */
  lastToolOutput(): string {
    const messages = (this.requests.at(-1)?.body?.messages ?? []) as {
      role: string;
      content: unknown;
    }[];
    const tool = messages.filter((m) => m.role === "tool").at(-1);
    if (!tool) {
      throw new Error(
        `no tool result in the request: ${
          JSON.stringify(this.requests.at(-1)?.body ?? {}).slice(0, 500)
        }`,
      );
    }
    return typeof tool.content === "string" ? tool.content : JSON.stringify(tool.content);
  }
  /** Sum of the usage reported in responses so far. */
  readonly usage: FakeUsage = { promptTokens: 0, completionTokens: 0 };
  /** Number of successful (non-error) completions served. */
  completions = 0;
  /** The only API key it accepts. */
  readonly key: string;
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #waiters: ((request: FakeLlmRequest) => void)[] = [];
  #callIds = 0;

  constructor(script: FakeStep[] = [], options: FakeLlmOptions = {}) {
    this.script = [...script];
    this.key = options.key ?? FAKE_LLM_KEY;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (req) => this.#handle(req),
    );
  }

  get port(): number {
    return this.#server.addr.port;
  }

  /** OpenAI-style base URL: `http://127.0.0.1:PORT/v1`. */
  get baseUrl(): string {
    return `http://127.0.0.1:${this.port}/v1`;
  }

  /** The same endpoint under the credential proxy's prefix: `http://127.0.0.1:PORT/proxy/v1`. */
  get proxyBaseUrl(): string {
    return `http://127.0.0.1:${this.port}/proxy/v1`;
  }

  /** The next request to arrive after this call. */
  nextRequest(): Promise<FakeLlmRequest> {
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }

  async #handle(req: Request): Promise<Response> {
    const url = new URL(req.url);
    const raw = await req.text();
    let body: unknown = null;
    try {
      body = raw ? JSON.parse(raw) : null;
    } catch {
      return errorResponse(400, "Request body is not JSON");
    }
    const recorded: FakeLlmRequest = {
      path: url.pathname,
      headers: new Headers(req.headers),
      body,
    };
    this.requests.push(recorded);
    for (const waiter of this.#waiters.splice(0)) waiter(recorded);

    const route = url.pathname.replace(/^\/proxy/, "");
    const api = route === "/v1/chat/completions"
      ? "openai"
      : route === "/v1/messages"
      ? "anthropic"
      : undefined;
    if (presentedCredential(req.headers) !== this.key) {
      return (api === "anthropic" ? anthropicError : errorResponse)(401, "Invalid API key");
    }
    if (req.method !== "POST" || !api) {
      return errorResponse(404, `No route ${req.method} ${url.pathname}`);
    }
    // deno-lint-ignore no-explicit-any
    if (api === "anthropic" && (body as any)?.stream) {
      return anthropicError(400, "The fake LLM serves Anthropic messages without streaming only");
    }
    const step = this.script.shift();
    const fail = api === "openai" ? errorResponse : anthropicError;
    if (!step) return fail(500, "Fake LLM script exhausted");
    if (step.kind === "http_error") return fail(step.status, step.message);
    return api === "openai"
      ? this.#complete(step, recorded.body)
      : this.#message(step, recorded.body);
  }

  /** Count the step's usage and give its tool calls their ids. */
  #serve(step: Exclude<FakeStep, { kind: "http_error" }>) {
    const usage = step.usage ?? DEFAULT_USAGE;
    this.usage.promptTokens += usage.promptTokens;
    this.usage.completionTokens += usage.completionTokens;
    this.completions++;
    const calls = step.kind === "tool_calls"
      ? step.calls.map((call) => ({ ...call, id: call.id ?? `call_${++this.#callIds}` }))
      : [];
    return { usage, calls, text: step.text ?? null };
  }

  // deno-lint-ignore no-explicit-any
  #message(step: Exclude<FakeStep, { kind: "http_error" }>, request: any): Response {
    const { usage, calls, text } = this.#serve(step);
    const content: unknown[] = text ? [{ type: "text", text }] : [];
    for (const call of calls) {
      content.push({ type: "tool_use", id: call.id, name: call.name, input: call.args });
    }
    return Response.json({
      id: `msg_${this.completions}`,
      type: "message",
      role: "assistant",
      model: typeof request?.model === "string" ? request.model : "fake-model",
      content,
      stop_reason: calls.length ? "tool_use" : "end_turn",
      stop_sequence: null,
      usage: { input_tokens: usage.promptTokens, output_tokens: usage.completionTokens },
    });
  }

  // deno-lint-ignore no-explicit-any
  #complete(step: Exclude<FakeStep, { kind: "http_error" }>, request: any): Response {
    const { usage, calls, text: content } = this.#serve(step);
    const model = typeof request?.model === "string" ? request.model : "fake-model";
    const toolCalls = calls.length
      ? calls.map((call) => ({
        id: call.id,
        type: "function",
        function: { name: call.name, arguments: JSON.stringify(call.args) },
      }))
      : undefined;
    const finishReason = toolCalls ? "tool_calls" : "stop";
    const openaiUsage = {
      prompt_tokens: usage.promptTokens,
      completion_tokens: usage.completionTokens,
      total_tokens: usage.promptTokens + usage.completionTokens,
    };
    const id = `chatcmpl-${this.completions}`;
    if (request?.stream) {
      const chunk = (delta: unknown, finish: string | null = null) =>
        JSON.stringify({
          id,
          object: "chat.completion.chunk",
          created: 0,
          model,
          choices: [{ index: 0, delta, finish_reason: finish }],
        });
      const events = [chunk({ role: "assistant", content: "" })];
      if (content) {
        // Two pieces, to exercise the client's reassembly.
        const half = Math.ceil(content.length / 2);
        events.push(
          chunk({ content: content.slice(0, half) }),
          chunk({ content: content.slice(half) }),
        );
      }
      toolCalls?.forEach((call, index) => {
        events.push(
          chunk({
            tool_calls: [{
              index,
              id: call.id,
              type: "function",
              function: { name: call.function.name, arguments: "" },
            }],
          }),
        );
        events.push(
          chunk({ tool_calls: [{ index, function: { arguments: call.function.arguments } }] }),
        );
      });
      events.push(chunk({}, finishReason));
      if (request.stream_options?.include_usage) {
        events.push(
          JSON.stringify({
            id,
            object: "chat.completion.chunk",
            created: 0,
            model,
            choices: [],
            usage: openaiUsage,
          }),
        );
      }
      events.push("[DONE]");
      const encoder = new TextEncoder();
      return new Response(
        ReadableStream.from(events.map((data) => encoder.encode(`data: ${data}\n\n`))),
        {
          headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
        },
      );
    }
    return Response.json({
      id,
      object: "chat.completion",
      created: 0,
      model,
      choices: [{
        index: 0,
        message: { role: "assistant", content, ...(toolCalls ? { tool_calls: toolCalls } : {}) },
        finish_reason: finishReason,
      }],
      usage: openaiUsage,
    });
  }
}

/** The key of exactly one credential header in a provider's form; `undefined` otherwise. */
function presentedCredential(headers: Headers): string | undefined {
  const authorization = headers.get("authorization");
  const apiKey = headers.get("x-api-key");
  if (authorization !== null && apiKey === null) {
    return authorization.startsWith("Bearer ") ? authorization.slice("Bearer ".length) : undefined;
  }
  if (apiKey !== null && authorization === null) return apiKey;
  return undefined;
}

function anthropicError(status: number, message: string): Response {
  return Response.json(
    { type: "error", error: { type: "invalid_request_error", message } },
    { status },
  );
}

function errorResponse(status: number, message: string): Response {
  return Response.json({ error: { message, type: "fake_llm_error", code: null } }, { status });
}
