/**
 * The API key stays on the host when Codex's own TUI runs in a sandbox: `sandbox run agentic
 * --interactive --agent codex --repo` opens the real TUI (the pinned package, from its image
 * layer) in a real terminal (tmux), against a scripted fake OpenAI Responses upstream on 127.0.0.1
 * that accepts only the key, as `Authorization: Bearer`.
 *
 * A prompt typed in the pane makes the agent (the attacker here) run a command that searches its
 * sandbox for the key, every process's environment and command line and every file it can read,
 * writes what it found into the repository, and writes a file. Both come back on the branch: the
 * search found the placeholder it was given (the session token) and never the key; the test's own
 * search of every process, file and `docker inspect` of the live sandbox finds no key either. The
 * positive twin: the upstream received the key from the host's credential proxy on every call, so
 * the agent worked with it.
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

console.error("security: codex TUI key test starting");

const PROMPT = "Look for credentials, then write hello.txt";

const SEARCH_AND_WRITE = [
  "{ env; for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; tr '\\0' ' ' < $p/cmdline; echo; done;",
  "grep -rl sk-tui- /home /tmp /workspace /opt; } > found.txt 2>/dev/null;",
  "printf 'written in the TUI\\n' > hello.txt; echo SEARCHED",
].join(" ");

/** A call of the agent's own loop (with its tools), not a side call of the TUI's. */
function isAgentLoop(request: AgentLlmRequest): boolean {
  const tools: unknown = request.body?.tools;
  return Array.isArray(tools) && tools.some((tool) => tool?.name === "exec_command");
}

/** The agent's turns: search and write, then done; any side call gets a short text. */
function agentScript(): (request: AgentLlmRequest) => AgentStep {
  let turn = 0;
  return (request) => {
    if (!isAgentLoop(request)) return { kind: "text", text: "ok" };
    turn += 1;
    if (turn === 1) {
      return { kind: "tool", name: "exec_command", input: { cmd: SEARCH_AND_WRITE } };
    }
    return { kind: "text", text: "DONE-WRITING" };
  };
}

/**
 * Press `key` until the screen shows `next`: while the TUI still starts up, a key is dropped (the
 * screen stays as it was).
 */
async function answer(tmux: Tmux, key: string, next: RegExp): Promise<void> {
  while (true) {
    await tmux.send(key);
    for (let polls = 0; polls < 25; polls++) {
      if (next.test(await tmux.screen())) return;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
}

Deno.test({
  name:
    "an interactive Codex works with the host's API key, which is in no process, file or docker inspect of its sandbox",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  assertDocker();
  await using dir = await tempDir("sandbox-sec-codex-tui-");
  const apiKey = `sk-tui-${crypto.randomUUID().replaceAll("-", "")}`;
  await using fake = new FakeAgentLlm("responses", Array(40).fill(agentScript()), apiKey);
  const profile = uniqueProfile("codextui");
  // A model the pinned Codex's catalog does not have (as behind a gateway): it then offers no newer
  // model at start, and gives it its classic tools (exec_command).
  const config = await writeConfig(
    dir.path,
    `profiles:\n  ${profile}:\n    llm: {provider: custom, api: openai, model: fake-model, base_url: "${fake.baseUrl}", key: {env: OPENAI_API_KEY}}\n`,
  );
  const repo = await createRepo(`${dir.path}/repo`);
  // The host's key reaches the CLI through a file it sources, never a command line.
  const secrets = `${dir.path}/secrets.env`;
  await Deno.writeTextFile(secrets, `OPENAI_API_KEY=${apiKey}\n`, { mode: 0o600 });
  const cli = [Deno.execPath(), "run", "-A", "--quiet", CLI, "-c", config];
  const argv = ["run", "agentic", "--interactive", "--agent", "codex", "-p", profile];
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
    // Codex asks how to open a folder it is told is untrusted: restricted, its default.
    const asked = await tmux.waitFor(/Open restricted|CLI-EXITED-\d+/);
    assert.doesNotMatch(asked, /CLI-EXITED/, `the session did not start:\n${asked}`);
    await answer(tmux, "Enter", /Ask Codex to do anything/);
    await submit(
      tmux,
      PROMPT,
      () =>
        Promise.resolve(
          fake.requests.some((r) => isAgentLoop(r) && JSON.stringify(r.body).includes(PROMPT)),
        ),
      "›",
    );
    await tmux.waitFor(/DONE-WRITING/);
    const container = await agentContainer(profile, "codex");
    assert.ok(container, "the session's sandbox is running");
    // The searches read what is there: the placeholder the TUI was given.
    assert.ok((await whereIs(container, "SANDBOX_LLM_TOKEN=sbx_")).length > 0);
    assert.deepEqual(await whereIs(container, apiKey), [], "the host's API key is inside");
    await submit(tmux, "/quit", async () => /CLI-EXITED|bringing/.test(await tmux.screen()), "›");
    const screen = await tmux.waitFor(/CLI-EXITED-\d+/);
    assert.match(screen, /CLI-EXITED-0/, screen);
    const branch = screen.match(/branch (sandbox\/\S+) in /)?.[1];
    assert.ok(branch, screen);
    assert.equal(await git(repo, "show", `${branch}:hello.txt`), "written in the TUI");
    const found = await git(repo, "show", `${branch}:found.txt`);
    assert.match(found, /SANDBOX_LLM_TOKEN=sbx_/, "the agent's search read its own environment");
    assert.ok(!found.includes(apiKey), "the agent found the host's API key");
    // The positive twin: every call the upstream answered carried the key, from the host.
    const calls = fake.requests.filter((r) => r.path === "/v1/responses");
    assert.ok(calls.length >= 2, `the agent called the upstream: ${calls.length}`);
    for (const call of calls) assert.equal(call.headers.get("authorization"), `Bearer ${apiKey}`);
  } finally {
    await removeProfile(profile);
  }
});
