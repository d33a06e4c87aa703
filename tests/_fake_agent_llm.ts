/**
 * A scripted fake LLM on 127.0.0.1 (port 0) for the agent CLIs' end-to-end tests, speaking what
 * they speak, streamed as the real APIs stream it (hand-written SSE, event for event):
 *
 * - `anthropic`: Anthropic Messages (`POST …/v1/messages`, SSE: message_start, content blocks
 *   with their deltas, message_delta with the stop reason and usage, message_stop), and token
 *   counting (`POST …/v1/messages/count_tokens`), for Claude Code;
 * - `responses`: the OpenAI Responses API (`POST …/v1/responses`, SSE: response.created, each
 *   output item added and done, response.completed with usage), for Codex.
 *
 * Each model call takes the next step of the script: a tool call (with optional text or
 * reasoning before it) or a final text. It requires the key (`x-api-key`, or `Authorization:
 * Bearer`) and answers 401 without it, so a test passes only when the credential proxy attached
 * it. `hold()` makes the next model call wait until the test releases it, so that a test can look
 * inside the sandbox while the agent is running. Every request is recorded.
 */

export type AgentStep =
  | {
    kind: "tool";
    name: string;
    input: Record<string, unknown>;
    text?: string;
    reasoning?: string;
  }
  | { kind: "text"; text: string };

/** A step made from the request it answers (to use what an earlier tool call returned). */
export type DynamicStep = (request: AgentLlmRequest) => AgentStep;

export interface AgentLlmRequest {
  path: string;
  headers: Headers;
  // deno-lint-ignore no-explicit-any
  body: any;
}

export const STEP_USAGE = { input: 120, output: 30, cacheRead: 40 };

function sse(events: Record<string, unknown>[]): string {
  return events.map((event) => `event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`).join("");
}

/** One model turn as Anthropic Messages SSE; `n` numbers its ids. */
export function anthropicSse(step: AgentStep, n: number, model: string): string {
  const events: Record<string, unknown>[] = [{
    type: "message_start",
    message: {
      id: `msg_${n}`,
      type: "message",
      role: "assistant",
      model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: {
        input_tokens: STEP_USAGE.input,
        cache_read_input_tokens: STEP_USAGE.cacheRead,
        cache_creation_input_tokens: 0,
        output_tokens: 1,
      },
    },
  }];
  const blocks: { start: Record<string, unknown>; delta: Record<string, unknown> }[] = [];
  if (step.kind === "tool" && step.reasoning) {
    blocks.push({
      start: { type: "thinking", thinking: "", signature: "" },
      delta: { type: "thinking_delta", thinking: step.reasoning },
    });
  }
  const text = step.text;
  if (text) blocks.push({ start: { type: "text", text: "" }, delta: { type: "text_delta", text } });
  if (step.kind === "tool") {
    blocks.push({
      start: { type: "tool_use", id: `toolu_${n}`, name: step.name, input: {} },
      delta: { type: "input_json_delta", partial_json: JSON.stringify(step.input) },
    });
  }
  blocks.forEach((block, index) => {
    events.push({ type: "content_block_start", index, content_block: block.start });
    events.push({ type: "content_block_delta", index, delta: block.delta });
    if (block.start.type === "thinking") {
      events.push({
        type: "content_block_delta",
        index,
        delta: { type: "signature_delta", signature: "c2ln" },
      });
    }
    events.push({ type: "content_block_stop", index });
  });
  events.push({
    type: "message_delta",
    delta: { stop_reason: step.kind === "tool" ? "tool_use" : "end_turn", stop_sequence: null },
    usage: { output_tokens: STEP_USAGE.output },
  });
  events.push({ type: "message_stop" });
  return sse(events);
}

