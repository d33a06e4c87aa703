/**
 * Claude Code's subscription token stays on the host: `sandbox run agentic --interactive --agent
 * claude-code --repo` opens the real TUI (the pinned package, from its image layer) in a real
 * terminal (tmux), against a scripted fake Anthropic upstream on 127.0.0.1 that accepts only the
 * token, as `Authorization: Bearer` with the OAuth beta flag.
 *
 * A prompt typed in the pane makes the agent (the attacker here) search its sandbox for the token
 * with its Bash tool, every process's environment and command line and every file it can read,
 * and write what it found into the repository; then write a file. Both come back on the branch:
 * the search found the placeholder it was given (the session token) and never the subscription
 * token nor the host's API key; the test's own search of every process, file and `docker
 * inspect` of the live sandbox finds neither. The positive twin: the upstream received the token
 * from the host's credential proxy on every call, so the agent worked with it.
 */
import assert from "node:assert/strict";
import { agentContainer, createRepo, git, submit, whereIs } from "../_agent_tui.ts";
import { type AgentLlmRequest, type AgentStep, FakeAgentLlm } from "../_fake_agent_llm.ts";
import {
  assertDocker,
  CLI,
  dockerTest,
  removeProfile,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { Tmux } from "../_tmux.ts";

console.error("security: subscription token test starting");

const SEARCH = [
  "{ env; for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; tr '\\0' ' ' < $p/cmdline; echo; done;",
  "grep -rl sk-ant- /home /tmp /workspace /opt; } > found.txt 2>/dev/null; echo SEARCHED",
].join(" ");

/** A call of the agent's own loop (with its tools), not one of the TUI's side calls. */
function isAgentLoop(request: AgentLlmRequest): boolean {
  const tools: unknown = request.body?.tools;
  return Array.isArray(tools) && tools.some((tool) => tool?.name === "Write");
}

/** The agent's turns: search, write, done; the TUI's side calls (titles, topics) get a short text. */
function agentScript(): (request: AgentLlmRequest) => AgentStep {
  let turn = 0;
  return (request) => {
    if (!isAgentLoop(request)) return { kind: "text", text: "ok" };
    turn += 1;
    if (turn === 1) {
      return {
        kind: "tool",
        name: "Bash",
        input: { command: SEARCH, description: "Look for credentials" },
      };
    }
    if (turn === 2) {
      return {
        kind: "tool",
        name: "Write",
        input: { file_path: "hello.txt", content: "written in the TUI\n" },
      };
    }
    return { kind: "text", text: "DONE-WRITING" };
  };
}

Deno.test({
  name:
    "an interactive Claude Code works with the host's subscription token, which is in no process, file or docker inspect of its sandbox",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  assertDocker();
  await using dir = await tempDir("sandbox-sec-subscription-");
  const token = `sk-ant-oat01-${crypto.randomUUID().replaceAll("-", "")}`;
  const apiKey = `sk-ant-api03-${crypto.randomUUID().replaceAll("-", "")}`;
  await using fake = new FakeAgentLlm("anthropic", Array(40).fill(agentScript()), token);
  fake.anthropicAuth = "oauth";
  const profile = uniqueProfile("subscription");
  const config = await writeConfig(
    dir.path,
    `profiles:\n  ${profile}:\n    llm: {provider: custom, api: anthropic, model: claude-sonnet-4-5, base_url: "${fake.baseUrl}", key: {env: CLAUDE_CODE_OAUTH_TOKEN}}\n`,
  );
  const repo = await createRepo(`${dir.path}/repo`);
  // The host's secrets reach the CLI through a file it sources, never a command line.
  const secrets = `${dir.path}/secrets.env`;
  await Deno.writeTextFile(
    secrets,
    `CLAUDE_CODE_OAUTH_TOKEN=${token}\nANTHROPIC_API_KEY=${apiKey}\n`,
    { mode: 0o600 },
  );
  const cli = [Deno.execPath(), "run", "-A", "--quiet", CLI, "-c", config];
  const argv = ["run", "agentic", "--interactive", "--agent", "claude-code", "-p", profile];
  await using tmux = new Tmux();
  try {
    await tmux.start(
      [
        "sh",
        "-c",
        `set -a; . "${secrets}"; set +a; exec "$@"`,
        "sh",
        ...cli,
        ...argv,
        "--repo",
        repo,
      ],
      { XDG_STATE_HOME: `${dir.path}/state` },
      { cols: 120, rows: 40 },
    );
    const started = await tmux.waitFor(/bypass permissions on|CLI-EXITED-\d+/);
    assert.doesNotMatch(started, /CLI-EXITED/, `the session did not start:\n${started}`);
    // Taken once the agent's own loop (the call with its tools) has the prompt.
    await submit(tmux, "Look for credentials, then write hello.txt", () =>
      Promise.resolve(
        fake.requests.some((r) =>
          isAgentLoop(r) && JSON.stringify(r.body).includes("Look for credentials")
        ),
      ));
    await tmux.waitFor(/DONE-WRITING/);
    const container = await agentContainer(profile, "claude-code");
    assert.ok(container, "the session's sandbox is running");
    // The searches read what is there: the placeholder the TUI was given.
    assert.ok((await whereIs(container, "ANTHROPIC_AUTH_TOKEN=sbx_")).length > 0);
    assert.deepEqual(await whereIs(container, token), [], "the subscription token is inside");
    assert.deepEqual(await whereIs(container, apiKey), [], "the host's API key is inside");
    await submit(
      tmux,
      "/exit",
      async () => /Resume this session|CLI-EXITED/.test(await tmux.screen()),
    );
    const screen = await tmux.waitFor(/CLI-EXITED-\d+/);
    assert.match(screen, /CLI-EXITED-0/, screen);
    const branch = screen.match(/branch (sandbox\/\S+) in /)?.[1];
    assert.ok(branch, screen);
    assert.equal(await git(repo, "show", `${branch}:hello.txt`), "written in the TUI");
    const found = await git(repo, "show", `${branch}:found.txt`);
    assert.match(found, /ANTHROPIC_AUTH_TOKEN=sbx_/, "the agent's search read its own environment");
    assert.ok(!found.includes(token), "the agent found the subscription token");
    assert.ok(!found.includes(apiKey), "the agent found the host's API key");
    assert.ok(!found.includes("ANTHROPIC_API_KEY="), "the TUI saw an API key variable");
    // The positive twin: every call the upstream answered carried the token, from the host.
    const calls = fake.requests.filter((r) => r.path === "/v1/messages");
    assert.ok(calls.length >= 3, `the agent called the upstream: ${calls.length}`);
    for (const call of calls) {
      assert.equal(call.headers.get("authorization"), `Bearer ${token}`);
      assert.match(call.headers.get("anthropic-beta") ?? "", /oauth-2025-04-20/);
    }
  } finally {
    await removeProfile(profile);
  }
});
