import assert from "node:assert/strict";
import { LineSplitStream, LineTooLongError, readLines } from "../../lib/lines.ts";

function split(chunks: string[], max?: number): Promise<string[]> {
  return Array.fromAsync(ReadableStream.from(chunks).pipeThrough(new LineSplitStream(max)));
}

Deno.test("LineSplitStream joins lines split across chunk boundaries", async () => {
  assert.deepEqual(await split(["ab", "c\nde", "f\n", "\n", "g"]), ["abc", "def", "", "g"]);
});

Deno.test("LineSplitStream drops the carriage return of CRLF endings", async () => {
  assert.deepEqual(await split(["a\r\nb\r", "\n"]), ["a", "b"]);
});

Deno.test("LineSplitStream raises on a line over the cap, even one never terminated", async () => {
  await assert.rejects(split(["12345\n"], 4), LineTooLongError);
  await assert.rejects(split(["12", "345"], 4), LineTooLongError);
  assert.deepEqual(await split(["1234\n"], 4), ["1234"]);
});

Deno.test("readLines decodes UTF-8 split inside a multi-byte character", async () => {
  const bytes = new TextEncoder().encode("héllo\nwörld\n");
  const chunks = [bytes.slice(0, 2), bytes.slice(2, 9), bytes.slice(9)];
  assert.deepEqual(await Array.fromAsync(readLines(ReadableStream.from(chunks))), [
    "héllo",
    "wörld",
  ]);
});
