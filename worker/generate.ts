/**
 * `worker generate`: one LLM call, no tools of the agent's. With a JSON Schema the provider is
 * asked for structured output, and the answer is then parsed and validated here:
 *
 * - OpenAI API: `response_format: json_schema` (non-strict, so any schema is accepted), the schema
 *   also stated in a system message for providers that ignore `response_format`;
 * - Anthropic API: one tool whose input schema is the schema, and `tool_choice` forcing it.
 *
 * The result's content is the validated JSON, compact; output that is not JSON or fails the schema
 * becomes an `is_error` result saying why.
 */
import type { ChatOpenAI, ChatOpenAICallOptions } from "@langchain/openai";
import type { ChatAnthropic } from "@langchain/anthropic";
import {
  AIMessage,
  type AIMessageChunk,
  type BaseMessage,
  HumanMessage,
  SystemMessage,
} from "@langchain/core/messages";
import type { Emitter } from "./emit.ts";
import { checkJson, type JsonSchema } from "./json_schema.ts";
import {
  createChatModel,
  describeError,
  emitOutcome,
  type LlmSettings,
  messageText,
  type UsageTracker,
} from "./llm.ts";

export interface GenerateOptions {
  prompt: string;
  schema?: JsonSchema;
  llm: LlmSettings;
}

/** Make the call and emit the result and the usage. Never throws after starting. */
export async function runGenerate(options: GenerateOptions, emit: Emitter): Promise<void> {
  await emitOutcome(
    emit,
    options.llm.model,
    (tracker) => generate(options, tracker),
    (error) => `Generation failed: ${describeError(error)}`,
  );
}

async function generate(
  options: GenerateOptions,
  tracker: UsageTracker,
): Promise<{ content: string; isError: boolean }> {
  const chat = createChatModel(options.llm, tracker, { streamable: true });
  const { schema } = options;
  const prompt = new HumanMessage(options.prompt);
  if (!schema) {
    const reply = await chat.invoke([prompt]);
    return { content: messageText(reply.content), isError: false };
  }
  const answer = options.llm.api === "anthropic"
    ? await askAnthropic(chat as ChatAnthropic, prompt, schema)
    : await askOpenAi(chat as ChatOpenAI, prompt, schema);
  const checked = checkJson(answer, schema);
  return checked.ok
    ? { content: JSON.stringify(checked.value), isError: false }
    : { content: checked.problem, isError: true };
}

/**
 * Streamed on purpose: a non-streaming call with a `json_schema` response format goes through the
 * OpenAI SDK's `parse()`, which throws away the text of a reply that is not JSON (so no fence
 * tolerance and no useful message). `stream()` reports usage from the final chunk.
 */
async function askOpenAi(chat: ChatOpenAI, prompt: BaseMessage, schema: JsonSchema) {
  const messages = [
    new SystemMessage(
      "Answer with one JSON value only, no prose and no code fence. It must be valid against " +
        `this JSON Schema:\n${JSON.stringify(schema.schema)}`,
    ),
    prompt,
  ];
  const callOptions: Partial<ChatOpenAICallOptions> = {
    response_format: {
      type: "json_schema",
      json_schema: {
        name: schema.name,
        schema: schema.schema as Record<string, unknown>,
        strict: false,
      },
    },
  };
  let whole: AIMessageChunk | undefined;
  for await (const chunk of await chat.stream(messages, callOptions)) {
    whole = whole ? whole.concat(chunk) : chunk;
  }
  return whole ? messageText(whole.content) : "";
}

/** The forced tool call's input as JSON text, or the reply's text if the model did not call it. */
async function askAnthropic(chat: ChatAnthropic, prompt: BaseMessage, schema: JsonSchema) {
  const tool = {
    name: schema.name,
    description: "Record the answer. Its input is the whole answer.",
    input_schema: schema.schema as Record<string, unknown> & { type: "object" },
  };
  const reply = await chat.bindTools([tool], { tool_choice: schema.name }).invoke([prompt]);
  const call = AIMessage.isInstance(reply) ? reply.tool_calls?.[0] : undefined;
  return call ? JSON.stringify(call.args) : messageText(reply.content);
}
