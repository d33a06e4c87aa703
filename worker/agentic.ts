/**
 * `worker agentic`: a deepagents agent working on the real disk in the working directory.
 *
 * Tools (ls, read_file, write_file, edit_file, delete, glob, grep, execute, and task for a
 * sub-agent) come from deepagents' `LocalShellBackend` with `virtualMode: false`: file tools take
 * real paths (relative ones resolve under the working directory), the same paths the shell sees;
 * `execute` runs `sh -c` in the working directory with the environment the host gave the worker.
 * Containment is the sandbox's job, not this backend's.
 *
 * What deepagents writes for itself goes where the run may write: a tool result too large for the
 * conversation (over 80,000 characters) is evicted to a file under `/large_tool_results/` and the
 * agent gets a notice with its head and tail, and offloaded conversation history goes under
 * `/conversation_history/`. Those paths are deepagents' own, at the filesystem root, which is
 * read-only in the sandbox: a `CompositeBackend` routes them to a directory of the run's own,
 * made under the temporary directory when the agent starts (`/tmp`, which goes with the run's container) and
 * removed when it ends. File tools reach the files at those paths, the shell in that directory
 * (the system prompt says where). A command's output is kept whole up to `MAX_COMMAND_OUTPUT_BYTES`
 * (deepagents' default, 100 KB, would cut the tail of a test log before it is evicted).
 *
 * Each new message of the agent's state becomes wire messages as it appears: assistant text as
 * `thinking`, each tool call as `tool_call`, each tool message as `tool_result` (a sub-agent's own
 * steps are not streamed: only its `task` call and result). The final assistant text is the
 * `result`, also sent as `thinking` before it, as the Python worker did.
 */
import {
  CompositeBackend,
  createDeepAgent,
  FilesystemBackend,
  LocalShellBackend,
} from "deepagents";
import { modelCallLimitMiddleware } from "langchain";
import { AIMessage, type BaseMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
import { Emitter } from "./emit.ts";
import { StdoutWriter } from "../lib/output.ts";
import { normalizeToolName } from "../lib/run/tool_names.ts";
import {
  createChatModel,
  describeError,
  emitOutcome,
  type LlmSettings,
  messageText,
  type UsageTracker,
} from "./llm.ts";

/** Seconds one `execute` command may run before it is killed. */
export const COMMAND_TIMEOUT_S = 300;
/** Bytes of a command's output the agent gets (evicted to a file past deepagents' limit). */
export const MAX_COMMAND_OUTPUT_BYTES = 8 * 1024 * 1024;
/** deepagents' own paths, at the filesystem root, routed to the run's directory (see above). */
export const EVICTION_ROUTES = ["/large_tool_results/", "/conversation_history/"] as const;

export interface AgenticOptions {
  prompt: string;
  /** Extra system instructions, added to the system prompt. */
  instructions?: string;
  cwd: string;
  /** Stop with an error result after this many LLM calls. */
  maxTurns?: number;
  /** The environment of `execute` commands: the one the host gave the worker. */
  toolEnv: Record<string, string>;
  llm: LlmSettings;
}

/** The warm-up model's one answer: a final message, no tool call (OpenAI's chat completion). */
const WARM_UP_ANSWER = JSON.stringify({
  id: "warm-up",
  object: "chat.completion",
  created: 0,
  model: "warm-up",
  choices: [{ index: 0, message: { role: "assistant", content: "done" }, finish_reason: "stop" }],
  usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
});

/**
 * Run an agent once, to its end, the way a job's runs (`runAgentic`), against a model served by
 * this process on loopback that answers at once, its events discarded: what a worker waiting for
 * its job in a pooled container does so that the job's agent is built and run — its first HTTP
 * connection, the answer's parsing, the middleware, the events' encoding — by code that is already
 * compiled. Holds no secret, reaches nothing outside this process (the server is gone when it
 * returns); never throws.
 */
export async function warmUpAgentic(): Promise<void> {
  let server: Deno.HttpServer<Deno.NetAddr>;
  try {
    server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (request) => {
        await request.body?.cancel();
        return new Response(WARM_UP_ANSWER, { headers: { "content-type": "application/json" } });
      },
    );
  } catch {
    // Not allowed to listen (a worker run with fewer permissions than the tool gives it): no warm-up.
    return;
  }
  const discarded = new StdoutWriter({ write: (bytes) => Promise.resolve(bytes.byteLength) });
  try {
    await runAgentic({
      prompt: "warm-up",
      cwd: "/",
      toolEnv: {},
      llm: {
        api: "openai",
        baseUrl: `http://127.0.0.1:${server.addr.port}/v1`,
        token: "warm-up",
        model: "warm-up",
        maxRetries: 0,
      },
    }, new Emitter(discarded));
  } catch {
    // A warm-up that fails leaves the job to compile what it did not reach: nothing else changes.
  } finally {
    await server.shutdown();
  }
}

/** Run the agent, emitting its events, the result and the usage. Never throws after starting. */
export async function runAgentic(options: AgenticOptions, emit: Emitter): Promise<void> {
  await emitOutcome(
    emit,
    options.llm.model,
    (tracker) => streamAgent(options, emit, tracker),
    (error) => failureText(error, options.maxTurns),
  );
}

