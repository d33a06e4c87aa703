/**
 * The agent CLIs' event streams translated into the seeds' messages, fed with sequences shaped as
 * the pinned versions print them (Claude Code 2.1.330 `stream-json`, Codex 0.169.0 `exec --json`;
 * trimmed copies of real output, plus the item kinds the runs here did not produce, from Codex's
 * exec_events.rs). Every message also passes the seeds' schema by going through the strict codec.
 */
import assert from "node:assert/strict";
import { ClaudeCodeTranslator } from "../../lib/agents/claude_code_events.ts";
import { CodexTranslator } from "../../lib/agents/codex_events.ts";
import { type EventTranslator, translateAgentLines } from "../../lib/agents/translate.ts";
import { type AgenticMessage, MAX_TOOL_OUTPUT_CHARS } from "../../lib/run/protocol.ts";

async function translate(
  translator: EventTranslator,
  events: (Record<string, unknown> | string)[],
): Promise<{ messages: AgenticMessage[]; seen: { line: string; known: boolean }[] }> {
  const seen: { line: string; known: boolean }[] = [];
  const lines = events.map((e) => typeof e === "string" ? e : JSON.stringify(e));
  const messages = await Array.fromAsync(
    translateAgentLines(ReadableStream.from(lines), translator, {
      onEvent: (line, known) => void seen.push({ line, known }),
    }),
  );
  return { messages, seen };
}

/** `type` (and `tool_name`) of each message, for shape assertions. */
function shape(messages: AgenticMessage[]): string[] {
  return messages.map((m) => m.tool_name ? `${m.type}:${m.tool_name}` : m.type);
}

const SESSION = "40494dfa-0caa-4b79-a9b1-f76f986f60b5";

/** Claude Code writing a file, running a command that fails, then answering (real shapes). */
const CLAUDE_RUN: Record<string, unknown>[] = [
  {
    type: "system",
    subtype: "init",
    cwd: "/workspace/worktrees/run-1",
    session_id: SESSION,
    tools: ["Task", "Bash", "Write"],
    mcp_servers: [],
    model: "claude-sonnet-4-5",
    permissionMode: "bypassPermissions",
    apiKeySource: "ANTHROPIC_API_KEY",
    claude_code_version: "2.1.330",
  },
  {
    type: "assistant",
    message: {
      id: "msg_1",
      type: "message",
      role: "assistant",
      model: "claude-sonnet-4-5",
      content: [
        { type: "thinking", thinking: "A script, then run it.", signature: "sig" },
        { type: "text", text: "I will write the script." },
        {
          type: "tool_use",
          id: "toolu_1",
          name: "Write",
          input: { file_path: "greet.sh", content: "echo hello\n" },
        },
      ],
      stop_reason: null,
      usage: { input_tokens: 10, output_tokens: 1 },
    },
    parent_tool_use_id: null,
    session_id: SESSION,
  },
  {
    type: "user",
    message: {
      role: "user",
      content: [{
        tool_use_id: "toolu_1",
        type: "tool_result",
        content: "File created successfully at: greet.sh",
      }],
    },
    parent_tool_use_id: null,
    session_id: SESSION,
    tool_use_result: { type: "create", filePath: "greet.sh" },
  },
  {
    type: "assistant",
    message: {
      id: "msg_2",
      role: "assistant",
      model: "claude-sonnet-4-5",
      content: [{
        type: "tool_use",
        id: "toolu_2",
        name: "Bash",
        input: { command: "sh greet.sh && false", description: "run" },
      }],
    },
    parent_tool_use_id: null,
    session_id: SESSION,
  },
  {
    type: "user",
    message: {
      role: "user",
      content: [{
        tool_use_id: "toolu_2",
        type: "tool_result",
        content: [{ type: "text", text: "hello\nExit code 1" }],
        is_error: true,
      }],
    },
    parent_tool_use_id: null,
    session_id: SESSION,
  },
  { type: "rate_limit_event", rate_limit_info: { status: "allowed" }, session_id: SESSION },
  {
    type: "assistant",
    message: {
      id: "msg_3",
      role: "assistant",
      model: "claude-sonnet-4-5",
      content: [{ type: "text", text: "Done." }],
    },
    parent_tool_use_id: null,
    session_id: SESSION,
  },
  {
    type: "result",
    subtype: "success",
    is_error: false,
    duration_ms: 1195,
    duration_api_ms: 565,
    num_turns: 3,
    result: "Done.",
    session_id: SESSION,
    total_cost_usd: 0.000435,
    usage: {
      input_tokens: 20,
      cache_creation_input_tokens: 7,
      cache_read_input_tokens: 100,
      output_tokens: 25,
      server_tool_use: { web_search_requests: 0, web_fetch_requests: 0 },
      service_tier: "standard",
    },
    permission_denials: [],
    terminal_reason: "completed",
  },
];

