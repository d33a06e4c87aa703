/**
 * Recorded LLM conversations: a `replay` upstream that serves a recording in order, and a recorder
 * that sits between the credential proxy and a real upstream and writes one.
 *
 * Both are ordinary HTTP servers on loopback that the credential proxy forwards to, so a replayed
 * run exercises every part of `sandbox run` (container, worker, proxy, token) except the real LLM.
 * That makes recordings deterministic CI tests of agent pipelines, and an offline demo.
 */
import { SandboxError } from "../errors.ts";
import { MAX_RECORDING_BYTES, readInputText } from "../input_file.ts";
import type { UpstreamProvider } from "../proxy/credential_proxy.ts";
import { Redactor } from "../redact.ts";
import { recordingProblems } from "./recording_check.ts";

/** One recorded upstream response: a JSON body, or a raw SSE stream. */
export type RecordedResponse =
  | { status: number; body: unknown }
  | { status: number; sse: string };

/**
 * Wire format of a recording's answers: OpenAI Chat Completions (and embeddings), Anthropic
 * Messages, or the OpenAI Responses API (what Codex speaks).
 */
export type RecordingKind = "openai" | "anthropic" | "openai-responses";

export interface Recording {
  version: 1;
  kind: RecordingKind;
  responses: RecordedResponse[];
}

/** The API (and so the credential's form) of the upstream a recording stands in for. */
export function recordingApi(kind: RecordingKind): "openai" | "anthropic" {
  return kind === "anthropic" ? "anthropic" : "openai";
}

export interface LocalUpstream extends AsyncDisposable {
  upstream: UpstreamProvider;
  /** How many responses were served or recorded. */
  readonly count: number;
  close(): Promise<void>;
}

/**
 * Read (at most `MAX_RECORDING_BYTES`) and check a recording file: every entry, so that a bad one
 * fails here, not mid-run.
 */
export async function loadRecording(path: string): Promise<Recording> {
  const text = await readInputText(path, MAX_RECORDING_BYTES, { what: "recording" });
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new SandboxError(
      "usage",
      `Invalid recording "${path}": not JSON (${(error as Error).message})`,
    );
  }
  const problems = recordingProblems(parsed);
  if (problems.length > 0) {
    throw new SandboxError("usage", `Invalid recording "${path}"`, { detail: problems.join("\n") });
  }
  return parsed as Recording;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function isLlmCall(path: string): boolean {
  return /\/(chat\/completions|messages|embeddings|responses)$/.test(path);
}

/** Token counting is a question about a request, not an answer of the model: never recorded. */
function isTokenCount(path: string): boolean {
  return path.endsWith("/messages/count_tokens");
}

