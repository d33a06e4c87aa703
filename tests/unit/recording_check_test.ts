import assert from "node:assert/strict";
import { recordingProblems } from "../../lib/run/recording_check.ts";
import { loadRecording } from "../../lib/run/replay.ts";
import { SandboxError } from "../../lib/errors.ts";
import { ROOT, tempDir } from "../_helpers.ts";

const completion = (message: Record<string, unknown>) => ({
  status: 200,
  body: { choices: [{ index: 0, message }] },
});
const recording = (responses: unknown[], kind = "openai") => ({ version: 1, kind, responses });

Deno.test("the shipped example recording and a recorded SSE stream are valid", async () => {
  assert.deepEqual(
    recordingProblems(JSON.parse(await Deno.readTextFile(`${ROOT}/examples/hello/recording.json`))),
    [],
  );
  assert.deepEqual(
    recordingProblems(
      recording([{ status: 200, sse: 'data: {"choices":[]}\n\ndata: [DONE]\n\n' }]),
    ),
    [],
  );
  assert.deepEqual(
    recordingProblems(recording([{ status: 429, body: { error: { message: "slow down" } } }])),
    [],
  );
  assert.deepEqual(
    recordingProblems(
      recording([{ status: 200, body: { object: "list", data: [{ embedding: [0.1] }] } }]),
    ),
    [],
  );
  assert.deepEqual(
    recordingProblems(
      recording([{
        status: 200,
        body: { type: "message", content: [{ type: "text", text: "hi" }] },
      }], "anthropic"),
    ),
    [],
  );
});

Deno.test("recordingProblems() names every bad entry by its index and says what is wrong", async (t) => {
  const cases: [string, unknown, RegExp][] = [
    ["not an object", [1, 2], /^expected an object like/],
    [
      "wrong version",
      { ...recording([completion({ content: "x" })]), version: 2 },
      /^version: expected 1, found number 2$/,
    ],
    [
      "missing kind",
      { version: 1, responses: [completion({ content: "x" })] },
      /^kind: expected "openai", "anthropic" or "openai-responses", found nothing$/,
    ],
    ["no responses", { version: 1, kind: "openai" }, /^responses: expected a list/],
    ["empty responses", recording([]), /^responses: the list is empty/],
    [
      "an entry that is not an object",
      recording([completion({ content: "x" }), "hello"]),
      /^responses\[1\]: expected \{"status": 200/,
    ],
    [
      "a body that is not a chat completion",
      recording([{ status: 200, body: { foo: 1 } }]),
      /^responses\[0\]\.body: not a chat completion: no "choices" list$/,
    ],
    [
      "no status",
      recording([{ body: { choices: [{ message: { content: "x" } }] } }]),
      /^responses\[0\]\.status: expected an HTTP status/,
    ],
    [
      "both body and sse",
      recording([{ status: 200, body: {}, sse: "data: x" }]),
      /^responses\[0\]: has both "body" and "sse"/,
    ],
    ["neither body nor sse", recording([{ status: 200 }]), /^responses\[0\]: expected a "body"/],
    [
      "an unknown key",
      recording([{ ...completion({ content: "x" }), headers: {} }]),
      /^responses\[0\]: unknown key "headers"$/,
    ],
    [
      "a choice without a message",
      recording([{ status: 200, body: { choices: [{}] } }]),
      /^responses\[0\]\.body\.choices\[0\]\.message: expected an object, found nothing$/,
    ],
    [
      "tool call arguments that are not JSON",
      recording([
        completion({
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "ls", arguments: "{" } }],
        }),
      ]),
      /^responses\[0\]\.body\.choices\[0\]\.message\.tool_calls\[0\]\.function\.arguments: not valid JSON$/,
    ],
    [
      "a tool call without a name",
      recording([
        completion({ content: null, tool_calls: [{ id: "c1", function: { arguments: "{}" } }] }),
      ]),
      /function\.name: expected a tool name/,
    ],
    [
      "an openai body in an anthropic recording",
      recording([completion({ content: "x" })], "anthropic"),
      /^responses\[0\]\.body\.type: expected "message"/,
    ],
    [
      "an sse entry that is not an event stream",
      recording([{ status: 200, sse: 42 }]),
      /^responses\[0\]\.sse: expected the text of a server-sent event stream/,
    ],
  ];
  for (const [name, value, expected] of cases) {
    await t.step(name, () => {
      const problems = recordingProblems(value);
      assert.ok(
        problems.some((p) => expected.test(p)),
        `${JSON.stringify(problems)} has no line like ${expected}`,
      );
    });
  }
});

