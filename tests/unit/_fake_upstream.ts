/**
 * A fake LLM provider on 127.0.0.1 (port 0) for proxy tests: OpenAI-style chat completions
 * (plain and SSE), embeddings and models, and Anthropic-style messages. It records every request
 * it receives, and tests steer it with `behaviour`.
 *
 * Like a real provider it checks credentials: a request must carry exactly its `key`, either as
 * `Authorization: Bearer KEY` or as `x-api-key: KEY`, and no other credential header; anything
 * else (the sandbox's token, the key plus a stray token) is answered 401. So a proxy that forwards
 * the token instead of the key, or beside it, fails every end-to-end request.
 *
 * Behaviours:
 *
 * - "ok": answer normally (SSE when the JSON body has `"stream": true`)
 * - "rate_limited": 429 with an OpenAI-style error body and `retry-after`
 * - "hang": never answer; the handler ends when the request is aborted
 * - "controlled_stream": start an SSE response and let the test send each chunk (`nextStream()`)
 * - "gzip": answer with a gzip-compressed JSON body
 * - "echo_credentials": a malicious upstream that reflects the credential header it received in
 *   the JSON body and in an `x-echo-credential` response header, or for `"stream": true` in an SSE
 *   event sent one byte per chunk
 * - "redirect": answer 307 with `Location: redirectTo` (the same path on another server)
 *
 * Tests synchronise on its events (`nextRequest()`, `nextStream()`, `request.aborted`), never on
 * time.
 */

export type FakeBehaviour =
  | "ok"
  | "rate_limited"
  | "hang"
  | "controlled_stream"
  | "gzip"
  | "echo_credentials"
  | "redirect";

export interface RecordedRequest {
  method: string;
  /** Path and query, e.g. "/v1/chat/completions?x=1". */
  path: string;
  headers: Headers;
  body: string;
  /** Resolves when the request's signal aborts (the client, here the proxy, went away). */
  aborted: Promise<void>;
}

/** The test's hold on a "controlled_stream" response. */
export interface StreamControl {
  /** Send one SSE event (`data: <data>\n\n`). */
  send(data: string): void;
  /** Send `text` as one chunk, as it is (a part of an event, say). */
  sendRaw(text: string): void;
  /** Send a final event if given, then end the response. */
  end(lastData?: string): void;
  /** Resolves when the response body was cancelled by its reader (the proxy). */
  cancelled: Promise<void>;
}

export const RATE_LIMIT_BODY = JSON.stringify({
  error: {
    message: "Rate limit reached for requests",
    type: "requests",
    code: "rate_limit_exceeded",
  },
});

export interface FakeUpstreamOptions {
  /** The API key it accepts; default: a random `sk-fake-…` (see `key`). */
  key?: string;
}

export class FakeUpstream implements AsyncDisposable {
  behaviour: FakeBehaviour = "ok";
  /** Where "redirect" points (a base URL; the request's path is appended). */
  redirectTo = "";
  /** The only API key this upstream accepts. */
  readonly key: string;
  readonly requests: RecordedRequest[] = [];
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #requestWaiters: ((request: RecordedRequest) => void)[] = [];
  readonly #streamWaiters: ((control: StreamControl) => void)[] = [];
  /** Ends hanging handlers and open streams on dispose, so the server can shut down. */
  readonly #stopping = new AbortController();
  readonly #openStreams = new Set<ReadableStreamDefaultController<Uint8Array>>();

