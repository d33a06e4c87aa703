import assert from "node:assert/strict";
import { KeyStore } from "../../lib/keys.ts";
import { Redactor } from "../../lib/redact.ts";
import { SandboxError } from "../../lib/errors.ts";

const SECRET = "sk-test-0123456789abcdef";

/** A key command: a deno one-liner, so the test needs nothing but deno on the machine. */
function denoCommand(code: string): string[] {
  return [Deno.execPath(), "eval", "--quiet", code];
}

/** The error `promise` rejects with, checked to be a SandboxError. */
async function sandboxErrorOf(promise: Promise<unknown>): Promise<SandboxError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof SandboxError, `expected a SandboxError, got ${error}`);
    return error;
  }
  throw new Error("expected a rejection");
}

/** Everything a user could see of an error. */
function visible(error: SandboxError): string {
  return `${error.message}\n${error.detail ?? ""}\n${error.stack ?? ""}`;
}

Deno.test("KeyStore.resolve() reads an environment variable and registers it for redaction", async () => {
  const redactor = new Redactor();
  const store = new KeyStore({
    redactor,
    env: (name) => (name === "OPENAI_API_KEY" ? `  ${SECRET}\n` : undefined),
  });
  assert.equal(await store.resolve({ env: "OPENAI_API_KEY" }), SECRET);
  assert.equal(redactor.redact(`key=${SECRET}`), "key=[REDACTED]");
});

Deno.test("KeyStore.resolve() names an unset variable without a value", async () => {
  const store = new KeyStore({ env: () => undefined });
  const error = await sandboxErrorOf(store.resolve({ env: "ANTHROPIC_API_KEY" }));
  assert.equal(error.code, "config_invalid");
  assert.match(error.message, /"ANTHROPIC_API_KEY" is not set/);
});

Deno.test("KeyStore.resolve() caches a value in memory: the source is read once", async () => {
  let reads = 0;
  const store = new KeyStore({ env: () => (reads++, SECRET) });
  const [a, b] = await Promise.all([store.resolve({ env: "K" }), store.resolve({ env: "K" })]);
  assert.equal(await store.resolve({ env: "K" }), SECRET);
  assert.deepEqual([a, b, reads], [SECRET, SECRET, 1]);
});

Deno.test("KeyStore.resolve() does not cache a failure", async () => {
  const environment = new Map<string, string>();
  const store = new KeyStore({ env: (name) => environment.get(name) });
  await sandboxErrorOf(store.resolve({ env: "K" }));
  environment.set("K", SECRET);
  assert.equal(await store.resolve({ env: "K" }), SECRET);
});

Deno.test("KeyStore.resolve() runs a command and uses its trimmed stdout", async () => {
  const redactor = new Redactor();
  const store = new KeyStore({ redactor });
  const key = await store.resolve({ command: denoCommand(`console.log("  ${SECRET}  ")`) });
  assert.equal(key, SECRET);
  assert.equal(redactor.redact(SECRET), "[REDACTED]");
});

Deno.test("KeyStore.resolve() reports a failing command by program name, without its stdout", async () => {
  const store = new KeyStore();
  const argv = denoCommand(
    `console.log("${SECRET}"); console.error("vault is locked"); Deno.exit(3)`,
  );
  const error = await sandboxErrorOf(store.resolve({ command: argv }));
  assert.equal(error.code, "config_invalid");
  assert.ok(error.message.includes(`"${Deno.execPath()}"`), error.message);
  assert.match(error.message, /exit code 3/);
  assert.match(error.detail ?? "", /vault is locked/);
  assert.ok(!visible(error).includes(SECRET), visible(error));
  // The arguments (which may hold a vault path or passphrase) are never shown either.
  assert.ok(!visible(error).includes("console.log"), visible(error));
});

Deno.test("KeyStore.resolve() rejects a command that prints nothing", async () => {
  const error = await sandboxErrorOf(
    new KeyStore().resolve({ command: denoCommand(`console.log("   ")`) }),
  );
  assert.equal(error.code, "config_invalid");
  assert.match(error.message, /printed nothing/);
});

Deno.test("KeyStore.resolve() reports a missing program as a configuration error", async () => {
  const store = new KeyStore();
  const error = await sandboxErrorOf(
    store.resolve({ command: ["sandbox-no-such-program-x", "--secret-arg"] }),
  );
  assert.equal(error.code, "config_invalid");
  assert.match(error.message, /"sandbox-no-such-program-x"/);
  assert.ok(!visible(error).includes("--secret-arg"));
});

Deno.test("KeyStore.resolve() gives up on a command that does not answer in time", async () => {
  const store = new KeyStore({ commandTimeoutMs: 200 });
  const argv = denoCommand(
    `console.log("${SECRET}"); await new Promise(() => setInterval(() => {}, 1000))`,
  );
  const error = await sandboxErrorOf(store.resolve({ command: argv }));
  assert.equal(error.code, "config_invalid");
  assert.match(error.message, /no answer after 200 ms/);
  assert.ok(!visible(error).includes(SECRET));
});

Deno.test("KeyStore.getter() returns a function that resolves the cached key", async () => {
  const store = new KeyStore({ env: () => SECRET });
  const key = store.getter({ env: "K" });
  assert.equal(await key(), SECRET);
});
