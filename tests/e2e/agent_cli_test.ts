/**
 * `sandbox run agentic --agent claude-code|codex --repo PATH` as a user runs it: the real CLI, a
 * real container from the agent's image layer (built from the pinned npm package on first use),
 * the real agent CLI inside, and a scripted fake LLM on 127.0.0.1 streaming hand-written SSE of
 * the API each agent speaks, behind the credential proxy.
 *
 * Each agent writes a file and runs a command in a repository. The first run records (`--record`)
 * with the key present on the host; while the agent is mid-run the test looks for the key inside
 * the sandbox (every process's environment and command line, the agent's config and logs, every
 * file the sandbox user can read, `docker inspect`) and finds none, and the access log shows that
 * nothing but the credential proxy was contacted. The second run replays the recording with no key
 * and no fake: the same work, offline. Both streams validate against the seeds' schema, and both
 * branches come back.
 */
import { createRepo, git } from "../_git.ts";
import assert from "node:assert/strict";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";
import { type AgentStep, FakeAgentLlm } from "../_fake_agent_llm.ts";
import { MESSAGE_KEYS, USAGE_KEYS } from "../_seed_schema.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  runCli,
  tempDir,
  writeConfig,
} from "../_helpers.ts";
import { run, type RunResult } from "../../lib/process.ts";
import { DEFAULT_BASE_IMAGE } from "../../lib/config.ts";
import { agentImageTagFor } from "../../lib/agents/agent_image.ts";

console.error("e2e: agent CLI tests starting");

const KEY_ENV = "SANDBOX_E2E_AGENT_KEY";
const SCRIPT_BODY = "echo hello from the agent\n";

// deno-lint-ignore no-explicit-any
type Wire = Record<string, any>;

/** One stdout line against the seeds' AgenticMessage: every key, nothing else, the right types. */
function wireMessage(line: string, where: string): Wire {
  const message = JSON.parse(line) as Wire;
  assert.deepEqual(Object.keys(message), [...MESSAGE_KEYS], `${where}: keys in wire order`);
  assert.ok(
    ["thinking", "tool_call", "tool_result", "result", "usage"].includes(message.type),
    `${where}: type`,
  );
  for (
    const key of ["content", "tool_name", "tool_output", "tool_call_id", "session_id", "model"]
  ) {
    assert.ok(message[key] === null || typeof message[key] === "string", `${where}: ${key}`);
  }
  assert.ok(
    message.tool_input === null ||
      (typeof message.tool_input === "object" && !Array.isArray(message.tool_input)),
    `${where}: tool_input`,
  );
  assert.equal(typeof message.is_error, "boolean", `${where}: is_error`);
  if (message.type !== "usage") {
    assert.equal(message.usage, null, `${where}: usage on a ${message.type} line`);
  } else {
    assert.deepEqual(Object.keys(message.usage), [...USAGE_KEYS], `${where}: usage keys`);
    for (
      const key of [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_creation_tokens",
        "num_turns",
      ]
    ) {
      const value = message.usage[key];
      assert.ok(
        value === null || (Number.isInteger(value) && value >= 0),
        `${where}: usage.${key} = ${value}`,
      );
    }
    for (const key of ["cost_usd", "duration_ms"]) {
      const value = message.usage[key];
      assert.ok(
        value === null || (typeof value === "number" && value >= 0),
        `${where}: usage.${key} = ${value}`,
      );
    }
  }
  return message;
}

/** The run's stdout, validated line by line, with the run contract: one result, usage last. */
function runMessages(result: RunResult): Wire[] {
  const context = explain(result);
  assert.equal(result.exitCode, 0, context);
  assert.ok(result.stdout.endsWith("\n"), context);
  const messages = result.stdout.slice(0, -1).split("\n").map((line, i) =>
    wireMessage(line, `line ${i + 1}\n${context}`)
  );
  assert.equal(
    messages.filter((m) => m.type === "result").length,
    1,
    `exactly one result\n${context}`,
  );
  assert.equal(messages.at(-1)!.type, "usage", `usage last\n${context}`);
  assert.equal(messages.at(-2)!.type, "result", `the result just before it\n${context}`);
  // Every result pairs with the call before it.
  const calls = new Map(
    messages.filter((m) => m.type === "tool_call").map((m) => [m.tool_call_id, m]),
  );
  for (const result of messages.filter((m) => m.type === "tool_result")) {
    assert.ok(
      calls.has(result.tool_call_id),
      `a tool_result without its call: ${JSON.stringify(result)}`,
    );
    assert.equal(result.tool_name, calls.get(result.tool_call_id)!.tool_name);
  }
  return messages;
}