Deno.test("Claude Code's stream-json becomes thinking, matching tool calls and results, one result, usage last", async () => {
  const { messages } = await translate(
    new ClaudeCodeTranslator({ model: "asked-for" }),
    CLAUDE_RUN,
  );
  assert.deepEqual(shape(messages), [
    "thinking",
    "thinking",
    "tool_call:Write",
    "tool_result:Write",
    "tool_call:Bash",
    "tool_result:Bash",
    "thinking",
    "result",
    "usage",
  ]);
  const [thought, said, write, written, bash, ran] = messages;
  assert.equal(thought.content, "A script, then run it.");
  assert.equal(said.content, "I will write the script.");
  assert.deepEqual(write.tool_input, { file_path: "greet.sh", content: "echo hello\n" });
  assert.equal(write.tool_call_id, "toolu_1");
  assert.equal(written.tool_call_id, "toolu_1");
  assert.equal(written.is_error, false);
  assert.equal(bash.tool_call_id, "toolu_2");
  assert.equal(
    ran.tool_output,
    "hello\nExit code 1",
    "text blocks of a tool result are its output",
  );
  assert.equal(ran.is_error, true);
  for (const message of messages.slice(0, -1)) {
    assert.equal(message.session_id, SESSION);
    assert.equal(
      message.model,
      "claude-sonnet-4-5",
      "the init event's model replaces the one asked for",
    );
  }
  const result = messages.at(-2)!;
  assert.equal(result.content, "Done.");
  assert.equal(result.is_error, false);
  assert.deepEqual(messages.at(-1)!.usage, {
    input_tokens: 127,
    output_tokens: 25,
    cache_read_tokens: 100,
    cache_creation_tokens: 7,
    cost_usd: 0.000435,
    duration_ms: 1195,
    num_turns: 3,
    model: "claude-sonnet-4-5",
  });
});

Deno.test("An unknown event kind is handed on as unknown and breaks nothing", async () => {
  const { messages, seen } = await translate(new ClaudeCodeTranslator(), [
    ...CLAUDE_RUN.slice(0, 3),
    "not json at all",
    "[1, 2, 3]",
    { type: "stream_event", event: { type: "content_block_delta" } },
    ...CLAUDE_RUN.slice(3),
  ]);
  assert.equal(messages.filter((m) => m.type === "result").length, 1);
  assert.equal(messages.at(-1)!.type, "usage");
  const unknown = seen.filter((s) => !s.known).map((s) => s.line);
  assert.deepEqual(unknown, [
    "not json at all",
    "[1, 2, 3]",
    JSON.stringify({ type: "stream_event", event: { type: "content_block_delta" } }),
    JSON.stringify(CLAUDE_RUN[5]),
  ]);
  assert.equal(seen.length, CLAUDE_RUN.length + 3, "every line is handed on, known or not");
});

Deno.test("Claude Code: an error result is an is_error result, and a second result is not sent", async () => {
  const error = {
    type: "result",
    subtype: "error_max_turns",
    is_error: true,
    num_turns: 5,
    session_id: SESSION,
    total_cost_usd: 0.1,
    usage: { input_tokens: 1, output_tokens: 2 },
    errors: ["Reached maximum number of turns (5)"],
  };
  const { messages, seen } = await translate(new ClaudeCodeTranslator(), [CLAUDE_RUN[0], error, {
    ...error,
    subtype: "success",
    is_error: false,
    result: "late",
  }]);
  assert.deepEqual(shape(messages), ["result", "usage"]);
  assert.equal(messages[0].is_error, true);
  assert.equal(
    messages[0].content,
    "Claude Code ended with error_max_turns: Reached maximum number of turns (5)",
  );
  assert.equal(seen.at(-1)!.known, false, "the second result stays in the run log only");
});

