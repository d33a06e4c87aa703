/**
 * Files the user names, read with a bound (lib/input_file.ts): never more than one chunk past the
 * limit, whatever the file is (regular, FIFO, device); UTF-8 checked with the offset of the first
 * bad byte; a prompt held to what an LLM request can carry.
 */
import assert from "node:assert/strict";
import {
  checkPromptFits,
  decodeUtf8,
  invalidUtf8Offset,
  MAX_PROMPT_BYTES,
  readBounded,
  readInputText,
} from "../../lib/input_file.ts";
import { SandboxError } from "../../lib/errors.ts";
import { parseYamlDocument } from "../../lib/yaml.ts";
import "../../lib/config.ts"; // loads the yaml module
import { tempDir, withEnv } from "../_helpers.ts";

const bytes = (...values: number[]) => new Uint8Array(values);

Deno.test("readBounded() returns a file of at most the limit, and refuses one past it without reading it whole", async (t) => {
  await using dir = await tempDir();
  const file = `${dir.path}/f`;
  await Deno.writeFile(file, new Uint8Array(1000).fill(65));
  await t.step("a regular file at the limit, and one byte past it", async () => {
    const read = await readBounded(file, 1000);
    assert.equal(read.kind, "ok");
    assert.equal(read.kind === "ok" && read.bytes.length, 1000);
    assert.deepEqual(await readBounded(file, 999), { kind: "too_large" });
  });
  await t.step("a character device that never ends (/dev/zero)", async () => {
    assert.deepEqual(await readBounded("/dev/zero", 1024 * 1024), { kind: "too_large" });
  });
  await t.step(
    "a FIFO: a small prompt through it is read; an endless writer is cut off at the limit",
    async () => {
      const fifo = `${dir.path}/fifo`;
      const made = await new Deno.Command("mkfifo", { args: [fifo] }).output();
      assert.equal(made.code, 0);
      const small = new Deno.Command("sh", { args: ["-c", `printf 'say hi' > '${fifo}'`] }).spawn();
      const read = await readBounded(fifo, 1000);
      assert.equal((await small.status).code, 0);
      assert.equal(read.kind === "ok" && new TextDecoder().decode(read.bytes), "say hi");
      // `yes` writes until its reader goes away: it ends on SIGPIPE once the read stopped.
      const endless = new Deno.Command("sh", {
        args: ["-c", `exec yes > '${fifo}'`],
        stderr: "null",
      }).spawn();
      assert.deepEqual(await readBounded(fifo, 1024 * 1024), { kind: "too_large" });
      assert.notEqual((await endless.status).code, 0);
    },
  );
  await t.step("a directory and a missing file are unreadable, with the reason", async () => {
    assert.deepEqual(await readBounded(dir.path, 1000), {
      kind: "unreadable",
      reason: "it is a directory",
    });
    assert.deepEqual(await readBounded(`${dir.path}/missing`, 1000), {
      kind: "unreadable",
      reason: "file not found",
    });
  });
});

Deno.test("readInputText() names the file and the problem: the limit, or the offset of the first byte that is not UTF-8", async () => {
  await using dir = await tempDir();
  const name = { what: "prompt file", limitFor: "prompt" };
  await Deno.writeFile(`${dir.path}/latin1.txt`, bytes(0x68, 0xe9, 0x6c, 0x6c, 0x6f)); // "héllo" in Latin-1
  await assert.rejects(readInputText(`${dir.path}/latin1.txt`, 100, name), (error: unknown) => {
    assert.ok(error instanceof SandboxError && error.code === "usage");
    assert.equal(
      error.message,
      `Prompt file "${dir.path}/latin1.txt" is not UTF-8 text: invalid byte at offset 1`,
    );
    return true;
  });
  await Deno.writeTextFile(`${dir.path}/big.txt`, "x".repeat(101));
  await assert.rejects(readInputText(`${dir.path}/big.txt`, 100, name), (error: unknown) => {
    assert.ok(error instanceof SandboxError && error.code === "usage");
    assert.equal(
      error.message,
      `Prompt file "${dir.path}/big.txt" is larger than 100 B, the limit for a prompt`,
    );
    return true;
  });
  // The twin: UTF-8 text within the limit, multi-byte characters and all.
  await Deno.writeTextFile(`${dir.path}/ok.txt`, "héllo → 世界 🙂");
  assert.equal(await readInputText(`${dir.path}/ok.txt`, 100, name), "héllo → 世界 🙂");
});

Deno.test("invalidUtf8Offset() finds the first byte that is not well-formed UTF-8, as the WHATWG decoder judges it", () => {
  const cases: [string, Uint8Array, number][] = [
    ["ASCII and every sequence length", new TextEncoder().encode("a é € 🙂"), -1],
    ["a lone continuation byte", bytes(0x61, 0x80), 1],
    ["an overlong two-byte form", bytes(0xc0, 0x80), 0],
    ["an overlong three-byte form", bytes(0x61, 0xe0, 0x80, 0x80), 1],
    ["a surrogate", bytes(0xed, 0xa0, 0x80), 0],
    ["past U+10FFFF", bytes(0xf4, 0x90, 0x80, 0x80), 0],
    ["a sequence cut short at the end", bytes(0x61, 0x62, 0xe2, 0x82), 2],
    ["a sequence broken by ASCII", bytes(0xe2, 0x41, 0x41), 0],
    ["a byte never used (0xFF)", bytes(0x61, 0x62, 0x63, 0xff), 3],
  ];
  for (const [name, input, offset] of cases) {
    assert.equal(invalidUtf8Offset(input), offset, name);
    // The same verdict as the platform's strict decoder.
    assert.equal(decodeUtf8(input).kind, offset === -1 ? "ok" : "invalid", name);
  }
});

