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
