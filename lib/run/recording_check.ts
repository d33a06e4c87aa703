/**
 * The shape of a recording (`--model replay:FILE`), checked in full when it is loaded.
 *
 * A replay serves its entries to a real worker, so an entry the worker cannot read (a body that
 * is not a chat completion, an empty list, a missing `kind`) would otherwise surface late and
 * obscurely: as retries, an "agent failed" result or a crash inside the LLM client. Checking every
 * entry up front turns each of those into one usage error that names the entry and what is wrong.
 */

/** At most this many problems are listed; a wholly wrong file would otherwise flood the terminal. */
const MAX_PROBLEMS = 20;

type Json = Record<string, unknown>;

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "a list";
  if (typeof value === "string") return `the string ${JSON.stringify(value.slice(0, 40))}`;
  return typeof value === "object" ? "an object" : `${typeof value} ${JSON.stringify(value)}`;
}

/**
 * Every problem of a parsed recording, each as `path: what is wrong`; empty when it is valid.
 * Unknown top-level keys are allowed (the writer may add its own notes); entries are strict.
 */
export function recordingProblems(value: unknown): string[] {
  const problems: string[] = [];
  const add = (path: string, message: string) => {
    if (problems.length < MAX_PROBLEMS) problems.push(path ? `${path}: ${message}` : message);
  };
  if (!isObject(value)) {
    add(
      "",
      `expected an object like {"version": 1, "kind": "openai", "responses": [...]}, found ${
        describe(value)
      }`,
    );
    return problems;
  }
  if (value.version !== 1) {
    add(
      "version",
      `expected 1, found ${value.version === undefined ? "nothing" : describe(value.version)}`,
    );
  }
  const kind = value.kind;
  if (kind !== "openai" && kind !== "anthropic" && kind !== "openai-responses") {
    add(
      "kind",
      `expected "openai", "anthropic" or "openai-responses", found ${
        kind === undefined ? "nothing" : describe(kind)
      }`,
    );
  }
  const responses = value.responses;
  if (!Array.isArray(responses)) {
    add(
      "responses",
      `expected a list of recorded responses, found ${
        responses === undefined ? "nothing" : describe(responses)
      }`,
    );
  } else if (responses.length === 0) {
    add("responses", "the list is empty: a replay needs at least one recorded response");
  } else {
    const entryKind = kind === "anthropic" || kind === "openai-responses" ? kind : "openai";
    responses.forEach((entry, i) => entryProblems(entry, `responses[${i}]`, entryKind, add));
  }
  if (problems.length === MAX_PROBLEMS) {
    problems.push(`(only the first ${MAX_PROBLEMS} problems are shown)`);
  }
  return problems;
}

