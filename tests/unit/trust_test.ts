/** The trust store for project configuration files, and the summary shown before trusting one. */
import assert from "node:assert/strict";
import { quoteForTerminal, shellQuote, summarizeConfig } from "../../lib/config_summary.ts";
import { SandboxError } from "../../lib/errors.ts";
import {
  listTrust,
  revokeTrust,
  sha256OfBytes,
  trustContent,
  trustStateOf,
} from "../../lib/trust.ts";
import { tempDir } from "../_helpers.ts";

const encode = (text: string) => new TextEncoder().encode(text);

Deno.test("trust is for exact content at a path: other content, or another path, is not trusted", async () => {
  await using dir = await tempDir();
  const store = `${dir.path}/state/trusted.json`;
  const file = `${dir.path}/sandbox.yaml`;
  await Deno.writeTextFile(file, "profiles: {}\n");
  assert.equal(await trustStateOf(file, encode("profiles: {}\n"), store), "untrusted");
  const entry = await trustContent(file, encode("profiles: {}\n"), store);
  assert.equal(entry.file, await Deno.realPath(file));
  assert.equal(entry.sha256, await sha256OfBytes(encode("profiles: {}\n")));
  assert.equal(await trustStateOf(file, encode("profiles: {}\n"), store), "trusted");
  assert.equal(await trustStateOf(file, encode("profiles: {} \n"), store), "changed");
  const copy = `${dir.path}/copy.yaml`;
  await Deno.writeTextFile(copy, "profiles: {}\n");
  assert.equal(await trustStateOf(copy, encode("profiles: {}\n"), store), "untrusted");
  // A symlink is trusted under its target's real path, so it cannot borrow another file's trust
  // once the target changes.
  await Deno.symlink(file, `${dir.path}/link.yaml`);
  assert.equal(
    await trustStateOf(`${dir.path}/link.yaml`, encode("profiles: {}\n"), store),
    "trusted",
  );
});

Deno.test("the store is private to the user and replaced whole: no temporary files left, entries kept", async () => {
  await using dir = await tempDir();
  const store = `${dir.path}/state/trusted.json`;
  const files = await Promise.all(Array.from({ length: 8 }, async (_, i) => {
    const file = `${dir.path}/f${i}.yaml`;
    await Deno.writeTextFile(file, `# ${i}\n`);
    return file;
  }));
  // Concurrent trusts must not lose each other's entries (the store is updated under a lock).
  await Promise.all(
    files.map(async (file) => await trustContent(file, await Deno.readFile(file), store)),
  );
  const listed = await listTrust(store);
  assert.deepEqual(
    listed.map((e) => e.file).sort(),
    (await Promise.all(files.map((f) => Deno.realPath(f)))).sort(),
  );
  assert.ok(listed.every((e) => e.state === "trusted"));
  assert.equal((await Deno.stat(store)).mode! & 0o777, 0o600);
  const leftovers = [];
  for await (const entry of Deno.readDir(`${dir.path}/state`)) leftovers.push(entry.name);
  assert.deepEqual(leftovers.sort(), ["trusted.json", "trusted.json.lock"]);

  await Deno.writeTextFile(files[0], "# changed\n");
  await Deno.remove(files[1]);
  const states = Object.fromEntries(
    (await listTrust(store)).map((e) => [e.file.split("/").pop(), e.state]),
  );
  assert.equal(states["f0.yaml"], "changed");
  assert.equal(states["f1.yaml"], "missing");
  assert.equal(states["f2.yaml"], "trusted");

  assert.equal(await revokeTrust(files[2], store), true);
  assert.equal(await revokeTrust(files[2], store), false);
  assert.equal(await trustStateOf(files[2], await Deno.readFile(files[2]), store), "untrusted");
});

Deno.test("a corrupt store trusts nothing, and trusting reports it instead of overwriting it", async () => {
  await using dir = await tempDir();
  const store = `${dir.path}/trusted.json`;
  const file = `${dir.path}/sandbox.yaml`;
  await Deno.writeTextFile(file, "profiles: {}\n");
  await trustContent(file, encode("profiles: {}\n"), store);
  await Deno.writeTextFile(store, "{not json");
  assert.equal(await trustStateOf(file, encode("profiles: {}\n"), store), "untrusted");
  await assert.rejects(trustContent(file, encode("profiles: {}\n"), store), (error: unknown) => {
    assert.ok(error instanceof SandboxError);
    assert.equal(error.code, "config_invalid");
    assert.match(error.message, /is not a trust store/);
    return true;
  });
  assert.equal(await Deno.readTextFile(store), "{not json");
});

Deno.test("the summary of a file cannot write terminal escapes and never shows a variable's value", () => {
  const hostile = "profiles:\n  work:\n" +
    '    llm: {provider: custom, base_url: "http://evil.test/\\e]0;pwned\\a\\e[2J\\u009b31m", key: {command: [sh, -c, x]}}\n' +
    "    sandbox: {environment: {set: {NOTES: '${HOME}'}}}\n";
  const lines = summarizeConfig(hostile);
  const text = lines.join("\n");
  // deno-lint-ignore no-control-regex -- asserting the absence of control characters
  assert.doesNotMatch(text, /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/);
  assert.match(text, /\\u001b\]0;pwned\\u0007\\u001b\[2J\\u009b31m/);
  assert.match(text, /key from a command run on the host \(never allowed in a project file\)/);
  assert.match(text, /environment set NOTES/);
  assert.ok(!text.includes(Deno.env.get("HOME") ?? "\0"), "a variable's value is in the summary");
  assert.deepEqual(summarizeConfig("profiles: [unclosed"), ["(not valid YAML)"]);
  assert.deepEqual(summarizeConfig("just a string"), ["(no settings)"]);
  assert.equal(quoteForTerminal("a\u202eb"), '"a\\u202eb"');
});

Deno.test("the trust command's path is one pasteable shell word, without raw control characters", () => {
  assert.equal(shellQuote("/src/app/sandbox.yaml"), "/src/app/sandbox.yaml");
  assert.equal(shellQuote("/src/my app/it's.yaml"), `'/src/my app/it'\\''s.yaml'`);
  assert.equal(shellQuote("/src/\u001b[2J/sandbox.yaml"), "$'/src/\\x1b[2J/sandbox.yaml'");
});