function runIdFrom(stderr: string): string {
  const match = stderr.split("\n")[0].match(/^sandbox: run (\S+) \(/);
  assert.ok(match, `stderr names no run:\n${stderr}`);
  return match[1];
}

/** `sh -c SCRIPT` in the container as the sandbox user, `stdin` on its stdin: its stdout. */
async function inContainer(container: string, script: string, stdin?: string): Promise<string> {
  const result = await run([
    "docker",
    "exec",
    ...(stdin === undefined ? [] : ["--interactive"]),
    "--user",
    "10001:10001",
    container,
    "sh",
    "-c",
    script,
  ], { stdin });
  assert.equal(result.exitCode, 0, `in ${container}: ${script}\n${result.stderr}`);
  return result.stdout;
}

/**
 * Files under `dirs` in the container that contain `needle` (given on stdin, so that looking for
 * a secret never puts it on a command line).
 */
async function filesContaining(
  container: string,
  needle: string,
  dirs: string[],
): Promise<string[]> {
  const out = await inContainer(
    container,
    `grep -rlF -f /dev/stdin -- ${dirs.join(" ")} 2>/dev/null; true`,
    needle,
  );
  return out.split("\n").filter(Boolean);
}

/**
 * Look for `secret` everywhere in a live sandbox, with a twin search for something that is there
 * (so a search that reads nothing cannot pass): the agent processes' environment (where the
 * session token must be) and command lines, every file the sandbox user can read in the agent's
 * home (its config and logs), /tmp, /workspace and /opt, and `docker inspect`.
 */
async function assertSecretAbsent(
  container: string,
  secret: string,
  present: { env: string; homeFile: string },
): Promise<void> {
  const environ = await inContainer(
    container,
    "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; echo; tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null; true",
  );
  assert.ok(
    environ.includes(present.env),
    `the agent's environment was not read (no ${present.env})`,
  );
  assert.ok(
    !environ.includes(secret),
    "the key is in a process environment or command line in the sandbox",
  );
  const agentFiles = await filesContaining(container, present.homeFile, ["/home/sandbox"]);
  if (agentFiles.length === 0) {
    const listing = await inContainer(container, "find /home/sandbox -type f 2>/dev/null; true");
    assert.fail(
      `the search of the agent's home found not even ${present.homeFile}; it holds:\n${listing}`,
    );
  }
  assert.deepEqual(
    await filesContaining(container, secret, ["/home/sandbox", "/tmp", "/workspace", "/opt"]),
    [],
    "the key is in a file in the sandbox",
  );
  assert.ok(
    !(await docker("container", "inspect", container)).includes(secret),
    "the key is in docker inspect",
  );
}

interface Scenario {
  agent: "claude-code" | "codex";
  api: "anthropic" | "responses";
  /** The profile's llm section, besides base_url and key. */
  llmYaml: string;
  /** CLI flags choosing the agent (empty when the profile does). */
  agentFlags: string[];
  script: AgentStep[];
  /** Tool names the wire reports for the write and the command. */
  tools: [string, string];
  /** The variable holding the token in the agent's environment. */
  tokenEnv: string;
  /** Text the agent writes into its own home (config, state) by the time it calls the LLM. */
  homeFile: string;
}

async function agentScenario(scenario: Scenario): Promise<void> {
  assertDocker();
  await using dir = await tempDir(`sandbox-e2e-${scenario.agent}-`);
  const fixtureKey = `sk-e2e-${crypto.randomUUID().replaceAll("-", "")}`;
  await using fake = new FakeAgentLlm(scenario.api, scenario.script, fixtureKey, "fake-model");
  await using fixture = await RunFixture.make({
    prefix: `e2e-${scenario.agent}`,
    llmUrl: fake.baseUrl,
    keyEnv: KEY_ENV,
    prompt: "Write greet.sh, then run it.\n",
  });
  fixture.env[KEY_ENV] = fixtureKey;
  fixture.config = await writeConfig(
    fixture.dir.path,
    `profiles:\n  ${fixture.profile}:\n    llm: {${scenario.llmYaml}, base_url: "${fake.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
  );
  const repo = await createRepo(`${dir.path}/repo`);
  const recording = `${dir.path}/recording.json`;
  // 1. Recorded run, with the key on the host; looked into while the agent waits for its first answer.
  const held = fake.hold();
  const running = fixture.cli([
    "run",
    "agentic",
    "-p",
    fixture.profile,
    ...scenario.agentFlags,
    "--prompt-file",
    fixture.promptFile,
    "--repo",
    repo,
    "--record",
    recording,
    "--format",
    "ndjson",
  ]);
  const reached = await Promise.race([held.reached.then(() => true), running.then(() => false)]);
  if (!reached) assert.fail(`the agent never called the LLM\n${explain(await running)}`);
  // The run's own container (from the agent's image), for this run alone.
  const container = await fixture.liveContainer();
  try {
    await assertSecretAbsent(container, fixtureKey, {
      env: `${scenario.tokenEnv}=sbx_`,
      homeFile: scenario.homeFile,
    });
  } finally {
    held.release();
  }
  const recorded = await running;
  const messages = runMessages(recorded);
  const id = runIdFrom(recorded.stderr);
  const context = explain(recorded);
  const toolCalls = messages.filter((m) => m.type === "tool_call");
  assert.deepEqual(toolCalls.map((m) => m.tool_name), scenario.tools, context);
  const ran = messages.find((m) =>
    m.type === "tool_result" && m.tool_call_id === toolCalls[1].tool_call_id
  )!;
  assert.match(
    ran.tool_output,
    /hello from the agent/,
    `the command ran in the sandbox\n${context}`,
  );
  assert.equal(ran.is_error, false, context);
  assert.equal(messages.at(-2)!.content, "Done: wrote greet.sh and ran it.", context);
  const usage = messages.at(-1)!.usage;
  assert.ok(
    usage.input_tokens >= 2 * 120 && usage.output_tokens >= 2 * 30,
    `usage counts the fake's tokens: ${JSON.stringify(usage)}`,
  );

  // The branch came back with the agent's file; the user's checkout did not move.
  assert.equal(await git(repo, "show", `sandbox/${id}:greet.sh`), SCRIPT_BODY.trimEnd(), context);
  assert.equal(await git(repo, "rev-parse", "--abbrev-ref", "HEAD"), "main");
  assert.equal(await git(repo, "status", "--porcelain"), "");

  // Nothing but the credential proxy was contacted, with the key attached by the host.
  const access = (await Deno.readTextFile(`${fixture.stateDir}/sandbox/access.ndjson`)).trim()
    .split("\n").map((l) => JSON.parse(l))
    .filter((e) => e.runId === id);
  assert.ok(
    access.length >= 3,
    `the access log has the run's LLM calls: ${JSON.stringify(access)}`,
  );
  assert.deepEqual(
    [...new Set(access.map((e) => `${e.kind} ${e.decision}`))],
    ["llm allow"],
    `only the credential proxy: ${JSON.stringify(access)}`,
  );
  const allowed = scenario.api === "anthropic"
    ? ["/v1/messages", "/v1/messages/count_tokens"]
    : ["/v1/responses"];
  for (const entry of access) {
    assert.ok(allowed.includes(entry.path), `an unexpected call: ${JSON.stringify(entry)}`);
  }
  for (const request of fake.requests) {
    assert.ok(allowed.includes(request.path), `the fake was asked for ${request.path}`);
  }
  assert.equal(fake.served, scenario.script.length, "every scripted answer was used");

  // After the run, its container is gone with whatever the agent wrote; its own events are in the run log.
  await assertRemoved(container);
  const agentEvents = await Deno.readTextFile(
    `${fixture.stateDir}/sandbox/runs/${id}/agent-events.ndjson`,
  );
  assert.ok(!agentEvents.includes(fixtureKey));
  assert.ok(
    agentEvents.split("\n").filter(Boolean).length >= messages.length - 2,
    "the agent's own events are kept in the run log",
  );

  // 2. The recording replayed: no key, no fake, a new branch with the same work.
  await fake[Symbol.asyncDispose]();
  const replayEnv = { ...fixture.env };
  delete replayEnv[KEY_ENV];
  assert.equal(
    Deno.env.get(KEY_ENV),
    undefined,
    "the test's own environment has no key to pass on",
  );
  const replayed = await runCli(
    [
      "run",
      "agentic",
      "-p",
      fixture.profile,
      ...scenario.agentFlags,
      "--prompt-file",
      fixture.promptFile,
      "--repo",
      repo,
      "--model",
      `replay:${recording}`,
      "--format",
      "ndjson",
    ],
    { config: fixture.config, env: replayEnv, timeoutMs: CLI_TIMEOUT_MS },
  );
  const replayMessages = runMessages(replayed);
  assert.deepEqual(
    replayMessages.filter((m) => m.type === "tool_call").map((m) => m.tool_name),
    scenario.tools,
    explain(replayed),
  );
  assert.equal(replayMessages.at(-2)!.content, "Done: wrote greet.sh and ran it.");
  const replayId = runIdFrom(replayed.stderr);
  assert.equal(
    await git(repo, "show", `sandbox/${replayId}:greet.sh`),
    SCRIPT_BODY.trimEnd(),
    explain(replayed),
  );

  // 3. `sandbox down` removes the agent's warm pool with the profile's own containers.
  const down = await fixture.cli(["down", "-p", fixture.profile, "--volumes", "--json"]);
  assert.equal(down.exitCode, 0, explain(down));
  const left = await run([
    "docker",
    "ps",
    "-aq",
    "--filter",
    `label=dev.sandbox.profile=${fixture.profile}`,
  ]);
  assert.equal(left.stdout.trim(), "", `containers of ${fixture.profile} are still there`);
}

/** `container` is removed (its removal runs behind the run: moments after it). */
async function assertRemoved(container: string): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if ((await run(["docker", "container", "inspect", container])).exitCode !== 0) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.fail(`${container} is still there after its run`);
}