Deno.test("recordingProblems() lists every problem of a file, capped for a file that is wholly wrong", () => {
  const problems = recordingProblems(recording([{ status: "x" }, 3, { status: 200, body: {} }]));
  assert.ok(problems.some((p) => p.startsWith("responses[0].status:")), problems.join("\n"));
  assert.ok(problems.some((p) => p.startsWith("responses[1]:")), problems.join("\n"));
  assert.ok(problems.some((p) => p.startsWith("responses[2].body:")), problems.join("\n"));
  const many = recordingProblems(recording(Array.from({ length: 50 }, () => 1)));
  assert.equal(many.length, 21);
  assert.match(many.at(-1)!, /only the first 20 problems/);
});

Deno.test("loadRecording() turns a missing, unparsable or invalid file into one usage error", async () => {
  await using dir = await tempDir();
  const usage = (e: unknown) => e instanceof SandboxError && e.code === "usage";
  await assert.rejects(
    loadRecording(`${dir.path}/missing.json`),
    (e) => usage(e) && /Cannot read recording .*file not found/.test((e as Error).message),
  );
  await Deno.writeTextFile(`${dir.path}/bad.json`, "{not json");
  await assert.rejects(
    loadRecording(`${dir.path}/bad.json`),
    (e) => usage(e) && /Invalid recording .*not JSON/.test((e as Error).message),
  );
  await Deno.writeTextFile(`${dir.path}/empty.json`, JSON.stringify(recording([])));
  await assert.rejects(
    loadRecording(`${dir.path}/empty.json`),
    (e) => usage(e) && /the list is empty/.test((e as SandboxError).detail ?? ""),
  );
});

Deno.test("recordingProblems() reads each sse entry as its client would: every line a field, every event's data what the API sends", async (t) => {
  const anthropicEvents =
    'event: message_start\ndata: {"type":"message_start","message":{}}\n\n: keep-alive\n\nevent: ping\ndata: {"type": "ping"}\n\n';
  await t.step(
    "well-formed streams of each kind pass, CRLF, comments and a last event without a blank line included",
    () => {
      assert.deepEqual(
        recordingProblems(
          recording([{
            status: 200,
            sse: 'data: {"choices":[{"delta":{"content":"hi"}}]}\r\n\r\ndata: [DONE]',
          }]),
        ),
        [],
      );
      assert.deepEqual(
        recordingProblems(
          recording([{
            status: 200,
            sse: 'id: 1\nretry: 10\ndata: {"error":{"message":"overloaded"}}\n\n',
          }]),
        ),
        [],
      );
      assert.deepEqual(
        recordingProblems(recording([{ status: 200, sse: anthropicEvents }], "anthropic")),
        [],
      );
      // A data field split over lines is one event: its lines are joined before parsing.
      assert.deepEqual(
        recordingProblems(
          recording(
            [{ status: 200, sse: 'data: {"type":\ndata: "message_stop"}\n\n' }],
            "anthropic",
          ),
        ),
        [],
      );
    },
  );
  const cases: [string, unknown, RegExp][] = [
    [
      "data that is not JSON",
      recording([{ status: 200, sse: "data: {oops\n\n" }]),
      /^responses\[0\]\.sse: the event at line 1: its data is not JSON \(nor "\[DONE\]"\)/,
    ],
    [
      "a JSON line without its data: field",
      recording([{ status: 200, sse: 'data: {"choices":[]}\n\n{"choices":[]}\n\n' }]),
      /^responses\[0\]\.sse: line 3: expected "data: \.\.\."/,
    ],
    [
      "a chunk that is not a chat completion chunk",
      recording([{ status: 200, sse: 'data: {"text":"hi"}\n\n' }]),
      /^responses\[0\]\.sse: the event at line 1: not a chat completion chunk/,
    ],
    [
      "data that is a JSON list",
      recording([{ status: 200, sse: "data: [1]\n\n" }]),
      /the event at line 1: expected a JSON object, found a list$/,
    ],
    [
      "a Messages event without a type",
      recording(
        [{ status: 200, sse: `${anthropicEvents}event: x\ndata: {"delta":{}}\n\n` }],
        "anthropic",
      ),
      /^responses\[0\]\.sse: the event at line 10: expected an event with a "type", found none$/,
    ],
    [
      "[DONE] in a Messages stream",
      recording([{ status: 200, sse: "data: [DONE]\n\n" }], "anthropic"),
      /^responses\[0\]\.sse: the event at line 1: its data is not JSON: /,
    ],
  ];
  for (const [name, value, expected] of cases) {
    await t.step(name, () => {
      const problems = recordingProblems(value);
      assert.ok(
        problems.some((p) => expected.test(p)),
        `${JSON.stringify(problems)} has no line like ${expected}`,
      );
    });
  }
});
