/**
 * Every careless input we know of, fed to the CLI as a user would type it: each is one
 * `sandbox: error: ...` on stderr (commander's usage errors included), exit 2, nothing on stdout, no
 * stack frame anywhere, and nothing started (no run recorded, so no sandbox was touched).
 */
import assert from "node:assert/strict";
import { ROOT, runCli, tempDir, uniqueProfile, writeConfig } from "../_helpers.ts";
import type { RunResult } from "../../lib/process.ts";
import { fakeDocker } from "../unit/_fake_docker.ts";

console.error("e2e: user mistakes starting");

/** A stack frame as V8 prints it, or a module URL (a frame's location). */
const STACK = /^\s+at |file:\/\//m;

interface Mistake {
  name: string;
  args: string[];
  /** What stderr must say. */
  says: RegExp;
  /** Use this config file instead of the fixture's. */
  config?: string;
  env?: Record<string, string>;
}

function explain(result: RunResult): string {
  return `exit ${result.exitCode}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`;
}

Deno.test({
  name: "no user mistake prints a stack trace: each exits 2 with one error line and starts nothing",
  async fn(t) {
    await using dir = await tempDir("sandbox-e2e-mistakes-");
    const d = dir.path;
    const profile = uniqueProfile("e2e-mistakes");
    const config = await writeConfig(
      d,
      `profiles:\n  ${profile}:\n    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: SANDBOX_E2E_NEVER_SET_KEY}}\n` +
        `  ${profile}-openai: {}\n`,
    );
    const state = `${d}/state`;
    await Deno.writeTextFile(`${d}/prompt.txt`, "Say hi\n");
    await Deno.writeTextFile(`${d}/empty.txt`, "  \n");
    const write = async (name: string, value: unknown) => {
      await Deno.writeTextFile(
        `${d}/${name}`,
        typeof value === "string" ? value : JSON.stringify(value),
      );
      return `${d}/${name}`;
    };
    const good = JSON.parse(await Deno.readTextFile(`${ROOT}/examples/hello/recording.json`));
    const rec = (responses: unknown[], extra: Record<string, unknown> = {}) => ({
      version: 1,
      kind: "openai",
      responses,
      ...extra,
    });
    const completion = {
      status: 200,
      body: { choices: [{ index: 0, message: { role: "assistant", content: "hi" } }] },
    };
    const replay = (
      file: string,
    ) => [
      "run",
      "agentic",
      "--prompt-file",
      `${d}/prompt.txt`,
      "-p",
      profile,
      "-m",
      `replay:${file}`,
    ];
    const agentic = (
      ...more: string[]
    ) => ["run", "agentic", "--prompt-file", `${d}/prompt.txt`, "-p", profile, ...more];

    const mistakes: Mistake[] = [
      // Recordings of each kind of wrong.
      {
        name: "a recording that is not JSON",
        args: replay(await write("r1.json", "{oops")),
        says: /^sandbox: error: Invalid recording ".*r1\.json": not JSON/m,
      },
      {
        name: "a recording that does not exist",
        args: replay(`${d}/nowhere.json`),
        says: /^sandbox: error: Cannot read recording ".*nowhere\.json": file not found$/m,
      },
      {
        name: "a recording that is a list",
        args: replay(await write("r2.json", [completion])),
        says: /^sandbox: {3}expected an object like/m,
      },
      {
        name: "a recording of another version",
        args: replay(await write("r3.json", { ...good, version: 2 })),
        says: /^sandbox: {3}version: expected 1, found number 2$/m,
      },
      {
        name: "a recording without a kind",
        args: replay(await write("r4.json", { version: 1, responses: good.responses })),
        says: /^sandbox: {3}kind: expected "openai", "anthropic" or "openai-responses"/m,
      },
      {
        name: "a recording with no responses",
        args: replay(await write("r5.json", rec([]))),
        says: /^sandbox: {3}responses: the list is empty/m,
      },
      {
        name: "a recording whose entry is not a chat completion",
        args: replay(
          await write("r6.json", rec([completion, { status: 200, body: { text: "hi" } }])),
        ),
        says: /^sandbox: {3}responses\[1\]\.body: not a chat completion: no "choices" list$/m,
      },
      {
        name: "a recording whose entry is not an object",
        args: replay(await write("r7.json", rec(["hi"]))),
        says: /^sandbox: {3}responses\[0\]: expected \{"status": 200/m,
      },
      {
        name: "a recording whose tool call arguments are not JSON",
        args: replay(
          await write(
            "r8.json",
            rec([{
              status: 200,
              body: {
                choices: [{
                  message: {
                    content: null,
                    tool_calls: [{
                      id: "c",
                      type: "function",
                      function: { name: "ls", arguments: "{" },
                    }],
                  },
                }],
              },
            }]),
          ),
        ),
        says: /tool_calls\[0\]\.function\.arguments: not valid JSON$/m,
      },
      {
        name: "a recording entry without a status",
        args: replay(await write("r9.json", rec([{ body: completion.body }]))),
        says: /^sandbox: {3}responses\[0\]\.status: expected an HTTP status/m,
      },
      {
        name: "recording a replay",
        args: [...replay(`${ROOT}/examples/hello/recording.json`), "--record", `${d}/out.json`],
        says: /^sandbox: error: Cannot --record a replayed run$/m,
      },
      // Prompts and instructions.
      {
        name: "a prompt file that does not exist",
        args: ["run", "agentic", "--prompt-file", `${d}/missing.txt`, "-p", profile],
        says: /^sandbox: error: Cannot read prompt file ".*missing\.txt"/m,
      },
      {
        name: "an empty prompt",
        args: [
          "run",
          "agentic",
          "--prompt-file",
          `${d}/empty.txt`,
          "-p",
          profile,
          "-m",
          `replay:${ROOT}/examples/hello/recording.json`,
        ],
        says: /^sandbox: error: The prompt is empty$/m,
      },
      {
        name: "an instructions file that does not exist",
        args: agentic("--instructions-file", `${d}/nope.md`),
        says: /^sandbox: error: Cannot read instructions file/m,
      },
      // Flags.
      {
        name: "an unknown option",
        args: agentic("--frobnicate"),
        says: /^sandbox: error: unknown option '--frobnicate'$/m,
      },
      {
        name: "a misspelled option",
        args: agentic("--formt", "ndjson"),
        says:
          /^sandbox: error: unknown option '--formt'\nsandbox: {3}\(Did you mean --format\?\)$/m,
      },
      {
        name: "an unknown command",
        args: ["frobnicate"],
        says: /^sandbox: error: unknown command 'frobnicate'$/m,
      },
      {
        name: "a missing required option",
        args: ["run", "agentic", "-p", profile],
        says: /^sandbox: error: required option '--prompt-file <file>' not specified$/m,
      },
      {
        name: "a format that does not exist",
        args: agentic("--format", "xml"),
        says: /^sandbox: error: option '--format <format>' argument 'xml' is invalid/m,
      },
      {
        name: "repository flags without --repo",
        args: agentic("--branch", "x"),
        says: /^sandbox: error: --base, --branch, --keep-worktree and --push need --repo$/m,
      },
      {
        name: "exec without a command",
        args: ["exec", "-p", profile],
        says: /^sandbox: error: missing required argument 'command'/m,
      },
      {
        name: "exec -e without a value",
        args: ["exec", "-p", profile, "-e", "FOO", "--", "true"],
        says: /^sandbox: error: Invalid --env "FOO": expected KEY=VALUE$/m,
      },
      // Durations.
      {
        name: "a run timeout that is not a duration",
        args: agentic("--timeout", "5x"),
        says: /^sandbox: error: Invalid --timeout "5x": expected a duration like "30m"/m,
      },
      {
        name: "a zero run timeout",
        args: agentic("--timeout", "0s"),
        says: /^sandbox: error: Invalid --timeout "0s"/m,
      },
      {
        name: "an exec timeout that is not a duration",
        args: ["exec", "-p", profile, "--timeout", "soon", "--", "true"],
        says: /^sandbox: error: Invalid --timeout "soon"/m,
      },
      // Configuration and profiles.
      {
        name: "a config file that does not exist",
        args: agentic(),
        config: `${d}/nowhere.yaml`,
        says:
          /^sandbox: error: Invalid configuration in ".*nowhere\.yaml"\n.*cannot read: file not found/m,
      },
      {
        name: "a config file that is not YAML",
        args: agentic(),
        config: await write("bad.yaml", "profiles: [unclosed"),
        says: /^sandbox: {3}YAML syntax:/m,
      },
      {
        name: "a config key that does not exist",
        args: [
          "config",
          "validate",
          await write("typo.yaml", "profiles:\n  x:\n    sandbox: {netwrk: {}}\n"),
        ],
        says: /^sandbox: {3}profiles\.x\.sandbox: unknown key "netwrk"$/m,
      },
      {
        name: "too few processes",
        args: [
          "config",
          "validate",
          await write("pids.yaml", "profiles:\n  x:\n    sandbox: {resources: {pids: 5}}\n"),
        ],
        says: /^sandbox: {3}profiles\.x\.sandbox\.resources\.pids: expected at least 16 processes/m,
      },
      {
        name: "an unknown profile",
        args: ["run", "agentic", "--prompt-file", `${d}/prompt.txt`, "-p", "no-such-profile"],
        says: /^sandbox: error: Unknown profile "no-such-profile"$/m,
      },
      {
        name: "an unknown profile for stop",
        args: ["stop", "-p", "no-such-profile"],
        says: /^sandbox: error: Unknown profile "no-such-profile"$/m,
      },
      // Schemas.
      {
        name: "a schema file that does not exist",
        args: [
          "run",
          "generate",
          "--prompt-file",
          `${d}/prompt.txt`,
          "-p",
          profile,
          "--schema",
          `${d}/none.json`,
        ],
        says: /^sandbox: error: Cannot read schema ".*none\.json"/m,
      },
      {
        name: "a schema that is not JSON",
        args: [
          "run",
          "generate",
          "--prompt-file",
          `${d}/prompt.txt`,
          "-p",
          profile,
          "--schema",
          await write("s1.json", "{"),
        ],
        says: /^sandbox: error: Schema ".*s1\.json" is not valid JSON/m,
      },
      {
        name: "a schema that is not an object",
        args: [
          "run",
          "generate",
          "--prompt-file",
          `${d}/prompt.txt`,
          "-p",
          profile,
          "--schema",
          await write("s2.json", "[1]"),
        ],
        says: /^sandbox: error: Schema ".*s2\.json" is not a JSON Schema object$/m,
      },
      // Runs.
      {
        name: "logs of an unknown run",
        args: ["logs", "20990101-000000-abcdef"],
        says: /^sandbox: error: No run "20990101-000000-abcdef"$/m,
      },
      {
        name: "cp from an unknown run",
        args: ["cp", "20990101-000000-abcdef:x.txt", d],
        says: /^sandbox: error: No run "20990101-000000-abcdef"$/m,
      },
      {
        name: "cp with no sandbox side",
        args: ["cp", `${d}/prompt.txt`, `${d}/copy.txt`],
        says: /^sandbox: error: Neither SRC nor DST is in a sandbox$/m,
      },
      {
        name: "cp with two sandbox sides",
        args: ["cp", ":a", ":b"],
        says: /^sandbox: error: Both SRC and DST are in a sandbox$/m,
      },
      {
        name: "cp of a host file that does not exist",
        args: ["cp", "-p", profile, `${d}/nowhere.txt`, ":x"],
        says: /^sandbox: error: No such file or directory: ".*nowhere\.txt"$/m,
      },
      // The key, read before anything starts.
      {
        name: "a missing API key (custom provider)",
        args: agentic(),
        says: new RegExp(
          `^sandbox: error: Cannot run profile "${profile}": cannot read API key: environment variable "SANDBOX_E2E_NEVER_SET_KEY" is not set$`,
          "m",
        ),
      },
      {
        name: "a missing API key (openai)",
        args: ["run", "agentic", "--prompt-file", `${d}/prompt.txt`, "-p", `${profile}-openai`],
        env: { OPENAI_API_KEY: "" },
        says: new RegExp(
          `^sandbox: error: Cannot run profile "${profile}-openai": cannot read API key: environment variable "OPENAI_API_KEY" is not set$\\n^sandbox: {3}Set OPENAI_API_KEY`,
          "m",
        ),
      },
    ];

    for (const mistake of mistakes) {
      await t.step(mistake.name, async () => {
        const result = await runCli(mistake.args, {
          config: mistake.config ?? config,
          env: { XDG_STATE_HOME: state, SANDBOX_E2E_NEVER_SET_KEY: "", ...mistake.env },
          timeoutMs: 60_000,
        });
        const context = explain(result);
        assert.equal(result.exitCode, 2, context);
        assert.match(result.stderr, mistake.says, context);
        assert.doesNotMatch(result.stderr, STACK, `a stack frame on stderr\n${context}`);
        assert.doesNotMatch(
          result.stderr,
          /internal error|TypeError|ZodError|Number must be/,
          context,
        );
        assert.equal(result.stdout, "", context);
        // Every line is ours, prefixed: commander's hints and suggestions included.
        for (const line of result.stderr.trimEnd().split("\n")) {
          assert.match(line, /^sandbox: /, context);
        }
      });
    }

    await t.step("nothing was started: no run was recorded", async () => {
      const runs = [];
      try {
        for await (const entry of Deno.readDir(`${state}/sandbox/runs`)) runs.push(entry.name);
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      }
      assert.deepEqual(runs, []);
    });
  },
});

Deno.test({
  name:
    "a missing API key stops run before anything starts: exit 2 naming the variable and the profile, and no docker command run",
  async fn() {
    await using dir = await tempDir("sandbox-e2e-nokey-");
    // A docker that records every call: the run must stop before it asks docker anything (no
    // sandbox, image or retry is waited for). The event, not a time bound on a busy machine.
    await using docker = await fakeDocker(
      `echo "fake docker: not expected to be called" >&2; exit 1`,
    );
    const profile = uniqueProfile("e2e-nokey");
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${profile}:\n    llm: {provider: anthropic}\n`,
    );
    await Deno.writeTextFile(`${dir.path}/prompt.txt`, "Say hi\n");
    const result = await runCli([
      "run",
      "agentic",
      "--prompt-file",
      `${dir.path}/prompt.txt`,
      "-p",
      profile,
    ], {
      config,
      env: {
        XDG_STATE_HOME: `${dir.path}/state`,
        ANTHROPIC_API_KEY: "",
        PATH: `${docker.dir}:${Deno.env.get("PATH")}`,
      },
      timeoutMs: 60_000,
    });
    const context = explain(result);
    assert.equal(result.exitCode, 2, context);
    assert.match(
      result.stderr,
      new RegExp(`Cannot run profile "${profile}": .*"ANTHROPIC_API_KEY" is not set`),
      context,
    );
    assert.equal(result.stdout, "", context);
    assert.deepEqual(
      await docker.calls(),
      [],
      `docker was called before the key was checked\n${context}`,
    );
    assert.equal(
      await Deno.stat(`${dir.path}/state/sandbox/runs`).then(() => true, () => false),
      false,
      "a run was recorded",
    );
  },
});