function entryProblems(
  entry: unknown,
  path: string,
  kind: "openai" | "anthropic" | "openai-responses",
  add: (path: string, message: string) => void,
): void {
  if (!isObject(entry)) {
    return add(
      path,
      `expected {"status": 200, "body": {...}} or {"status": 200, "sse": "..."}, found ${
        describe(entry)
      }`,
    );
  }
  const unknown = Object.keys(entry).filter((key) => !["status", "body", "sse"].includes(key));
  if (unknown.length > 0) {
    add(
      path,
      `unknown key${unknown.length > 1 ? "s" : ""} ${unknown.map((k) => `"${k}"`).join(", ")}`,
    );
  }
  const status = entry.status;
  if (typeof status !== "number" || !Number.isInteger(status) || status < 100 || status > 599) {
    add(
      `${path}.status`,
      `expected an HTTP status like 200, found ${
        status === undefined ? "nothing" : describe(status)
      }`,
    );
  }
  const hasBody = "body" in entry;
  const hasSse = "sse" in entry;
  if (hasBody === hasSse) {
    return add(
      path,
      hasBody
        ? 'has both "body" and "sse": expected one of them'
        : 'expected a "body" (a JSON response) or an "sse" (a raw event stream)',
    );
  }
  const success = typeof status === "number" && status >= 200 && status <= 299;
  if (hasSse) {
    if (typeof entry.sse !== "string" || !/^data:/m.test(entry.sse)) {
      add(
        `${path}.sse`,
        `expected the text of a server-sent event stream ("data: ..." lines), found ${
          describe(entry.sse)
        }`,
      );
      return;
    }
    const problem = sseProblem(entry.sse, kind);
    if (problem) add(`${path}.sse`, problem);
    else if (
      kind === "openai-responses" && success &&
      !/"type"\s*:\s*"response\.(completed|failed|incomplete)"/.test(entry.sse)
    ) {
      // Codex takes a stream that ends without one of these for a dropped connection, and retries.
      add(
        `${path}.sse`,
        'the stream never ends its response: expected a "response.completed", "response.failed" or "response.incomplete" event',
      );
    }
    return;
  }
  // Error statuses carry whatever the provider said; only a success must be a readable answer.
  if (!success) return;
  if (kind === "openai-responses") {
    // Responses API clients (Codex) stream: the replay serves them what the recording holds.
    return add(
      path,
      'a Responses API answer is replayed to a streaming client: expected an "sse" stream, not a "body"',
    );
  }
  const body = entry.body;
  if (kind === "anthropic") anthropicProblems(body, `${path}.body`, add);
  else openaiProblems(body, `${path}.body`, add);
}

/**
 * The first problem of a recorded event stream, as the client that reads it would meet it: a line
 * that is no SSE field (WHATWG HTML, "Interpreting an event stream": `data`, `event`, `id`, `retry`,
 * or a `:` comment), or an event whose data is not what the API sends — a JSON object with a
 * `choices` list (or an `error`) or `[DONE]` for Chat Completions, a JSON object with a `type` for
 * the Messages and Responses APIs. An event the stream ends in without a blank line counts, as
 * the SDKs flush it.
 */
function sseProblem(
  text: string,
  kind: "openai" | "anthropic" | "openai-responses",
): string | undefined {
  const lines = text.split(/\r\n|\r|\n/);
  let data: string[] = [];
  let start = 0;
  for (let i = 0; i <= lines.length; i++) {
    const line = lines[i] ?? "";
    if (line === "") {
      const problem = data.length > 0 ? sseDataProblem(data.join("\n"), kind) : undefined;
      if (problem) return `the event at line ${start}: ${problem}`;
      data = [];
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    if (field === "data") {
      if (data.length === 0) start = i + 1;
      const value = colon === -1 ? "" : line.slice(colon + 1);
      data.push(value.startsWith(" ") ? value.slice(1) : value);
    } else if (field !== "event" && field !== "id" && field !== "retry") {
      return `line ${
        i + 1
      }: expected "data: ...", "event: ...", "id: ...", "retry: ..." or a ": comment", found ${
        describe(line)
      }`;
    }
  }
  return undefined;
}

function sseDataProblem(
  data: string,
  kind: "openai" | "anthropic" | "openai-responses",
): string | undefined {
  if (kind === "openai" && data.startsWith("[DONE]")) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(data);
  } catch {
    return `its data is not JSON${kind === "openai" ? ' (nor "[DONE]")' : ""}: ${describe(data)}`;
  }
  if (!isObject(value)) return `expected a JSON object, found ${describe(value)}`;
  if (kind === "openai") {
    if (!Array.isArray(value.choices) && !isObject(value.error)) {
      return 'not a chat completion chunk: no "choices" list (nor an "error")';
    }
    return undefined;
  }
  if (typeof value.type !== "string") {
    return `expected an event with a "type", found ${
      value.type === undefined ? "none" : describe(value.type)
    }`;
  }
  return undefined;
}