Deno.test({
  name:
    "Claude Code in the sandbox writes a file and runs a command on a repository; the key stays out; a recording replays it offline",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: () =>
    agentScenario({
      agent: "claude-code",
      api: "anthropic",
      llmYaml: "provider: custom, api: anthropic, model: claude-sonnet-4-5",
      agentFlags: ["--agent", "claude-code"],
      script: [
        {
          kind: "tool",
          name: "Write",
          input: { file_path: "greet.sh", content: SCRIPT_BODY },
          text: "Writing the script.",
          reasoning: "A script, then run it.",
        },
        {
          kind: "tool",
          name: "Bash",
          input: { command: "sh greet.sh", description: "Run the script" },
        },
        { kind: "text", text: "Done: wrote greet.sh and ran it." },
      ],
      tools: ["write_file", "run_shell_command"],
      tokenEnv: "ANTHROPIC_API_KEY",
      homeFile: '"firstStartVersion"',
    }),
});

Deno.test({
  name:
    "Codex in the sandbox (llm.agent: codex) writes a file and runs a command on a repository; the key stays out; a recording replays it offline",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: () =>
    agentScenario({
      agent: "codex",
      api: "responses",
      llmYaml: "provider: custom, api: openai, model: gpt-5.5, agent: codex",
      agentFlags: [],
      script: [
        {
          kind: "tool",
          name: "exec_command",
          input: { cmd: `printf '${SCRIPT_BODY.replace("\n", "\\n")}' > greet.sh` },
          reasoning: "Write the script first.",
        },
        { kind: "tool", name: "exec_command", input: { cmd: "sh greet.sh" } },
        { kind: "text", text: "Done: wrote greet.sh and ran it." },
      ],
      tools: ["run_shell_command", "run_shell_command"],
      tokenEnv: "SANDBOX_LLM_TOKEN",
      homeFile: 'env_key = "SANDBOX_LLM_TOKEN"',
    }),
});