Deno.test("checkPromptFits() refuses a prompt an LLM request could not carry, before the run, naming the limit", () => {
  const profile = (maxRequestBody: string) =>
    ({ name: "work", llm: { max_request_body: maxRequestBody } }) as Parameters<
      typeof checkPromptFits
    >[1]["profile"];
  const usage = (pattern: RegExp) => (error: unknown) =>
    error instanceof SandboxError && error.code === "usage" && pattern.test(error.message);
  // At the limit: fits.
  checkPromptFits("x".repeat(MAX_PROMPT_BYTES), { profile: profile("10m") });
  assert.throws(
    () => checkPromptFits("x".repeat(MAX_PROMPT_BYTES + 1), { profile: profile("10m") }),
    usage(
      /^The prompt \(4\.0 MiB\) is too large for an LLM request: at most 4 MiB, the limit for a prompt$/,
    ),
  );
  // The instructions travel in the same request.
  assert.throws(
    () =>
      checkPromptFits("x".repeat(MAX_PROMPT_BYTES / 2), {
        instructions: "y".repeat(MAX_PROMPT_BYTES / 2 + 1),
        profile: profile("10m"),
      }),
    usage(/^The prompt with its instructions /),
  );
  // A profile with a smaller request limit: half of it.
  checkPromptFits("x".repeat(512 * 1024), { profile: profile("1m") });
  assert.throws(
    () => checkPromptFits("x".repeat(512 * 1024 + 1), { profile: profile("1m") }),
    usage(/at most 512 KiB, half of profiles\.work\.llm\.max_request_body \(1 MiB\)$/),
  );
  // Bytes, not characters: a multi-byte prompt counts what it sends.
  assert.throws(
    () => checkPromptFits("é".repeat(300 * 1024), { profile: profile("1m") }),
    usage(/half of/),
  );
});

Deno.test("parseYamlDocument() turns alias problems into the document's issues, and still resolves aliases that are fine", () => {
  assert.deepEqual(parseYamlDocument("a: &x {k: 1}\nb: *x\n"), {
    kind: "ok",
    value: { a: { k: 1 }, b: { k: 1 } },
  });
  assert.deepEqual(parseYamlDocument("profiles:\n  work: *nope\n"), {
    kind: "invalid",
    errors: ["YAML alias: *nope at line 2, column 9 names no anchor (&nope) set before it"],
  });
  // An alias used before its anchor is no alias of it.
  assert.equal(parseYamlDocument("a: *x\nb: &x 1\n").kind, "invalid");
  const bomb = ["a: &a [x, x, x, x, x, x, x, x, x]"];
  for (const [name, prev] of [["b", "a"], ["c", "b"], ["d", "c"], ["e", "d"]]) {
    bomb.push(`${name}: &${name} [${Array(9).fill(`*${prev}`).join(", ")}]`);
  }
  const parsed = parseYamlDocument(bomb.join("\n") + "\n");
  assert.equal(parsed.kind, "invalid");
  assert.match(
    parsed.kind === "invalid" ? parsed.errors[0] : "",
    /^YAML alias: Excessive alias count .*\(at most 100 alias expansions\)$/,
  );
});

Deno.test("a configuration file past 1 MiB is refused unread, and one at the limit is read", async () => {
  await using dir = await tempDir();
  const { loadConfig } = await import("../../lib/config.ts");
  // A hostile repository's sandbox.yaml may be any size: one past the limit is never parsed.
  const big = `${dir.path}/big.yaml`;
  await Deno.writeTextFile(big, `# ${"x".repeat(1024 * 1024)}\nprofiles: {}\n`);
  const refused = await loadConfig({ explicit: big });
  assert.equal(refused.kind, "invalid");
  assert.deepEqual(refused.kind === "invalid" && refused.issues, [{
    path: "",
    message: "cannot read: larger than 1 MiB, the limit for a configuration file",
  }]);
  const atLimit = `${dir.path}/limit.yaml`;
  const body = "profiles: {work: {}}\n";
  await Deno.writeTextFile(atLimit, `#${"x".repeat(1024 * 1024 - body.length - 2)}\n${body}`);
  assert.equal((await Deno.stat(atLimit)).size, 1024 * 1024);
  // (Its parse is cached in the state directory: a private one.)
  const read = await withEnv({ XDG_STATE_HOME: dir.path }, () => loadConfig({ explicit: atLimit }));
  assert.equal(read.kind, "ok", JSON.stringify(read.kind === "invalid" && read.issues));
});