function openaiProblems(
  body: unknown,
  path: string,
  add: (path: string, message: string) => void,
): void {
  if (!isObject(body)) {
    return add(path, `expected a chat completion object, found ${describe(body)}`);
  }
  // Embeddings are LLM calls too (the replay serves /embeddings from the same list).
  if (body.object === "list" && Array.isArray(body.data)) return;
  if (!Array.isArray(body.choices)) return add(path, 'not a chat completion: no "choices" list');
  if (body.choices.length === 0) {
    return add(`${path}.choices`, "the list is empty: a chat completion needs at least one choice");
  }
  body.choices.forEach((choice, i) => {
    const at = `${path}.choices[${i}]`;
    if (!isObject(choice)) return add(at, `expected an object, found ${describe(choice)}`);
    const message = choice.message;
    if (!isObject(message)) {
      return add(
        `${at}.message`,
        `expected an object, found ${message === undefined ? "nothing" : describe(message)}`,
      );
    }
    if (
      message.content !== undefined && message.content !== null &&
      typeof message.content !== "string"
    ) {
      add(`${at}.message.content`, `expected a string or null, found ${describe(message.content)}`);
    }
    if (message.tool_calls === undefined || message.tool_calls === null) return;
    if (!Array.isArray(message.tool_calls)) {
      return add(
        `${at}.message.tool_calls`,
        `expected a list, found ${describe(message.tool_calls)}`,
      );
    }
    message.tool_calls.forEach((call, j) => {
      const where = `${at}.message.tool_calls[${j}]`;
      if (!isObject(call)) return add(where, `expected an object, found ${describe(call)}`);
      if (typeof call.id !== "string") {
        add(
          `${where}.id`,
          `expected a string, found ${call.id === undefined ? "nothing" : describe(call.id)}`,
        );
      }
      const fn = call.function;
      if (!isObject(fn)) {
        return add(
          `${where}.function`,
          `expected {"name": ..., "arguments": ...}, found ${
            fn === undefined ? "nothing" : describe(fn)
          }`,
        );
      }
      if (typeof fn.name !== "string" || fn.name === "") {
        add(
          `${where}.function.name`,
          `expected a tool name, found ${fn.name === undefined ? "nothing" : describe(fn.name)}`,
        );
      }
      if (typeof fn.arguments !== "string") {
        add(
          `${where}.function.arguments`,
          `expected a JSON string, found ${
            fn.arguments === undefined ? "nothing" : describe(fn.arguments)
          }`,
        );
      } else {
        try {
          if (!isObject(JSON.parse(fn.arguments))) {
            add(`${where}.function.arguments`, "expected a JSON object in the string");
          }
        } catch {
          add(`${where}.function.arguments`, "not valid JSON");
        }
      }
    });
  });
}

function anthropicProblems(
  body: unknown,
  path: string,
  add: (path: string, message: string) => void,
): void {
  if (!isObject(body)) return add(path, `expected a message object, found ${describe(body)}`);
  if (body.type !== "message") {
    add(
      `${path}.type`,
      `expected "message", found ${body.type === undefined ? "nothing" : describe(body.type)}`,
    );
  }
  if (!Array.isArray(body.content)) {
    return add(path, 'not a Messages API answer: no "content" list');
  }
  body.content.forEach((block, i) => {
    const at = `${path}.content[${i}]`;
    if (!isObject(block) || typeof block.type !== "string") {
      return add(at, `expected a content block with a "type", found ${describe(block)}`);
    }
    if (block.type === "text" && typeof block.text !== "string") {
      add(`${at}.text`, `expected a string, found ${describe(block.text)}`);
    }
    if (block.type === "tool_use") {
      if (typeof block.id !== "string") add(`${at}.id`, "expected a string");
      if (typeof block.name !== "string" || block.name === "") {
        add(`${at}.name`, "expected a tool name");
      }
      if (!isObject(block.input)) {
        add(`${at}.input`, `expected an object, found ${describe(block.input)}`);
      }
    }
  });
}
