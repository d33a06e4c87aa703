/**
 * `sandbox trust` as a user runs it: the real CLI as a subprocess in a repository holding a
 * committed `sandbox.yaml`, with a private XDG_CONFIG_HOME / XDG_STATE_HOME. No Docker: `config
 * show` tells which file applies.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { explain, runCli, tempDir } from "../_helpers.ts";

console.error("e2e: sandbox trust tests starting");

async function setup() {
  const dir = await tempDir("sandbox-e2e-trust-");
  const repo = `${dir.path}/repo`;
  await Deno.mkdir(`${repo}/sub`, { recursive: true });
  assert.equal((await run(["git", "init", "-q", repo])).exitCode, 0);
  const env = {
    XDG_CONFIG_HOME: `${dir.path}/xdg`,
    XDG_STATE_HOME: `${dir.path}/state`,
    SANDBOX_CONFIG: "",
  };
  const cli = (args: string[], cwd = repo) => runCli(args, { env, cwd, timeoutMs: 60_000 });
  return {
    dir,
    repo: await Deno.realPath(repo),
    cli,
    [Symbol.asyncDispose]: () => dir[Symbol.asyncDispose](),
  };
}

const BENIGN =
  "profiles:\n  work:\n    llm: {model: project-model}\n    sandbox: {resources: {memory: 1g}}\n";

Deno.test("a committed sandbox.yaml applies only after sandbox trust, and again only after a change is trusted", async () => {
  await using t = await setup();
  const file = `${t.repo}/sandbox.yaml`;
  await Deno.writeTextFile(file, BENIGN);
  const show = async (cwd?: string) => {
    const result = await t.cli(["config", "show", "--json"], cwd);
    assert.equal(result.exitCode, 0, explain(result));
    return { result, shown: JSON.parse(result.stdout) };
  };

  const before = await show(`${t.repo}/sub`);
  assert.equal(before.shown.file, null, "an untrusted file applied");
  assert.equal(before.shown.profiles.work, undefined);
  assert.match(before.result.stderr, new RegExp(`ignoring ${file}: it is not trusted`));
  assert.match(before.result.stderr, /profile work: llm model "project-model"/);
  assert.match(before.result.stderr, /profile work: resources memory 1g/);
  assert.match(before.result.stderr, new RegExp(`sandbox trust ${file}\n`));

  // Trusted from a subdirectory: the default is the file sandbox would find (the repository root's).
  const trusted = await t.cli(["trust"], `${t.repo}/sub`);
  assert.equal(trusted.exitCode, 0, explain(trusted));
  assert.match(trusted.stdout, new RegExp(`^trusted ${file} \\(sha256 [0-9a-f]{12}\\); it sets:`));
  const after = await show(`${t.repo}/sub`);
  assert.equal(after.shown.file, file);
  assert.equal(after.shown.profiles.work.llm.model, "project-model");
  assert.equal(after.shown.profiles.work.sandbox.resources.memory, "1g");
  assert.doesNotMatch(after.result.stderr, /ignoring/);

  const listed = await t.cli(["trust", "--list", "--json"]);
  assert.equal(listed.exitCode, 0, explain(listed));
  assert.deepEqual(
    JSON.parse(listed.stdout).map((e: { file: string; state: string }) => [e.file, e.state]),
    [[file, "trusted"]],
  );

  // A change, however small, needs trust again.
  await Deno.writeTextFile(file, BENIGN.replace("1g", "2g"));
  const changed = await show();
  assert.equal(changed.shown.file, null);
  assert.match(changed.result.stderr, /it changed since you trusted it/);
  const relisted = JSON.parse((await t.cli(["trust", "--list", "--json"])).stdout);
  assert.equal(relisted[0].state, "changed");
  assert.equal((await t.cli(["trust", "sandbox.yaml", "--json"])).exitCode, 0);
  assert.equal((await show()).shown.profiles.work.sandbox.resources.memory, "2g");

  const revoked = await t.cli(["trust", "--revoke", "--json"]);
  assert.deepEqual(JSON.parse(revoked.stdout), { file, revoked: true });
  assert.equal((await show()).shown.file, null);
  const again = await t.cli(["trust", "--revoke"]);
  assert.equal(again.exitCode, 0, explain(again));
  assert.match(again.stderr, /was not trusted/);
});

Deno.test("sandbox trust refuses a project file with a key command or a problem, and trusts nothing then", async () => {
  await using t = await setup();
  await Deno.writeTextFile(
    `${t.repo}/sandbox.yaml`,
    "profiles:\n  work:\n    llm: {provider: custom, base_url: 'http://127.0.0.1:9/v1', key: {command: [touch, pwned]}}\n",
  );
  const refused = await t.cli(["trust"]);
  assert.equal(refused.exitCode, 2, explain(refused));
  assert.match(refused.stderr, /profiles\.work\.llm\.key\.command: a key command runs on the host/);
  assert.equal(
    await Deno.stat(`${t.repo}/pwned`).then(() => true, () => false),
    false,
    "the key command ran",
  );
  const listed = await t.cli(["trust", "--list", "--json"]);
  assert.deepEqual(JSON.parse(listed.stdout), []);

  const none = await t.cli(["trust"], t.dir.path);
  assert.equal(none.exitCode, 2, explain(none));
  assert.match(none.stderr, /No project configuration file to trust/);
  assert.equal((await t.cli(["trust", "--list", "x"])).exitCode, 2);
});

Deno.test("sandbox trust takes an agent configuration directory file by file, shows what each sets, and --revoke forgets them all", async () => {
  await using t = await setup();
  await Deno.mkdir(`${t.repo}/.claude/agents`, { recursive: true });
  await Deno.writeTextFile(
    `${t.repo}/.claude/settings.json`,
    JSON.stringify({ hooks: { Stop: [] }, apiKeyHelper: "echo k" }),
  );
  await Deno.writeTextFile(`${t.repo}/.claude/agents/a.md`, "an agent\n");
  await Deno.symlink("/etc/passwd", `${t.repo}/.claude/link`);
  const trusted = await t.cli(["trust", ".claude"]);
  assert.equal(trusted.exitCode, 0, explain(trusted));
  assert.match(
    trusted.stdout,
    new RegExp(
      `^trusted ${t.repo}/\\.claude/agents/a\\.md \\(sha256 [0-9a-f]{12}\\); it sets:\n  9 bytes`,
    ),
  );
  assert.match(
    trusted.stdout,
    /\.claude\/settings\.json \(sha256 [0-9a-f]{12}\); it sets:\n {2}hooks "Stop" .*\n {2}apiKeyHelper "echo k" \(a command the agent runs\)/,
  );
  assert.match(trusted.stderr, /not trusted: .*\/\.claude\/link is not a regular file/);
  const listed = JSON.parse((await t.cli(["trust", "--list", "--json"])).stdout);
  assert.deepEqual(listed.map((e: { file: string }) => e.file), [
    `${t.repo}/.claude/agents/a.md`,
    `${t.repo}/.claude/settings.json`,
  ]);
  const revoked = await t.cli(["trust", "--revoke", ".claude", "--json"]);
  assert.deepEqual(JSON.parse(revoked.stdout).map((e: { revoked: boolean }) => e.revoked), [
    true,
    true,
  ], explain(revoked));
  assert.deepEqual(JSON.parse((await t.cli(["trust", "--list", "--json"])).stdout), []);
  // sandbox.yaml is still validated as one: a .json elsewhere is not agent configuration.
  await Deno.writeTextFile(`${t.repo}/other.json`, `{"profiles": {"work": {"agent": 1}}}`);
  assert.equal((await t.cli(["trust", "other.json"])).exitCode, 2);
});