/** One model turn as OpenAI Responses SSE; `n` numbers its ids. */
export function responsesSse(step: AgentStep, n: number, model: string): string {
  const output: Record<string, unknown>[] = [];
  if (step.kind === "tool" && step.reasoning) {
    output.push({
      type: "reasoning",
      id: `rs_${n}`,
      summary: [{ type: "summary_text", text: step.reasoning }],
    });
  }
  const text = step.text;
  if (text) {
    output.push({
      type: "message",
      id: `msg_${n}`,
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text, annotations: [] }],
    });
  }
  if (step.kind === "tool") {
    output.push({
      type: "function_call",
      id: `fc_${n}`,
      call_id: `call_${n}`,
      name: step.name,
      arguments: JSON.stringify(step.input),
      status: "completed",
    });
  }
  const response = {
    id: `resp_${n}`,
    object: "response",
    created_at: 1_700_000_000 + n,
    model,
    status: "in_progress",
    output: [] as unknown[],
  };
  const events: Record<string, unknown>[] = [{
    type: "response.created",
    sequence_number: 0,
    response,
  }];
  output.forEach((item, index) => {
    events.push({
      type: "response.output_item.added",
      output_index: index,
      item: { ...item, status: "in_progress" },
    });
    events.push({ type: "response.output_item.done", output_index: index, item });
  });
  events.push({
    type: "response.completed",
    response: {
      ...response,
      status: "completed",
      output,
      usage: {
        input_tokens: STEP_USAGE.input,
        input_tokens_details: { cached_tokens: STEP_USAGE.cacheRead },
        output_tokens: STEP_USAGE.output,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: STEP_USAGE.input + STEP_USAGE.output,
      },
    },
  });
  return sse(events.map((event, i) => ({ ...event, sequence_number: i })));
}

export class FakeAgentLlm implements AsyncDisposable {
  readonly requests: AgentLlmRequest[] = [];
  readonly #script: (AgentStep | DynamicStep)[];
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  #served = 0;
  #closed = false;
  #hold: { reached: () => void; released: Promise<void> } | undefined;
  /**
   * How the Anthropic API takes the credential: an API key as `x-api-key`, or a subscription
   * (OAuth) token as `Authorization: Bearer`, which it takes only with the OAuth beta flag.
   */
  anthropicAuth: "x-api-key" | "oauth" = "x-api-key";

  constructor(
    readonly api: "anthropic" | "responses",
    script: (AgentStep | DynamicStep)[],
    readonly key: string,
    readonly model = "fake-model",
  ) {
    this.#script = [...script];
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (req) => this.#handle(req),
    );
  }

  /** The provider base URL a profile names: `http://127.0.0.1:PORT/v1`. */
  get baseUrl(): string {
    return `http://127.0.0.1:${this.#server.addr.port}/v1`;
  }

  /** Model answers served so far. */
  get served(): number {
    return this.#served;
  }

  /** The next model call waits for `release()`; `reached` resolves when it has arrived. */
  hold(): { reached: Promise<void>; release: () => void } {
    let reached!: () => void;
    let release!: () => void;
    const arrived = new Promise<void>((resolve) => reached = resolve);
    const released = new Promise<void>((resolve) => release = resolve);
    this.#hold = { reached, released };
    return { reached: arrived, release };
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#server.shutdown();
  }

  async #handle(req: Request): Promise<Response> {
    const url = new URL(req.url);
    const raw = await req.text();
    let body: unknown = null;
    try {
      body = raw ? JSON.parse(raw) : null;
    } catch {
      body = raw;
    }
    this.requests.push({ path: url.pathname, headers: new Headers(req.headers), body });
    const bearer = req.headers.get("authorization") === `Bearer ${this.key}`;
    const oauth = bearer && req.headers.get("x-api-key") === null &&
      (req.headers.get("anthropic-beta") ?? "").split(",").some((flag) =>
        flag.trim() === "oauth-2025-04-20"
      );
    const keyed = this.api !== "anthropic"
      ? bearer
      : this.anthropicAuth === "oauth"
      ? oauth
      : req.headers.get("x-api-key") === this.key;
    if (!keyed) {
      return Response.json({
        type: "error",
        error: { type: "authentication_error", message: "invalid key" },
      }, { status: 401 });
    }
    if (this.api === "anthropic" && url.pathname === "/v1/messages/count_tokens") {
      return Response.json({ input_tokens: 10 });
    }
    const route = this.api === "anthropic" ? "/v1/messages" : "/v1/responses";
    if (url.pathname !== route) {
      return Response.json({ error: { type: "not_found", message: `no route ${url.pathname}` } }, {
        status: 404,
      });
    }
    const hold = this.#hold;
    if (hold) {
      this.#hold = undefined;
      hold.reached();
      await hold.released;
    }
    const next = this.#script.shift();
    const step = typeof next === "function" ? next(this.requests.at(-1)!) : next;
    if (!step) {
      return Response.json({
        type: "error",
        error: { type: "invalid_request_error", message: "fake: the script is exhausted" },
      }, { status: 400 });
    }
    const n = ++this.#served;
    const text = this.api === "anthropic"
      ? anthropicSse(step, n, this.model)
      : responsesSse(step, n, this.model);
    return new Response(text, { headers: { "content-type": "text/event-stream" } });
  }
}
