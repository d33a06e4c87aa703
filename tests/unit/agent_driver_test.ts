/**
 * `ContainerDriver` running an agent CLI instead of the worker, against an in-memory provider:
 * the prompt reaches the agent on stdin only, the agent's private files are written 0600 and
 * removed whatever happens, its events come out as messages, and an agent that dies without a
 * result is a `worker_failed` that names it.
 */
import assert from "node:assert/strict";
import { agentCli } from "../../lib/agents/agent_cli.ts";
import { ContainerDriver } from "../../lib/run/container_driver.ts";
import { SandboxError } from "../../lib/errors.ts";
import type {
  ExecBytes,
  ExecOptions,
  ExecResult,
  ExecStream,
  ExecStreamOutcome,
  SandboxProvider,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
} from "../../lib/sandbox/provider.ts";

interface StreamCall {
  argv: readonly string[];
  options: ExecOptions;
}

/** One scripted `execStream` (the agent's stdout), every other call recorded. */
class FakeProvider implements SandboxProvider {
  readonly streams: StreamCall[] = [];
  readonly execs: (readonly string[])[] = [];
  readonly writes: { path: string; data: string; mode?: number }[] = [];
  /** Files that exist: written and not yet removed. */
  readonly files = new Set<string>();

  constructor(readonly lines: string[], readonly outcome: Partial<ExecStreamOutcome> = {}) {}

  execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
    this.streams.push({ argv, options });
    const lines = this.lines;
    const outcome = Promise.resolve({
      exitCode: 0,
      durationMs: 1,
      timedOut: false,
      oomKilled: false,
      stderrTail: "",
      ...this.outcome,
    });
    return {
      outcome,
      async *[Symbol.asyncIterator]() {
        yield* lines;
      },
    };
  }

  exec(argv: readonly string[]): Promise<ExecResult> {
    this.execs.push(argv);
    if (argv[0] === "rm") {
      for (const path of argv.slice(argv.indexOf("--") + 1)) {
        for (const file of [...this.files]) {
          if (file === path || file.startsWith(`${path}/`)) this.files.delete(file);
        }
      }
    }
    return Promise.resolve({
      exitCode: 0,
      stdout: "",
      stderr: "",
      durationMs: 1,
      timedOut: false,
      oomKilled: false,
    });
  }

  writeFile(
    path: string,
    data: Uint8Array | string,
    options: { mode?: number } = {},
  ): Promise<void> {
    this.writes.push({ path, data: String(data), mode: options.mode });
    this.files.add(path);
    return Promise.resolve();
  }

  ensureRunning(): Promise<SandboxStatus> {
    return this.status();
  }
  readFile(): Promise<Uint8Array> {
    return Promise.reject(new Error("not used"));
  }
  execBytes(): ExecBytes {
    throw new Error("not used");
  }
  copyIn(): Promise<void> {
    return Promise.reject(new Error("not used"));
  }
  copyOut(): Promise<void> {
    return Promise.reject(new Error("not used"));
  }
  stats(): Promise<SandboxStats> {
    return Promise.reject(new Error("not used"));
  }
  status(): Promise<SandboxStatus> {
    return Promise.resolve({
      profile: "p",
      name: "sandbox-p",
      id: "x",
      image: "i",
      state: "running",
      health: "healthy",
      createdAt: "",
      startedAt: "",
      stoppedAt: null,
      workspacePath: "/workspace",
      current: true,
      kind: "shared",
      repo: null,
    });
  }
  stop(): Promise<SandboxStatus> {
    return this.status();
  }
  start(): Promise<SandboxStatus> {
    return this.status();
  }
  healthCheck(): Promise<boolean> {
    return Promise.resolve(true);
  }
  teardown(): Promise<TeardownReport> {
    return Promise.resolve({ containers: [], networks: [], volumes: [] });
  }
}

const TOKEN = "sbx_token-for-driver-test";
const ENV = {
  SANDBOX_LLM_TOKEN: TOKEN,
  SANDBOX_LLM_MODEL: "gpt-5.5",
  OPENAI_BASE_URL: "http://172.30.0.1:41000/proxy/v1",
  OPENAI_API_KEY: TOKEN,
  ANTHROPIC_BASE_URL: "http://172.30.0.1:41000/proxy",
  ANTHROPIC_API_KEY: TOKEN,
};
const PROMPT = "Write greet.sh, then run it. (secret plan: 42)";

const CODEX_LINES = [
  { type: "thread.started", thread_id: "t-1" },
  { type: "turn.started" },
  {
    type: "item.started",
    item: {
      id: "item_0",
      type: "command_execution",
      command: "sh greet.sh",
      aggregated_output: "",
      exit_code: null,
      status: "in_progress",
    },
  },
  {
    type: "item.completed",
    item: {
      id: "item_0",
      type: "command_execution",
      command: "sh greet.sh",
      aggregated_output: "hello\n",
      exit_code: 0,
      status: "completed",
    },
  },
  { type: "future.event", x: 1 },
  { type: "item.completed", item: { id: "item_1", type: "agent_message", text: "Done." } },
  { type: "turn.completed", usage: { input_tokens: 10, cached_input_tokens: 2, output_tokens: 3 } },
].map((e) => JSON.stringify(e));