Deno.test("Claude Code: an API error reads as the result's text, and nothing is sent when the stream ends without a result", async (t) => {
  await t.step("an API error", async () => {
    const { messages } = await translate(new ClaudeCodeTranslator(), [
      CLAUDE_RUN[0],
      {
        type: "assistant",
        message: {
          model: "<synthetic>",
          role: "assistant",
          content: [{
            type: "text",
            text: "API Error: 400 replay: the recording has only 2 responses",
          }],
        },
        error: "unknown",
        is_api_error_message: true,
      },
      {
        type: "result",
        subtype: "success",
        is_error: true,
        result: "API Error: 400 replay: the recording has only 2 responses",
        num_turns: 1,
        usage: {},
      },
    ]);
    assert.deepEqual(shape(messages), ["thinking", "result", "usage"]);
    assert.equal(messages[1].is_error, true);
    assert.match(messages[1].content!, /^API Error: 400/);
    assert.equal(messages[2].usage!.input_tokens, null, "unreported counts are null, not 0");
  });
  await t.step("no result", async () => {
    const { messages } = await translate(new ClaudeCodeTranslator(), CLAUDE_RUN.slice(0, 3));
    assert.deepEqual(shape(messages), [
      "thinking",
      "thinking",
      "tool_call:Write",
      "tool_result:Write",
    ]);
  });
});

Deno.test("Claude Code: tool names pass through the given normaliser, calls and results alike", async () => {
  const { messages } = await translate(
    new ClaudeCodeTranslator({
      toolName: (raw) => raw === "Bash" ? "run_shell_command" : raw.toLowerCase(),
    }),
    CLAUDE_RUN,
  );
  assert.deepEqual(shape(messages).filter((s) => s.startsWith("tool")), [
    "tool_call:write",
    "tool_result:write",
    "tool_call:run_shell_command",
    "tool_result:run_shell_command",
  ]);
});

Deno.test("A tool output longer than the wire's limit is cut, as the worker's is", async () => {
  const long = "x".repeat(MAX_TOOL_OUTPUT_CHARS + 500);
  const { messages } = await translate(new ClaudeCodeTranslator(), [
    CLAUDE_RUN[0],
    CLAUDE_RUN[1],
    {
      type: "user",
      message: {
        role: "user",
        content: [{ tool_use_id: "toolu_1", type: "tool_result", content: long }],
      },
    },
  ]);
  assert.equal(messages.at(-1)!.tool_output!.length, MAX_TOOL_OUTPUT_CHARS);
});

const THREAD = "01a2056c-7730-74d1-8056-6a6aeca75eed";

/** Codex running two commands, changing a file, then answering (real shapes from 0.169.0). */
const CODEX_RUN: Record<string, unknown>[] = [
  { type: "thread.started", thread_id: THREAD },
  {
    type: "item.completed",
    item: {
      id: "item_0",
      type: "error",
      message:
        "Model metadata for `replay` not found. Defaulting to fallback metadata; this can degrade performance and cause issues.",
    },
  },
  { type: "turn.started" },
  { type: "error", message: "Reconnecting... 2/5 (stream disconnected before completion)" },
  {
    type: "item.completed",
    item: { id: "item_1", type: "reasoning", text: "**Writing the script**" },
  },
  {
    type: "item.started",
    item: {
      id: "item_2",
      type: "command_execution",
      command: "/bin/bash -lc 'printf hi > out.txt'",
      aggregated_output: "",
      exit_code: null,
      status: "in_progress",
    },
  },
  {
    type: "item.completed",
    item: {
      id: "item_2",
      type: "command_execution",
      command: "/bin/bash -lc 'printf hi > out.txt'",
      aggregated_output: "",
      exit_code: 0,
      status: "completed",
    },
  },
  {
    type: "item.started",
    item: {
      id: "item_3",
      type: "todo_list",
      items: [{ text: "write", completed: true }, { text: "run", completed: false }],
    },
  },
  {
    type: "item.started",
    item: {
      id: "item_4",
      type: "file_change",
      changes: [{ path: "/workspace/worktrees/run-1/hello.txt", kind: "add" }],
      status: "in_progress",
    },
  },
  {
    type: "item.completed",
    item: {
      id: "item_4",
      type: "file_change",
      changes: [{ path: "/workspace/worktrees/run-1/hello.txt", kind: "add" }],
      status: "completed",
    },
  },
  {
    type: "item.completed",
    item: {
      id: "item_5",
      type: "command_execution",
      command: "/bin/bash -lc 'cat missing'",
      aggregated_output: "cat: missing: No such file or directory\n",
      exit_code: 1,
      status: "failed",
    },
  },
  { type: "item.completed", item: { id: "item_6", type: "agent_message", text: "Done." } },
  {
    type: "item.completed",
    item: {
      id: "item_3",
      type: "todo_list",
      items: [{ text: "write", completed: true }, { text: "run", completed: true }],
    },
  },
  {
    type: "turn.completed",
    usage: {
      input_tokens: 200,
      cached_input_tokens: 20,
      cache_write_input_tokens: 0,
      output_tokens: 40,
      reasoning_output_tokens: 10,
    },
  },
];