/** Serve `recording`'s responses, one per LLM call, in order. */
export function startReplayUpstream(recording: Recording, name = "replay"): LocalUpstream {
  let next = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const path = new URL(req.url).pathname;
    const body = await req.text();
    if (path.endsWith("/models")) {
      return Response.json({ object: "list", data: [{ id: "replay", object: "model" }] });
    }
    // An estimate (a token is about four characters): a replayed run's context sizing needs a
    // plausible figure, and taking one from the recording would shift every answer after it.
    if (isTokenCount(path)) return Response.json({ input_tokens: Math.ceil(body.length / 4) });
    if (!isLlmCall(path)) {
      return Response.json({ error: { message: `replay: no route ${path}` } }, { status: 404 });
    }
    if (path.endsWith("/responses") !== (recording.kind === "openai-responses")) {
      // Answers of one API served to a client of another would fail in obscure ways inside it.
      const holds = recording.kind === "openai-responses"
        ? "OpenAI Responses API"
        : recording.kind === "anthropic"
        ? "Anthropic Messages"
        : "OpenAI Chat Completions";
      return Response.json(
        {
          error: {
            type: "replay_mismatch",
            message: `replay: the recording holds ${holds} answers; the agent called ${path}`,
          },
        },
        { status: 400 },
      );
    }
    const recorded = recording.responses[next];
    if (!recorded) {
      // 400, not 5xx: clients retry server errors, and a replay that ran out never recovers.
      return Response.json(
        {
          error: {
            type: "replay_exhausted",
            message: `replay: the recording has only ${
              plural(recording.responses.length, "response")
            }; the agent asked for more`,
          },
        },
        { status: 400 },
      );
    }
    next++;
    const wantsStream = /"stream"\s*:\s*true/.test(body);
    if ("sse" in recorded) {
      return new Response(recorded.sse, {
        status: recorded.status,
        headers: { "content-type": "text/event-stream" },
      });
    }
    if (wantsStream && recording.kind === "openai" && recorded.status === 200) {
      return new Response(completionToSse(recorded.body), {
        headers: { "content-type": "text/event-stream" },
      });
    }
    return Response.json(recorded.body, { status: recorded.status });
  });
  const close = () => server.shutdown();
  return {
    upstream: {
      name,
      kind: recordingApi(recording.kind),
      baseUrl: `http://127.0.0.1:${server.addr.port}/v1`,
      key: () => Promise.resolve("replay-needs-no-key"),
    },
    get count() {
      return next;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** An OpenAI chat.completion as the SSE chunks a streaming request would have received. */
function completionToSse(completion: unknown): string {
  const c = completion as {
    id?: string;
    model?: string;
    created?: number;
    choices?: {
      index?: number;
      message?: { role?: string; content?: string | null; tool_calls?: unknown[] };
      finish_reason?: string;
    }[];
    usage?: unknown;
  };
  const base = {
    id: c.id ?? "replay",
    object: "chat.completion.chunk",
    created: c.created ?? 0,
    model: c.model ?? "replay",
  };
  const events = (c.choices ?? []).map((choice) => ({
    ...base,
    choices: [{
      index: choice.index ?? 0,
      delta: {
        role: choice.message?.role ?? "assistant",
        content: choice.message?.content ?? null,
        ...(choice.message?.tool_calls
          ? {
            tool_calls: choice.message.tool_calls.map((t, i) => ({ index: i, ...(t as object) })),
          }
          : {}),
      },
      finish_reason: choice.finish_reason ?? "stop",
    }],
  }));
  if (c.usage) events.push({ ...base, choices: [], usage: c.usage } as never);
  return events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join("") + "data: [DONE]\n\n";
}

export interface RecorderOptions {
  /**
   * Every secret it knows is redacted from the recording, as is `real`'s key (a private redactor
   * is used when none is given).
   */
  redactor?: Redactor;
}

/**
 * Forward to `real`, recording every LLM response; the recording is written to `path` on close.
 * The credential proxy in front has already attached the key; the recorder never stores headers,
 * and redacts known secrets from what it stores: an upstream may echo the key in a response.
 */
export function startRecorder(
  real: UpstreamProvider,
  path: string,
  options: RecorderOptions = {},
): LocalUpstream {
  const redactor = options.redactor ?? new Redactor();
  const responses: RecordedResponse[] = [];
  /** Whether every recorded call was to the Responses API (then the recording is of that kind). */
  let responsesOnly = true;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const url = new URL(req.url);
    const suffix = url.pathname.replace(/^\/v1/, "");
    const headers = new Headers(req.headers);
    headers.delete("host");
    headers.delete("content-length");
    const upstream = await fetch(`${real.baseUrl}${suffix}${url.search}`, {
      method: req.method,
      headers,
      body: req.method === "GET" ? undefined : await req.arrayBuffer(),
      signal: req.signal,
      redirect: "manual",
    });
    if (!isLlmCall(url.pathname)) return upstream;
    if (!url.pathname.endsWith("/responses")) responsesOnly = false;
    const text = await upstream.text();
    const type = upstream.headers.get("content-type") ?? "";
    responses.push(
      type.includes("text/event-stream")
        ? { status: upstream.status, sse: text }
        : { status: upstream.status, body: safeJson(text) },
    );
    return new Response(text, {
      status: upstream.status,
      headers: { "content-type": type || "application/json" },
    });
  });
  const close = async () => {
    await server.shutdown();
    // The key is registered at the last moment, so the recording is redacted even when nothing
    // else resolved it into this redactor; a key that cannot be read was never sent either.
    redactor.add(await real.key().catch(() => ""));
    const kind = real.kind === "openai" && responses.length > 0 && responsesOnly
      ? "openai-responses"
      : real.kind;
    const recording: Recording = { version: 1, kind, responses };
    // Redacting the serialised text catches a secret anywhere: in SSE text, JSON values and keys
    // (the redactor knows each secret's JSON-escaped spelling too), and the result is still JSON.
    await Deno.writeTextFile(path, redactor.redactJson(JSON.stringify(recording, null, 2)) + "\n");
  };
  return {
    upstream: {
      ...real,
      name: `${real.name} (recording)`,
      baseUrl: `http://127.0.0.1:${server.addr.port}/v1`,
    },
    get count() {
      return responses.length;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
