/**
 * The session token dies with the session, shown the way an agent would try it: a command in a
 * real sandbox reads `$SANDBOX_LLM_TOKEN` during one `exec` (or run) and hands it out; after that
 * session has ended, a command in a later session presents the captured token to the credential
 * proxy (and, for runs on a remote repository, to the git proxy) and is refused with 401 — while
 * the later session's own token, on the same path from the same place, is served. The fake LLM and
 * the git remote count what reached them, so a refusal means nothing was forwarded.
 *
 * Everything inside the sandbox depends only on `$SANDBOX_LLM_BASE_URL`, `$SANDBOX_GIT_URL` and the
 * token, so it holds whatever carries the sandbox's connections to the host. The captured token
 * travels base64-encoded (as a leaking agent would send it), so no redaction can hide it.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { GitHttpServer } from "../_git_server.ts";
import { RunFixture } from "../_run_fixture.ts";
import { assertDocker, dockerTest, explain, writeConfig } from "../_helpers.ts";

console.error("security: session token lifetime tests starting");

const KEY_ENV = "SANDBOX_SEC_TOKEN_KEY";

/** An OpenAI-style call through the credential proxy with token `$1`; prints `NAME=<status>`. */
const LLM_CALL =
  `llm() { printf '%s=%s\\n' "$1" "$(curl -s --noproxy '*' --max-time 60 -o /dev/null -w '%{http_code}' ` +
  `-H "Authorization: Bearer $2" -H 'Content-Type: application/json' ` +
  `--data '{"model":"m","messages":[{"role":"user","content":"hi"}]}' "$SANDBOX_LLM_BASE_URL/chat/completions")"; }`;
/** A fetch's first request through the git proxy with token `$2` (as git sends it); prints `NAME=<status>`. */
const GIT_CALL =
  `gitcall() { printf '%s=%s\\n' "$1" "$(curl -s --noproxy '*' --max-time 60 -o /dev/null -w '%{http_code}' ` +
  `-u "x-access-token:$2" "$SANDBOX_GIT_URL/info/refs?service=git-upload-pack")"; }`;
/** Prints the session's token, base64-encoded, as `captured=…`. */
const CAPTURE = `printf 'captured=%s\\n' "$(printf %s "$SANDBOX_LLM_TOKEN" | base64 -w0)"`;

/** `NAME=value` lines of a command's output, by name (the first of each). */
function said(output: string): Map<string, string> {
  const values = new Map<string, string>();
  for (const line of output.split("\n")) {
    const match = /^([a-z-]+)=(.*)$/.exec(line);
    if (match && !values.has(match[1])) values.set(match[1], match[2]);
  }
  return values;
}

/** The captured token, decoded; it must look like a session token. */
function capturedToken(values: Map<string, string>, context: string): string {
  const encoded = values.get("captured");
  assert.ok(encoded, `the command printed no token\n${context}`);
  const token = atob(encoded);
  assert.match(token, /^sbx_[A-Za-z0-9_-]{20,}$/, `not a session token: ${token}\n${context}`);
  return token;
}

Deno.test({
  name:
    "a token captured during one exec is refused with 401 by the credential proxy of a later exec, whose own token passes",
  ...dockerTest(),
  async fn() {
    assertDocker();
    // One answer for the first exec's own call, one for the later exec's twin.
    await using llm = new FakeLlm([text("first session"), text("later session")]);
    await using fixture = await RunFixture.make({
      prefix: "sec-tok-exec",
      llmUrl: llm.baseUrl,
      keyEnv: KEY_ENV,
      prompt: "unused",
    });

    const first = await fixture.cli([
      "exec",
      "-p",
      fixture.profile,
      "--",
      "bash",
      "-c",
      `${LLM_CALL}; ${CAPTURE}; llm during "$SANDBOX_LLM_TOKEN"`,
    ]);
    const firstContext = explain(first);
    assert.equal(first.exitCode, 0, firstContext);
    const firstSaid = said(first.stdout);
    const token = capturedToken(firstSaid, firstContext);
    // While its session lived, the token was good: the proxy forwarded the call.
    assert.equal(firstSaid.get("during"), "200", firstContext);
    assert.equal(llm.completions, 1, firstContext);

    // The later exec reads the old token from stdin (never argv), then tries both tokens.
    const later = await run(
      [
        Deno.execPath(),
        "run",
        "-A",
        "--quiet",
        new URL("../../cli.ts", import.meta.url).pathname,
        "--config",
        fixture.config,
        "exec",
        "-p",
        fixture.profile,
        "--",
        "bash",
        "-c",
        `${LLM_CALL}; read -r old; llm old "$old"; llm own "$SANDBOX_LLM_TOKEN"`,
      ],
      { env: fixture.env, stdin: `${token}\n`, timeoutMs: 240_000 },
    );
    const context = explain(later);
    assert.equal(later.exitCode, 0, context);
    const laterSaid = said(later.stdout);
    assert.equal(laterSaid.get("old"), "401", `the old token was not refused\n${context}`);
    assert.equal(
      laterSaid.get("own"),
      "200",
      `the twin with the session's own token failed\n${context}`,
    );
    // Exactly one more request reached the LLM: the twin's.
    assert.equal(llm.completions, 2, context);
    const tokens = llm.requests.map((r) => r.headers.get("authorization"));
    assert.ok(tokens.every((t) => !t?.includes(token)), "the old token reached the LLM");
  },
});