Deno.test({
  name:
    "Without its image layer and without the npm registry, an agent run fails with 125 and says how to build the layer elsewhere",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    assertDocker();
    // A base image under a name of its own (same content): its sandbox image and layer are new.
    const base = `sandbox-e2e-base:${crypto.randomUUID().slice(0, 8)}`;
    await docker("tag", DEFAULT_BASE_IMAGE, base);
    await using dir = await tempDir("sandbox-e2e-offline-");
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const deadRegistry = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
    listener.close();
    await using fixture = await RunFixture.make({
      prefix: "e2e-offline",
      llmUrl: "http://127.0.0.1:9/v1",
      keyEnv: KEY_ENV,
      prompt: "hi\n",
    });
    fixture.config = await writeConfig(
      fixture.dir.path,
      `profiles:\n  ${fixture.profile}:\n    llm: {provider: custom, api: anthropic, base_url: "http://127.0.0.1:9/v1", key: {env: ${KEY_ENV}}}\n    sandbox: {image: "${base}"}\n`,
    );
    let sandboxImage: string | undefined;
    try {
      const result = await fixture.cli(
        [
          "run",
          "agentic",
          "-p",
          fixture.profile,
          "--agent",
          "claude-code",
          "--prompt-file",
          fixture.promptFile,
          "--format",
          "ndjson",
        ],
        { npm_config_registry: deadRegistry, XDG_CACHE_HOME: `${dir.path}/cache` },
      );
      const context = explain(result);
      // The sandbox image this run built for the new base (removed below).
      sandboxImage = result.stderr.match(/Building sandbox image (sandbox-runtime:[0-9a-f]+) on /)
        ?.[1];
      assert.ok(sandboxImage, `the run built no sandbox image for ${base}\n${context}`);
      assert.equal(result.exitCode, 125, context);
      const layer = await agentImageTagFor(sandboxImage, "claude-code");
      // The run still ends as the protocol promises: one is_error result, then the usage.
      const messages = result.stdout.trim().split("\n").map((line, i) =>
        wireMessage(line, `line ${i + 1}\n${context}`)
      );
      assert.deepEqual(messages.map((m) => m.type), ["result", "usage"], context);
      assert.equal(messages[0].is_error, true, context);
      assert.ok(
        messages[0].content.startsWith(`Cannot build the missing claude-code image "${layer}"`),
        context,
      );
      assert.ok(
        result.stderr.includes(
          `Cannot build the missing claude-code image "${layer}": cannot download @anthropic-ai/claude-code-linux-x64@2.1.330 from ${deadRegistry}`,
        ),
        context,
      );
      assert.match(result.stderr, /sandbox image build --agent claude-code/, context);
      assert.ok(result.stderr.includes(`docker save ${layer}`), context);
      assert.equal(
        (await run(["docker", "image", "inspect", layer])).exitCode,
        1,
        "no half-built layer is left",
      );
    } finally {
      await run(["docker", "rmi", base]);
      if (sandboxImage) await run(["docker", "rmi", sandboxImage]);
    }
  },
});

