/**
 * `worker generate`: one LLM call, no tools. With a JSON Schema, the provider is asked for
 * structured output (`response_format: json_schema`, non-strict so any schema is accepted, and the
 * schema is also stated in a system message for providers that ignore `response_format`); the
 * answer is then parsed and validated here. The result's content is the validated JSON, compact;
 * output that is not JSON or fails the schema becomes an `is_error` result saying why.
 */
import { HumanMessage, SystemMessage } from "@langchain/core/messages";
import type { Emitter } from "./emit.ts";
import { checkJson, type JsonSchema } from "./json_schema.ts";
import { createChatModel, describeError, type LlmSettings, messageText, UsageTracker } from "./llm.ts";

export interface GenerateOptions {
  prompt: string;
  schema?: JsonSchema;
  llm: LlmSettings;
}

/** Make the call and emit the result and the usage. Never throws after starting. */
export async function runGenerate(options: GenerateOptions, emit: Emitter): Promise<void> {
  const started = performance.now();
  const model = options.llm.model;
  const tracker = new UsageTracker();
  let result: { content: string; isError: boolean };
  try {
    result = await generate(options, tracker);
  } catch (error) {
    result = { content: `Generation failed: ${describeError(error)}`, isError: true };
  }
  await emit.result(result.content, { isError: result.isError, model });
  await emit.usage(tracker.usage(model, performance.now() - started));
}

async function generate(
  options: GenerateOptions,
  tracker: UsageTracker,
): Promise<{ content: string; isError: boolean }> {
  const chat = createChatModel(options.llm, tracker);
  const { schema } = options;
  if (!schema) {
    const reply = await chat.invoke([new HumanMessage(options.prompt)]);
    return { content: messageText(reply.content), isError: false };
  }
  const reply = await chat.invoke(
    [
      new SystemMessage(
        "Answer with one JSON value only, no prose and no code fence. It must be valid against " +
          `this JSON Schema:\n${JSON.stringify(schema.schema)}`,
      ),
      new HumanMessage(options.prompt),
    ],
    {
      response_format: {
        type: "json_schema",
        json_schema: { name: schema.name, schema: schema.schema as Record<string, unknown>, strict: false },
      },
    },
  );
  const checked = checkJson(messageText(reply.content), schema);
  return checked.ok
    ? { content: JSON.stringify(checked.value), isError: false }
    : { content: checked.problem, isError: true };
}