Deno.test("Codex's exec --json becomes thinking, matching tool calls and results, one result, usage last", async () => {
  const diagnostics: string[] = [];
  // The clock reads 1000 ms when the translator starts and 4500 ms at the end.
  const readings = [1_000, 4_500];
  const translator = new CodexTranslator({
    model: "gpt-5.5",
    onDiagnostic: (m) => diagnostics.push(m),
    now: () => readings.shift()!,
  });
  const { messages, seen } = await translate(translator, CODEX_RUN);
  assert.deepEqual(shape(messages.slice(0, -2)), [
    "thinking",
    "tool_call:run_shell_command",
    "tool_result:run_shell_command",
    "thinking",
    "tool_call:apply_patch",
    "tool_result:apply_patch",
    "tool_call:run_shell_command",
    "tool_result:run_shell_command",
    "thinking",
  ]);
  assert.equal(messages[0].content, "**Writing the script**");
  assert.deepEqual(messages[1].tool_input, { command: "/bin/bash -lc 'printf hi > out.txt'" });
  assert.equal(messages[1].tool_call_id, "item_2");
  assert.equal(messages[2].tool_call_id, "item_2");
  assert.equal(messages[2].is_error, false);
  assert.equal(messages[3].content, "Plan:\n- [x] write\n- [ ] run");
  assert.deepEqual(messages[4].tool_input, {
    changes: [{ path: "/workspace/worktrees/run-1/hello.txt", kind: "add" }],
  });
  assert.equal(messages[5].tool_output, "Applied: add /workspace/worktrees/run-1/hello.txt");
  assert.equal(
    messages[6].tool_call_id,
    "item_5",
    "a completion without a start still gets its call first",
  );
  assert.equal(messages[7].is_error, true);
  assert.equal(messages[7].tool_output, "cat: missing: No such file or directory\n");
  assert.equal(messages[8].content, "Done.");
  for (const message of messages) assert.equal(message.model, "gpt-5.5");
  for (const message of messages.slice(0, -1)) assert.equal(message.session_id, THREAD);
  const [result, usage] = messages.slice(-2);
  assert.equal(result.type, "result");
  assert.equal(result.content, "Done.");
  assert.equal(result.is_error, false);
  assert.equal(usage.type, "usage");
  assert.deepEqual(usage.usage, {
    input_tokens: 200,
    output_tokens: 40,
    cache_read_tokens: 20,
    cache_creation_tokens: 0,
    cost_usd: null,
    duration_ms: 3_500,
    num_turns: null,
    model: "gpt-5.5",
  });
  assert.deepEqual(diagnostics, [
    "Model metadata for `replay` not found. Defaulting to fallback metadata; this can degrade performance and cause issues.",
    "Reconnecting... 2/5 (stream disconnected before completion)",
  ]);
  assert.ok(seen.every((s) => s.known), "every event of this run is one the translator knows");
});

