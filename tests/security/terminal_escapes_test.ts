/**
 * An agent that prints terminal control sequences — `ESC ]0;…BEL` (retitle the window),
 * `ESC [2J` (clear the screen), a C1 CSI (U+009B), a bare CR, DEL — in its command's output, its
 * command line and its final answer, in a real sandbox. What `run --format pretty` and
 * `logs --format pretty` write to the user's terminal must hold none of those bytes raw, only
 * visible escapes; the NDJSON log (the twin) still carries them, so the attack did arrive.
 */
import assert from "node:assert/strict";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { RunFixture } from "../_run_fixture.ts";
import { assertDocker, dockerTest, explain, spawnCli } from "../_helpers.ts";
import { run } from "../../lib/process.ts";

console.error("security: terminal escape tests starting");

/** A byte a terminal acts on: C0 but newline and tab, or DEL. */
// deno-lint-ignore no-control-regex
const C0_OR_DEL = /[\x00-\x08\x0b-\x1f\x7f]/;
/** Code points a terminal may act on once decoded: C0, DEL, C1. */
// deno-lint-ignore no-control-regex
const CONTROL = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/;

/** The command's output: title, clear screen, C1 CSI, CR overwrite, DEL. */
const PRINT_ESCAPES = String.raw`printf 'A\033]0;pwned-title\007B\033[2JC\302\2332JD\rE\177F\n'`;
/** A raw C1 CSI and an ESC in the command line itself (the tool call's input). */
const COMMAND = `${PRINT_ESCAPES}; echo 'in-argv \u009b2J \x1b[31m'`;
const ANSWER = "done \x1b]0;answer-title\x07 \u009b2J \x1b[2J\rhidden";

/** stdout of `sandbox ARGS` as bytes, and how it exited. */
async function cliBytes(
  fixture: RunFixture,
  args: string[],
): Promise<{ bytes: Uint8Array; code: number; stderr: string }> {
  const stderr: string[] = [];
  const child = spawnCli(args, {
    config: fixture.config,
    env: fixture.env,
    timeoutMs: 240_000,
    onStderrLine: (l) => stderr.push(l),
  });
  const [bytes, outcome] = await Promise.all([new Response(child.stdout).bytes(), child.finished]);
  return { bytes, code: outcome.exitCode, stderr: stderr.join("\n") };
}

/** No raw control byte, valid UTF-8 (a lone C1 byte is invalid), no decoded C1 either. */
function assertNoControls(bytes: Uint8Array, what: string): string {
  const latin1 = String.fromCharCode(...bytes);
  assert.ok(
    !C0_OR_DEL.test(latin1),
    `${what}: a raw control byte at ${latin1.search(C0_OR_DEL)}: ${JSON.stringify(latin1)}`,
  );
  const decoded = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  assert.ok(!CONTROL.test(decoded), `${what}: a control character: ${JSON.stringify(decoded)}`);
  return decoded;
}

Deno.test({
  name:
    "run and logs --format pretty show the agent's control sequences escaped; no raw control byte reaches stdout",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm([toolCall("execute", { command: COMMAND }), text(ANSWER)]);
    await using fixture = await RunFixture.make({
      prefix: "sec-esc",
      llmUrl: llm.baseUrl,
      keyEnv: "SANDBOX_SEC_ESC_KEY",
      prompt: "Print something colourful",
    });
    const runArgs = [
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "pretty",
    ];
    const live = await cliBytes(fixture, runArgs);
    assert.equal(live.code, 0, live.stderr);
    const id = /run (\S+) \(/.exec(live.stderr)?.[1];
    assert.ok(id, live.stderr);

    await t.step(
      "the twin: the run's NDJSON log carries the raw sequences, so they did reach the tool",
      async () => {
        const ndjson = await cliBytes(fixture, ["logs", id, "--format", "ndjson"]);
        assert.equal(ndjson.code, 0, ndjson.stderr);
        const events = new TextDecoder().decode(ndjson.bytes).trim().split("\n").map((l) =>
          JSON.parse(l)
        );
        const output: string = events.find((e) => e.type === "tool_result")?.tool_output ?? "";
        assert.ok(
          output.includes("A\x1b]0;pwned-title\x07B\x1b[2JC\u009b2JD\rE\x7fF"),
          JSON.stringify(output),
        );
        assert.ok(events.some((e) => e.type === "result" && e.content === ANSWER));
      },
    );

    for (
      const [what, args] of [["run --format pretty", undefined], ["logs --format pretty", [
        "logs",
        id,
        "--format",
        "pretty",
      ]]] as const
    ) {
      await t.step(`${what}: only visible escapes`, async () => {
        const shown = args ? await cliBytes(fixture, [...args]) : live;
        assert.equal(shown.code, 0, shown.stderr);
        const decoded = assertNoControls(shown.bytes, what);
        assert.match(decoded, /A\\e\]0;pwned-title\\aB\\e\[2JC\\u009b2JD\\rE\\x7fF/, decoded);
        assert.match(decoded, /in-argv \\u009b2J/, decoded);
        assert.ok(
          decoded.includes("done \\e]0;answer-title\\a \\u009b2J \\e[2J\\rhidden"),
          decoded,
        );
      });
    }
  },
});

Deno.test({
  name: "stderr notes show a ref name the agent made with control characters escaped",
  ...dockerTest(),
  async fn() {
    assertDocker();
    // A tag whose name holds a C1 CSI (valid in a ref name: git refuses only ASCII controls).
    await using llm = new FakeLlm([
      toolCall("execute", {
        command: String.raw`git tag "evil-$(printf '\302\2332J\302\235')" && echo tagged`,
      }),
      text("done"),
    ]);
    await using fixture = await RunFixture.make({
      prefix: "sec-esc-ref",
      llmUrl: llm.baseUrl,
      keyEnv: "SANDBOX_SEC_ESC_KEY",
      prompt: "Tag it",
    });
    const repo = `${fixture.dir.path}/repo`;
    const git = (...args: string[]) =>
      run(["git", "-C", repo, "-c", "user.name=u", "-c", "user.email=u@x", ...args]);
    await Deno.mkdir(repo);
    await git("init", "-q", "-b", "main");
    await Deno.writeTextFile(`${repo}/README.md`, "hi\n");
    await git("add", ".");
    await git("commit", "-qm", "init");
    const result = await fixture.cli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--repo",
      repo,
      "--format",
      "ndjson",
      "--lifecycle-events",
    ]);
    assert.equal(result.exitCode, 0, explain(result));
    // The twin: the machine-readable event carries the name as it is, so the attack did arrive.
    const event = result.stdout.trim().split("\n").map((l) => JSON.parse(l)).find((e) =>
      e.type === "sandbox.branch"
    );
    assert.deepEqual(event?.ignored_refs, ["refs/tags/evil-\u009b2J\u009d"], explain(result));
    assert.ok(
      !CONTROL.test(result.stderr),
      `a control character on stderr: ${JSON.stringify(result.stderr)}`,
    );
    assert.match(
      result.stderr,
      /^sandbox: warning: the sandbox created refs\/tags\/evil-\\u009b2J\\u009d: not imported/m,
      explain(result),
    );
  },
});