Deno.test({
  name:
    "--timeout ends an agent CLI that is still waiting for its LLM: exit 124, and nothing of it is left running in the sandbox",
  ...dockerTest(),
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    assertDocker();
    const key = `sk-e2e-${crypto.randomUUID().replaceAll("-", "")}`;
    await using fake = new FakeAgentLlm("anthropic", [{ kind: "text", text: "too late" }], key);
    await using fixture = await RunFixture.make({
      prefix: "e2e-agent-timeout",
      llmUrl: fake.baseUrl,
      keyEnv: KEY_ENV,
      prompt: "Wait.\n",
    });
    fixture.env[KEY_ENV] = key;
    fixture.config = await writeConfig(
      fixture.dir.path,
      `profiles:\n  ${fixture.profile}:\n    llm: {provider: custom, api: anthropic, base_url: "${fake.baseUrl}", key: {env: ${KEY_ENV}}, agent: claude-code}\n`,
    );
    const held = fake.hold();
    const running = fixture.cli([
      "run",
      "agentic",
      "-p",
      fixture.profile,
      "--prompt-file",
      fixture.promptFile,
      "--timeout",
      "8s",
      "--format",
      "ndjson",
    ]);
    const reached = await Promise.race([held.reached.then(() => true), running.then(() => false)]);
    if (!reached) assert.fail(`the agent never called the LLM\n${explain(await running)}`);
    const container = await fixture.liveContainer();
    const program = "/opt/sandbox/agents/claude-code/claude";
    assert.ok(
      (await inContainer(container, "ps -eo args")).includes(program),
      "the agent runs while its call is held",
    );
    const result = await running;
    held.release();
    assert.equal(result.exitCode, 124, explain(result));
    // Nothing of it outlives the run: its container goes with it.
    await assertRemoved(container);
  },
});