  constructor(options: FakeUpstreamOptions = {}) {
    this.key = options.key ?? `sk-fake-${crypto.randomUUID().replaceAll("-", "")}`;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (req) => this.#handle(req),
    );
  }

  get port(): number {
    return this.#server.addr.port;
  }

  /** OpenAI-style base URL, as a provider's `baseUrl`. */
  get baseUrl(): string {
    return `http://127.0.0.1:${this.port}/v1`;
  }

  /** The next request to arrive after this call. */
  nextRequest(): Promise<RecordedRequest> {
    return new Promise((resolve) => this.#requestWaiters.push(resolve));
  }

  /** The next "controlled_stream" response to start after this call. */
  nextStream(): Promise<StreamControl> {
    return new Promise((resolve) => this.#streamWaiters.push(resolve));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#stopping.abort();
    for (const controller of this.#openStreams) {
      try {
        controller.close();
      } catch {
        // Already closed or errored.
      }
    }
    await this.#server.shutdown();
  }

  async #handle(req: Request): Promise<Response> {
    const url = new URL(req.url);
    const recorded: RecordedRequest = {
      method: req.method,
      path: url.pathname + url.search,
      headers: new Headers(req.headers),
      body: await req.text(),
      aborted: req.signal.aborted
        ? Promise.resolve()
        : new Promise((resolve) =>
          req.signal.addEventListener("abort", () => resolve(), { once: true })
        ),
    };
    this.requests.push(recorded);
    for (const waiter of this.#requestWaiters.splice(0)) waiter(recorded);

    const credential = presentedCredential(req.headers);
    if (credential !== this.key) {
      return Response.json({
        error: {
          message: "Incorrect API key provided",
          type: "invalid_request_error",
          code: "invalid_api_key",
        },
      }, { status: 401 });
    }

    switch (this.behaviour) {
      case "rate_limited":
        return new Response(RATE_LIMIT_BODY, {
          status: 429,
          headers: { "content-type": "application/json", "retry-after": "7" },
        });
      case "hang":
        await new Promise<void>((resolve) => {
          const stop = AbortSignal.any([req.signal, this.#stopping.signal]);
          if (stop.aborted) resolve();
          else stop.addEventListener("abort", () => resolve(), { once: true });
        });
        return new Response("too late", { status: 500 });
      case "controlled_stream":
        return this.#controlledStream();
      case "gzip":
        return new Response(
          ReadableStream.from([new TextEncoder().encode(JSON.stringify(modelsList()))])
            .pipeThrough(new CompressionStream("gzip")),
          { headers: { "content-type": "application/json", "content-encoding": "gzip" } },
        );
      case "echo_credentials": {
        const echoed = req.headers.get("authorization") ?? req.headers.get("x-api-key") ?? "";
        if (/"stream"\s*:\s*true/.test(recorded.body)) {
          // The echo as an SSE event, one byte per chunk: a secret split at every boundary.
          const event = new TextEncoder().encode(
            `data: ${chatChunk(`I saw ${echoed}`)}\n\ndata: [DONE]\n\n`,
          );
          return sse(ReadableStream.from([...event].map((byte) => new Uint8Array([byte]))));
        }
        return Response.json(
          { error: { message: `invalid request from ${echoed}`, received: echoed } },
          { status: 400, headers: { "x-echo-credential": echoed } },
        );
      }
      case "redirect":
        return new Response(null, {
          status: 307,
          headers: { location: this.redirectTo.replace(/\/v1$/, "") + url.pathname },
        });
      case "ok":
        return this.#answer(url.pathname, recorded.body);
    }
  }

  #answer(pathname: string, body: string): Response {
    const request = body ? JSON.parse(body) : {};
    switch (pathname) {
      case "/v1/chat/completions":
        if (request.stream) {
          const events = ["Hel", "lo"].map((content) => chatChunk(content)).concat(["[DONE]"]);
          return sse(ReadableStream.from(events.map((data) => encodeEvent(data))));
        }
        return Response.json({
          id: "chatcmpl-1",
          object: "chat.completion",
          model: request.model ?? "fake-model",
          choices: [{
            index: 0,
            message: { role: "assistant", content: "Hello" },
            finish_reason: "stop",
          }],
          usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
        });
      case "/v1/messages":
        return Response.json({
          id: "msg_1",
          type: "message",
          role: "assistant",
          model: request.model ?? "fake-claude",
          content: [{ type: "text", text: "Hello" }],
          stop_reason: "end_turn",
          usage: { input_tokens: 3, output_tokens: 1 },
        });
      case "/v1/embeddings":
        return Response.json({
          object: "list",
          data: [{ object: "embedding", index: 0, embedding: [0.1, 0.2] }],
        });
      case "/v1/models":
        return Response.json(modelsList());
      default:
        return Response.json({ error: { message: `no route ${pathname}` } }, { status: 404 });
    }
  }

  #controlledStream(): Response {
    let cancelled!: () => void;
    const cancelledPromise = new Promise<void>((resolve) => (cancelled = resolve));
    let control!: StreamControl;
    const body = new ReadableStream<Uint8Array>({
      start: (controller) => {
        this.#openStreams.add(controller);
        control = {
          send: (data) => controller.enqueue(encodeEvent(data)),
          sendRaw: (text) => controller.enqueue(new TextEncoder().encode(text)),
          end: (lastData) => {
            if (lastData !== undefined) controller.enqueue(encodeEvent(lastData));
            this.#openStreams.delete(controller);
            controller.close();
          },
          cancelled: cancelledPromise,
        };
      },
      cancel: () => {
        cancelled();
      },
    });
    for (const waiter of this.#streamWaiters.splice(0)) waiter(control);
    return sse(body);
  }
}

/**
 * The key a request presents, when it presents exactly one credential header in one of the two
 * forms providers take; `undefined` for none, two, or a malformed one.
 */
function presentedCredential(headers: Headers): string | undefined {
  const authorization = headers.get("authorization");
  const apiKey = headers.get("x-api-key");
  if (authorization !== null && apiKey === null) {
    return authorization.startsWith("Bearer ") ? authorization.slice("Bearer ".length) : undefined;
  }
  if (apiKey !== null && authorization === null) return apiKey;
  return undefined;
}

function modelsList() {
  return { object: "list", data: [{ id: "fake-model", object: "model", owned_by: "tests" }] };
}

/** One OpenAI streaming chunk carrying `content`, as JSON text. */
export function chatChunk(content: string): string {
  return JSON.stringify({
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    choices: [{ index: 0, delta: { content }, finish_reason: null }],
  });
}

function encodeEvent(data: string): Uint8Array {
  return new TextEncoder().encode(`data: ${data}\n\n`);
}

function sse(body: ReadableStream<Uint8Array>): Response {
  return new Response(body, {
    headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
  });
}