Deno.test("Codex: the cost comes from the price table for the model it was told to use, and is null for a model the table does not know", async () => {
  const run = [CODEX_RUN[0], {
    type: "turn.completed",
    usage: { input_tokens: 1_000_000, cached_input_tokens: 400_000, output_tokens: 100_000 },
  }];
  const priced = await translate(new CodexTranslator({ model: "gpt-5" }), run);
  // gpt-5: $1.25 per million fresh input tokens, $0.125 cached, $10 output.
  assert.equal(priced.messages.at(-1)!.usage!.cost_usd, 0.6 * 1.25 + 0.4 * 0.125 + 0.1 * 10);
  const unknown = await translate(new CodexTranslator({ model: "replay" }), run);
  assert.equal(unknown.messages.at(-1)!.usage!.cost_usd, null);
});

Deno.test("Codex: a failed turn is an is_error result with Codex's message; recoverable errors before it change nothing", async () => {
  const { messages } = await translate(new CodexTranslator({ model: "m" }), [
    CODEX_RUN[0],
    CODEX_RUN[2],
    { type: "error", message: "Reconnecting... 5/5" },
    { type: "turn.failed", error: { message: "unexpected status 401 Unauthorized" } },
  ]);
  assert.deepEqual(shape(messages), ["result", "usage"]);
  assert.equal(messages[0].is_error, true);
  assert.equal(messages[0].content, "Codex failed: unexpected status 401 Unauthorized");
  assert.equal(messages[1].usage!.input_tokens, null);
});

Deno.test("Codex: a stream that ends mid-turn sends no result (the driver then reports the exit)", async () => {
  const { messages } = await translate(new CodexTranslator(), CODEX_RUN.slice(0, 7));
  assert.ok(!messages.some((m) => m.type === "result" || m.type === "usage"));
});

Deno.test("Codex: MCP tool calls, web searches and unknown item kinds", async () => {
  const { messages, seen } = await translate(new CodexTranslator(), [
    CODEX_RUN[0],
    {
      type: "item.started",
      item: {
        id: "i1",
        type: "mcp_tool_call",
        server: "docs",
        tool: "search",
        arguments: { q: "x" },
        result: null,
        error: null,
        status: "in_progress",
      },
    },
    {
      type: "item.completed",
      item: {
        id: "i1",
        type: "mcp_tool_call",
        server: "docs",
        tool: "search",
        arguments: { q: "x" },
        result: { content: [{ type: "text", text: "found" }], structured_content: null },
        error: null,
        status: "completed",
      },
    },
    {
      type: "item.started",
      item: {
        id: "i2",
        type: "mcp_tool_call",
        server: "docs",
        tool: "fetch",
        arguments: {},
        status: "in_progress",
      },
    },
    {
      type: "item.completed",
      item: {
        id: "i2",
        type: "mcp_tool_call",
        server: "docs",
        tool: "fetch",
        arguments: {},
        result: null,
        error: { message: "denied" },
        status: "failed",
      },
    },
    {
      type: "item.completed",
      item: { id: "i3", type: "web_search", query: "deno", action: { type: "search" } },
    },
    { type: "item.completed", item: { id: "i4", type: "hologram", text: "?" } },
    { type: "thread.teleported", to: "mars" },
    { type: "item.completed", item: { id: "i5", type: "agent_message", text: "ok" } },
    {
      type: "turn.completed",
      usage: { input_tokens: 1, cached_input_tokens: 0, output_tokens: 1 },
    },
  ]);
  assert.deepEqual(shape(messages), [
    "tool_call:mcp__docs__search",
    "tool_result:mcp__docs__search",
    "tool_call:mcp__docs__fetch",
    "tool_result:mcp__docs__fetch",
    "tool_call:web_search",
    "tool_result:web_search",
    "thinking",
    "result",
    "usage",
  ]);
  assert.deepEqual(messages[0].tool_input, { q: "x" });
  assert.equal(messages[1].tool_output, "found");
  assert.equal(messages[3].tool_output, "denied");
  assert.equal(messages[3].is_error, true);
  assert.deepEqual(messages[4].tool_input, { query: "deno" });
  assert.deepEqual(seen.filter((s) => !s.known).map((s) => JSON.parse(s.line).type), [
    "item.completed",
    "thread.teleported",
  ]);
});
