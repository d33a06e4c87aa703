import assert from "node:assert/strict";
import { REDACTED, Redactor } from "../../lib/redact.ts";

Deno.test("Redactor.redact() replaces every occurrence of every registered secret", () => {
  const redactor = new Redactor();
  redactor.add("sk-live-1234567890");
  redactor.add("sbx_abcdefghijkl");
  assert.equal(
    redactor.redact("key sk-live-1234567890 token sbx_abcdefghijkl again sk-live-1234567890"),
    `key ${REDACTED} token ${REDACTED} again ${REDACTED}`,
  );
});

Deno.test("Redactor.redact() leaves text alone when nothing is registered", () => {
  assert.equal(new Redactor().redact("nothing secret here"), "nothing secret here");
});

Deno.test("Redactor.add() ignores values shorter than 8 characters", () => {
  const redactor = new Redactor();
  redactor.add("true");
  redactor.add("1234567");
  assert.equal(redactor.size, 0);
  assert.equal(redactor.redact("true 1234567"), "true 1234567");
});

Deno.test("Redactor.redact() treats regular expression characters in secrets literally", () => {
  const redactor = new Redactor();
  redactor.add("a.b*c+d?(e)[f]$^|\\");
  assert.equal(redactor.redact("x a.b*c+d?(e)[f]$^|\\ y axbbbcd"), `x ${REDACTED} y axbbbcd`);
});

Deno.test("Redactor.redact() replaces a secret that contains another secret whole", () => {
  const redactor = new Redactor();
  redactor.add("abcdefgh");
  redactor.add("abcdefgh-longer-secret");
  assert.equal(redactor.redact("abcdefgh-longer-secret"), REDACTED);
});

Deno.test("Redactor.redactValue() redacts strings at any depth and keeps the shape", () => {
  const redactor = new Redactor();
  redactor.add("secret-value-1");
  const input = {
    a: "secret-value-1",
    nested: { list: ["ok", "prefix secret-value-1 suffix"], n: 3, flag: true, none: null },
    "secret-value-1": "as a key",
  };
  assert.deepEqual(redactor.redactValue(input), {
    a: REDACTED,
    nested: { list: ["ok", `prefix ${REDACTED} suffix`], n: 3, flag: true, none: null },
    [REDACTED]: "as a key",
  });
  // A copy: the input is untouched.
  assert.equal(input.a, "secret-value-1");
});

Deno.test("Redactor.redactJson() catches secrets in their JSON-escaped spelling and keeps JSON valid", () => {
  const redactor = new Redactor();
  const secret = 'quote"back\\slash-secret';
  redactor.add(secret);
  const json = JSON.stringify({ message: `failed with ${secret}` });
  const redacted = redactor.redactJson(json);
  assert.ok(!redacted.includes("slash-secret"), redacted);
  assert.deepEqual(JSON.parse(redacted), { message: `failed with ${REDACTED}` });
});

/** Feed `chunks` through a stream redactor; the whole output, decoded. */
function streamThrough(
  redactor: Redactor,
  chunks: Uint8Array[],
): { text: string; outputs: Uint8Array[] } {
  const stream = redactor.stream();
  const outputs = chunks.map((chunk) => stream.push(chunk));
  outputs.push(stream.end());
  const joined = new Uint8Array(outputs.reduce((n, out) => n + out.length, 0));
  let offset = 0;
  for (const out of outputs) {
    joined.set(out, offset);
    offset += out.length;
  }
  return { text: new TextDecoder().decode(joined), outputs };
}

Deno.test("Redactor.stream() gives the same answer as redact() for a secret split at every byte boundary", () => {
  const redactor = new Redactor();
  // Overlapping and nested secrets, so that a wrong hold-back or match choice would show.
  for (
    const secret of [
      "sk-live-1234567890",
      "sk-live-12345678901234",
      "1234567890abcdef",
      'sbx_tok"en-quoted',
    ]
  ) {
    redactor.add(secret);
  }
  const text =
    'data: {"a":"sk-live-1234567890"} sk-live-12345678901234 x sk-live-1234567890abcdef ' +
    'sk-live-123 {"t":"sbx_tok\\"en-quoted"} sbx_tok"en-quoted end';
  const expected = redactor.redact(text);
  assert.ok(!expected.includes("sk-live-1234567890"), expected);
  const bytes = new TextEncoder().encode(text);
  for (let split = 0; split <= bytes.length; split++) {
    const { text: out } = streamThrough(redactor, [
      bytes.subarray(0, split),
      bytes.subarray(split),
    ]);
    assert.equal(out, expected, `split at ${split}`);
  }
  for (let a = 0; a <= bytes.length; a += 3) {
    for (let b = a; b <= bytes.length; b += 5) {
      const { text: out } = streamThrough(redactor, [
        bytes.subarray(0, a),
        bytes.subarray(a, b),
        bytes.subarray(b),
      ]);
      assert.equal(out, expected, `splits at ${a} and ${b}`);
    }
  }
  const oneByte = [...bytes].map((byte) => new Uint8Array([byte]));
  assert.equal(streamThrough(redactor, oneByte).text, expected);
});

Deno.test("Redactor.stream() passes on at once everything that cannot start a secret", () => {
  const redactor = new Redactor();
  redactor.add("sk-live-1234567890");
  const stream = redactor.stream();
  const encode = (text: string) => new TextEncoder().encode(text);
  const decode = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  // A whole SSE event ends in a blank line, which no secret starts with: nothing is held back.
  assert.equal(decode(stream.push(encode('data: {"x":"sk"}\n\n'))), 'data: {"x":"sk"}\n\n');
  // Only the tail that may be the start of the secret waits for the next chunk.
  assert.equal(decode(stream.push(encode("token sk-live-12"))), "token ");
  assert.equal(decode(stream.push(encode("3 is not it"))), "sk-live-123 is not it");
  assert.equal(decode(stream.push(encode("s"))), "");
  assert.equal(decode(stream.push(encode("k-live-1234567890!"))), `${REDACTED}!`);
  assert.equal(decode(stream.end()), "");
});

Deno.test("Redactor.stream() keeps bytes that are not UTF-8 exactly and finds secrets among them", () => {
  const redactor = new Redactor();
  redactor.add("sk-live-1234567890");
  const all = Uint8Array.from({ length: 256 }, (_, i) => i);
  const secret = new TextEncoder().encode("sk-live-1234567890");
  const input = new Uint8Array([...all, ...secret, ...all]);
  const { outputs } = streamThrough(redactor, [input.subarray(0, 260), input.subarray(260)]);
  const out = new Uint8Array(outputs.reduce((n, o) => n + o.length, 0));
  let offset = 0;
  for (const o of outputs) {
    out.set(o, offset);
    offset += o.length;
  }
  assert.deepEqual(out, new Uint8Array([...all, ...new TextEncoder().encode(REDACTED), ...all]));
});

Deno.test("Redactor.stream() covers a secret registered after the stream started", () => {
  const redactor = new Redactor();
  const stream = redactor.stream();
  const encode = (text: string) => new TextEncoder().encode(text);
  assert.equal(new TextDecoder().decode(stream.push(encode("before "))), "before ");
  redactor.add("sk-late-1234567890");
  assert.equal(
    new TextDecoder().decode(stream.push(encode("sk-late-1234567890 after"))),
    `${REDACTED} after`,
  );
});