Deno.test("executeAgentic() with an agent CLI: prompt on stdin only, files 0600 and removed, events translated, usage kept", async () => {
  const provider = new FakeProvider(CODEX_LINES);
  const seen: { line: string; known: boolean }[] = [];
  const driver = new ContainerDriver({
    provider,
    env: ENV,
    agent: agentCli("codex"),
    onAgentEvent: (line, known) => void seen.push({ line, known }),
  });
  const messages = await Array.fromAsync(
    driver.executeAgentic(PROMPT, {
      cwd: "/workspace/runs/run-7",
      runId: "run-7",
      instructions: "Be brief.",
    }),
  );
  assert.deepEqual(messages.map((m) => m.type), ["tool_call", "tool_result", "thinking", "result"]);
  assert.equal(messages.at(-1)!.content, "Done.");
  assert.equal(driver.getUsage()?.input_tokens, 10, "usage is kept aside, as for the worker");

  const [call] = provider.streams;
  assert.deepEqual(call.argv.slice(0, 5), [
    "sh",
    "-c",
    'mkdir -p -- "$1" && cd -- "$1" && shift && exec "$@"',
    "sandbox-agent",
    "/workspace/runs/run-7",
  ]);
  assert.equal(call.argv[5], "/opt/sandbox/agents/codex/bin/codex");
  assert.equal(call.options.stdin, PROMPT, "the prompt goes in on stdin");
  assert.ok(
    !call.argv.some((a) => a.includes("secret plan") || a.includes(TOKEN)),
    "neither prompt nor token on argv",
  );
  assert.equal(call.options.env?.CODEX_HOME, "/home/sandbox/.codex");
  assert.equal(
    call.options.env?.SANDBOX_LLM_TOKEN,
    TOKEN,
    "the session's variables reach the agent",
  );

  assert.ok(
    !provider.writes.some((w) => w.data.includes("secret plan")),
    "no prompt file for an agent CLI",
  );
  for (const write of provider.writes) assert.equal(write.mode, 0o600, `${write.path} is private`);
  assert.ok(
    provider.writes.some((w) =>
      w.path === "/home/sandbox/.codex/sandbox-run-7.config.toml" &&
      w.data.includes('developer_instructions = "Be brief."')
    ),
  );
  assert.deepEqual([...provider.files], [], "every file written for the run is gone");
  assert.deepEqual(seen.filter((s) => !s.known).map((s) => JSON.parse(s.line).type), [
    "future.event",
  ]);
  assert.equal(seen.length, CODEX_LINES.length);
});

Deno.test("executeAgentic() with an agent CLI that dies without a result fails naming the agent, and still cleans up", async () => {
  const provider = new FakeProvider(CODEX_LINES.slice(0, 4), {
    exitCode: 101,
    stderrTail: "thread 'main' panicked",
  });
  const driver = new ContainerDriver({ provider, env: ENV, agent: agentCli("codex") });
  await assert.rejects(
    Array.fromAsync(driver.executeAgentic(PROMPT, { cwd: "/w", runId: "run-8" })),
    (error: unknown) =>
      error instanceof SandboxError && error.code === "worker_failed" &&
      error.message === "codex did not emit a result message: it exited with code 101" &&
      error.detail === "thread 'main' panicked",
  );
  assert.deepEqual([...provider.files], []);
});

Deno.test("executeAgentic() with Claude Code passes instructions as a 0600 file it names, never inline, and reports standard tool names", async () => {
  const lines = [
    { type: "system", subtype: "init", session_id: "s", model: "claude-sonnet-4-5" },
    {
      type: "assistant",
      message: {
        role: "assistant",
        content: [{ type: "tool_use", id: "t1", name: "Bash", input: { command: "ls" } }],
      },
    },
    {
      type: "user",
      message: {
        role: "user",
        content: [{ type: "tool_result", tool_use_id: "t1", content: "a\nb" }],
      },
    },
    {
      type: "result",
      subtype: "success",
      is_error: false,
      result: "ok",
      num_turns: 1,
      total_cost_usd: 0.01,
      usage: { input_tokens: 1, output_tokens: 1 },
    },
  ].map((e) => JSON.stringify(e));
  const provider = new FakeProvider(lines);
  const driver = new ContainerDriver({
    provider,
    env: ENV,
    agent: agentCli("claude-code"),
    model: "claude-sonnet-4-5",
  });
  const messages = await Array.fromAsync(
    driver.executeAgentic(PROMPT, { cwd: "/w", runId: "run-9", instructions: "Use tabs." }),
  );
  assert.deepEqual(messages.map((m) => m.type), ["tool_call", "tool_result", "result"]);
  assert.deepEqual(messages.slice(0, 2).map((m) => m.tool_name), [
    "run_shell_command",
    "run_shell_command",
  ], "Claude Code's names as the seeds' drivers report them");
  assert.equal(driver.getUsage()?.cost_usd, 0.01);
  const argv = provider.streams[0].argv;
  const file = argv[argv.indexOf("--append-system-prompt-file") + 1];
  assert.equal(file, "/tmp/sandbox-prompts/run-9/instructions.txt");
  assert.deepEqual(provider.writes, [{ path: file, data: "Use tabs.", mode: 0o600 }]);
  assert.ok(!argv.includes("Use tabs."));
  assert.deepEqual([...provider.files], []);
});