/** A bare remote with one commit on main, served by `git http-backend` with a token. */
async function makeRemote(dir: string): Promise<GitHttpServer> {
  const git = async (...args: string[]) => {
    const result = await run(["git", ...args]);
    assert.equal(result.exitCode, 0, `git ${args.join(" ")}: ${result.stderr}`);
  };
  await git("init", "-q", "--bare", `${dir}/remotes/proj.git`);
  await git("init", "-q", "-b", "main", `${dir}/seed`);
  await Deno.writeTextFile(`${dir}/seed/README.md`, "remote readme\n");
  await git("-C", `${dir}/seed`, "add", ".");
  await git(
    "-C",
    `${dir}/seed`,
    "-c",
    "user.name=u",
    "-c",
    "user.email=u@x",
    "commit",
    "-qm",
    "init",
  );
  await git("-C", `${dir}/seed`, "push", "-q", `${dir}/remotes/proj.git`, "main");
  await git("-C", `${dir}/remotes/proj.git`, "symbolic-ref", "HEAD", "refs/heads/main");
  return new GitHttpServer(`${dir}/remotes`, `ghp_${crypto.randomUUID().replaceAll("-", "")}`);
}

/** The output of a run's execute call, from its NDJSON stdout. */
function executeOutput(stdout: string): string {
  const messages = stdout.trim().split("\n").filter(Boolean).map((line, i) =>
    decodeMessage(line, i + 1)
  );
  return messages.find((m) => m.type === "tool_result" && m.tool_name === "execute")?.tool_output ??
    "";
}

Deno.test({
  name:
    "a token captured during a run on a remote repository is refused with 401 by a later run's credential and git proxies, whose own token passes",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-tok-run",
      llmUrl: llm.baseUrl,
      keyEnv: KEY_ENV,
      prompt: "Look around",
    });
    await using server = await makeRemote(fixture.dir.path);
    fixture.config = await writeConfig(
      fixture.dir.path,
      `profiles:\n  ${fixture.profile}:\n` +
        `    llm: {provider: custom, base_url: "${llm.baseUrl}", key: {env: ${KEY_ENV}}}\n` +
        `    git: {token: {env: SANDBOX_SEC_TOKEN_GIT}}\n`,
    );
    const env = { SANDBOX_SEC_TOKEN_GIT: server.token };
    const runArgs = [
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "ndjson",
      "--repo",
      server.url("proj.git"),
    ];

    // Run 1: the agent captures its token and uses it once on the git proxy (it works).
    llm.script.push(
      toolCall("execute", {
        command: `${GIT_CALL}; ${CAPTURE}; gitcall during "$SANDBOX_LLM_TOKEN"`,
      }),
      text("captured"),
    );
    const first = await fixture.cli(runArgs, env);
    const firstOutput = executeOutput(first.stdout);
    const firstContext = `${explain(first)}\n--- agent output\n${firstOutput}`;
    assert.equal(first.exitCode, 0, firstContext);
    const firstSaid = said(firstOutput);
    const token = capturedToken(firstSaid, firstContext);
    assert.equal(
      firstSaid.get("during"),
      "200",
      `the token did not work during its own run\n${firstContext}`,
    );
    const gitRequests = server.authorizations.length;
    const completions = llm.completions;

    // Run 2: a new session. Its agent presents the old token, then its own, to both proxies.
    llm.script.push(
      toolCall("execute", {
        command: `${LLM_CALL}; ${GIT_CALL}; old=$(printf %s '${btoa(token)}' | base64 -d); ` +
          `llm llm-old "$old"; gitcall git-old "$old"; llm llm-own "$SANDBOX_LLM_TOKEN"; gitcall git-own "$SANDBOX_LLM_TOKEN"`,
      }),
      text("the twin's answer"), // served to the agent's own call with its own token
      text("tried both"),
    );
    const later = await fixture.cli(runArgs, env);
    const output = executeOutput(later.stdout);
    const context = `${explain(later)}\n--- agent output\n${output}`;
    assert.equal(later.exitCode, 0, context);
    const laterSaid = said(output);
    assert.equal(
      laterSaid.get("llm-old"),
      "401",
      `the credential proxy did not refuse the old token\n${context}`,
    );
    assert.equal(
      laterSaid.get("git-old"),
      "401",
      `the git proxy did not refuse the old token\n${context}`,
    );
    assert.equal(
      laterSaid.get("llm-own"),
      "200",
      `the twin on the credential proxy failed\n${context}`,
    );
    assert.equal(laterSaid.get("git-own"), "200", `the twin on the git proxy failed\n${context}`);
    // What reached the upstreams: run 2's own LLM calls (two worker turns and the twin) and its
    // git requests (the fetch into the sandbox and the twin); nothing for the old token.
    assert.equal(llm.completions, completions + 3, context);
    assert.ok(server.authorizations.length > gitRequests, context);
    assert.ok(
      llm.requests.every((r) => !r.headers.get("authorization")?.includes(token)),
      "the old token reached the LLM",
    );
  },
});