async function streamAgent(
  options: AgenticOptions,
  emit: Emitter,
  tracker: UsageTracker,
): Promise<{ content: string; isError: boolean }> {
  const evicted = await Deno.makeTempDir({ prefix: "sandbox-agent-files-" });

  try {
    for (const route of EVICTION_ROUTES) await Deno.mkdir(`${evicted}${route}`);
    return await streamAgentWith(options, emit, tracker, evicted);
  } finally {
    await Deno.remove(evicted, { recursive: true }).catch(() => {}); // /tmp goes with the run's container anyway
  }
}

/** The agent's tools: the real disk and shell, with deepagents' own paths routed to `evicted`. */
function agentBackend(options: AgenticOptions, evicted: string): CompositeBackend {
  const shell = new LocalShellBackend({
    rootDir: options.cwd,
    virtualMode: false,
    timeout: COMMAND_TIMEOUT_S,
    maxOutputBytes: MAX_COMMAND_OUTPUT_BYTES,
    inheritEnv: false,
    env: options.toolEnv,
  });
  const routes = Object.fromEntries(
    EVICTION_ROUTES.map((
      route,
    ) => [route, new FilesystemBackend({ rootDir: `${evicted}${route}`, virtualMode: true })]),
  );
  return new CompositeBackend(shell, routes);
}

async function streamAgentWith(
  options: AgenticOptions,
  emit: Emitter,
  tracker: UsageTracker,
  evicted: string,
): Promise<{ content: string; isError: boolean }> {
  const model = options.llm.model;

  const agent = createDeepAgent({
    model: createChatModel(options.llm, tracker),
    backend: agentBackend(options, evicted),
    systemPrompt: systemPrompt(options, evicted),
    middleware: options.maxTurns === undefined
      ? []
      : [modelCallLimitMiddleware({ runLimit: options.maxTurns, exitBehavior: "error" })],
  });

  const seen = new Set<string>();

  const seenWithoutId = new WeakSet<BaseMessage>();
  const toolNames = new Map<string, string>();
  let finalText = "";
  // The host went away (stdout closed, e.g. its `docker exec` client was killed): stop the agent
  // instead of letting it work on with nobody listening.
  const hostGone = new AbortController();
  const stream = await agent.stream(
    { messages: [new HumanMessage(options.prompt)] },
    { streamMode: "values", signal: hostGone.signal },
  );
  for await (const state of stream) {
    const messages: BaseMessage[] = (state as { messages?: BaseMessage[] }).messages ?? [];
    for (const message of messages) {
      if (message.id ? seen.has(message.id) : seenWithoutId.has(message)) continue;
      if (message.id) seen.add(message.id);
      else seenWithoutId.add(message);
      if (AIMessage.isInstance(message)) {
        const text = messageText(message.content);
        if (text) await emit.event({ type: "thinking", content: text, model });
        for (const call of message.tool_calls ?? []) {
          if (call.id) toolNames.set(call.id, call.name);
          await emit.event({
            type: "tool_call",
            tool_name: normalizeToolName(call.name),
            tool_input: call.args,
            tool_call_id: call.id ?? null,
            model,
          });
        }
        if (!message.tool_calls?.length) finalText = text;
      } else if (ToolMessage.isInstance(message)) {
        const output = typeof message.content === "string"
          ? message.content
          : messageText(message.content) || JSON.stringify(message.content);
        const name = message.name ?? toolNames.get(message.tool_call_id) ?? null;
        await emit.event({
          type: "tool_result",
          // As the seeds' worker: a result whose tool is not known is named "unknown".
          tool_name: normalizeToolName(name ?? "unknown"),
          tool_output: output,
          tool_call_id: message.tool_call_id,
          is_error: message.status === "error" || (name === "execute" && commandFailed(output)),
          model,
        });
      }
    }
    if (emit.closed) {
      hostGone.abort();
      return { content: "Stopped: stdout was closed", isError: true };
    }
  }
  return { content: finalText, isError: false };
}

/** deepagents ends `execute` output with "[Command failed with exit code N]" on failure. */
function commandFailed(output: string): boolean {
  return /\[Command failed with exit code \d+\](\n\[Output was truncated[^\]]*\])?$/.test(output);
}

const BASE_PROMPT = [
  "You are a coding agent working autonomously in a sandbox.",
  "Nobody will answer questions during the run: make reasonable decisions and carry the task through.",
  "Use the tools to inspect and change files and to run commands, and check your work (run the code",
  "or its tests) where you can. When you are done, reply with a short summary of what you did and of",
  "anything left undone.",
].join(" ");

/** Base prompt, then the caller's instructions, then where the agent works. */
function systemPrompt(options: AgenticOptions, evicted?: string): string {
  const where = [
    `Your working directory is ${options.cwd}.`,
    "File tools take absolute paths: use paths under the working directory.",
    "Shell commands run with the working directory as their current directory.",
    ...(evicted
      ? [
        `Tool results saved under ${EVICTION_ROUTES[0]} (file tools) are in ${evicted}${
          EVICTION_ROUTES[0]
        } for shell commands.`,
      ]
      : []),
  ].join(" ");
  return [BASE_PROMPT, options.instructions?.trim(), where].filter(Boolean).join("\n\n");
}

function failureText(error: unknown, maxTurns: number | undefined): string {
  if (error instanceof Error && error.name === "ModelCallLimitMiddlewareError") {
    return `Agent stopped: reached the limit of ${maxTurns} turns (--max-turns)`;
  }
  return `Agent failed: ${describeError(error)}`;
}
