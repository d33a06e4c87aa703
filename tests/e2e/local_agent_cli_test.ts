/**
 * Agent CLIs in sandbox mode local: `sandbox run agentic --agent claude-code` (and Codex by
 * `llm.agent`) with `--repo`, through the real CLI, in a bubblewrap sandbox with no Docker, from
 * the pinned package unpacked on the host (lib/agents/host_agent.ts) and bound read-only at
 * /opt/sandbox/agents/<agent>. The agent talks to a scripted fake LLM on 127.0.0.1 only through
 * the relay and the host's credential proxy. While the agent waits for its first answer the test
 * enters the agent's namespaces as the sandbox user and looks for the key in every process's
 * environment and command line and in every file it can read, and finds none, while the fake's
 * requests carried it. The agent then tries to change its own program (refused: read-only) and
 * writes and runs a script in /workspace (its twin); the branch comes back with the script.
 */
import { createRepo, git } from "../_git.ts";
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { type AgentStep, FakeAgentLlm } from "../_fake_agent_llm.ts";
import { explain, writeConfig } from "../_helpers.ts";
import { assertLocal, localTest } from "../_local.ts";
import { run } from "../../lib/process.ts";
import { agentProgram } from "../../lib/agents/launch.ts";
import { hostAgentName, hostArchitecture } from "../../lib/agents/host_agent.ts";
import { cachedTarballName, fetchTarball } from "../../lib/agents/npm_tarball.ts";
import { AGENT_PACKAGES } from "../../lib/agents/packages.ts";
import { LOCAL_UID } from "../../lib/sandbox/local/bwrap.ts";

console.error("e2e: local agent CLI tests starting");

const KEY_ENV = "SANDBOX_LOCAL_AGENT_KEY";
const SCRIPT_BODY = "echo hello from the agent\n";
/** What the agent's command prints after its attempts on its own program. */
const ATTACK_DONE = "attack on the program done";

/** A shell command: change the agent's own program (each attempt must fail), then run greet.sh. */
function attackThenRun(program: string): string {
  return `for a in "chmod u+w ${program}" "truncate -s 0 ${program}" "rm -f ${program}"; do ` +
    `$a 2>&1 && echo "ALLOWED: $a"; done; echo x 2>&1 >> ${program} && echo "ALLOWED: append"; ` +
    `echo "${ATTACK_DONE}"; sh greet.sh`;
}

/**
 * The host pid of this run's agent: its program's process in the pid namespace of a holder of
 * `sandboxes` (a bwrap whose command line binds that sandbox's directories).
 */
async function agentPid(program: string, sandboxes: string): Promise<number> {
  const pids = Array.from(Deno.readDirSync("/proc")).filter((e) => /^\d+$/.test(e.name));
  const holders = new Set<string>();
  const hostNamespace = await Deno.readLink("/proc/self/ns/pid");
  for (const entry of pids) {
    const argv = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (argv.startsWith("bwrap") || argv.includes("/bwrap\0")) {
      if (!argv.includes(sandboxes)) continue;
      // The holder's outer bwrap is in this host's pid namespace: only its child's counts.
      const ns = await Deno.readLink(`/proc/${entry.name}/ns/pid`).catch(() => "");
      if (ns && ns !== hostNamespace) holders.add(ns);
    }
  }
  for (const entry of pids) {
    const argv = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (argv.split("\0")[0] !== program) continue;
    const ns = await Deno.readLink(`/proc/${entry.name}/ns/pid`).catch(() => "");
    if (holders.has(ns)) return Number(entry.name);
  }
  throw new Error(`no process of ${program} in a sandbox under ${sandboxes}`);
}

/** `sh -c SCRIPT` in the namespaces of process `pid`, as the sandbox user; `needle` on stdin. */
async function inside(pid: number, script: string, needle?: string): Promise<string> {
  const result = await run([
    "nsenter",
    `--target=${pid}`,
    "--user",
    "--mount",
    "--pid",
    "--net",
    "--ipc",
    "--uts",
    `--setuid=${LOCAL_UID}`,
    `--setgid=${LOCAL_UID}`,
    "--",
    "sh",
    "-c",
    script,
  ], { stdin: needle, clearEnv: true, env: { PATH: "/usr/bin:/bin" } });
  assert.equal(result.exitCode, 0, `in the sandbox: ${script}\n${result.stderr}`);
  return result.stdout;
}

/**
 * A cache directory of the run's own (`XDG_CACHE_HOME`), holding only the agent's pinned tarball,
 * linked (else copied) from this user's npm cache (fetched there first when missing, as the agent's
 * image layer is): the run unpacks it there, and what it does to its files stays in the test's
 * directory.
 */
async function ownCache(dir: string, agent: "claude-code" | "codex"): Promise<string> {
  const tarball = AGENT_PACKAGES[agent].tarballs[hostArchitecture()!];
  const cached = await fetchTarball(tarball);
  const name = cachedTarballName(tarball);
  await Deno.mkdir(`${dir}/sandbox/npm`, { recursive: true });
  await Deno.link(cached, `${dir}/sandbox/npm/${name}`).catch(() =>
    Deno.copyFile(cached, `${dir}/sandbox/npm/${name}`)
  );
  return dir;
}

interface Scenario {
  agent: "claude-code" | "codex";
  api: "anthropic" | "responses";
  llmYaml: string;
  flags: string[];
  script: AgentStep[];
  tokenEnv: string;
  /** The request header that carries the key upstream. */
  keyHeader: [string, (key: string) => string];
}

async function scenario(s: Scenario): Promise<void> {
  assertLocal();
  const key = `sk-local-${crypto.randomUUID().replaceAll("-", "")}`;
  await using fake = new FakeAgentLlm(s.api, s.script, key, "fake-model");
  await using fixture = await RunFixture.make({
    prefix: `e2e-local-${s.agent}`,
    llmUrl: fake.baseUrl,
    keyEnv: KEY_ENV,
    prompt: "Write greet.sh, then run it.\n",
  });
  fixture.env[KEY_ENV] = key;
  const cache = await ownCache(`${fixture.dir.path}/cache`, s.agent);
  fixture.env.XDG_CACHE_HOME = cache;
  // Deno's own cache stays the user's (it follows XDG_CACHE_HOME): bundling the worker needs its
  // npm packages, which a fresh cache would fetch from the registry.
  fixture.env.DENO_DIR = Deno.env.get("DENO_DIR") ||
    `${Deno.env.get("XDG_CACHE_HOME") || `${Deno.env.get("HOME")}/.cache`}/deno`;
  // The unpacked agent is read-only: made writable again so that the fixture's removal takes it.
  await using _unlock = {
    [Symbol.asyncDispose]: async () => void await run(["chmod", "-R", "u+w", "--", cache]),
  };
  fixture.config = await writeConfig(
    fixture.dir.path,
    `profiles:\n  ${fixture.profile}:\n` +
      `    llm: {${s.llmYaml}, base_url: "${fake.baseUrl}", key: {env: ${KEY_ENV}}}\n` +
      `    sandbox: {mode: local}\n`,
  );
  const repo = `${fixture.dir.path}/repo`;
  await createRepo(repo);
  const program = agentProgram(s.agent);

  const held = fake.hold();
  const running = fixture.cli(
    ["run", "agentic", "-p", fixture.profile, ...s.flags, "--prompt-file", fixture.promptFile]
      .concat("--repo", repo, "--format", "ndjson"),
  );
  const reached = await Promise.race([held.reached.then(() => true), running.then(() => false)]);
  if (!reached) assert.fail(`the agent never called the LLM\n${explain(await running)}`);
  console.error(`marker: ${s.agent} in a local sandbox called the LLM`);
  try {
    const pid = await agentPid(program, `${fixture.stateDir}/sandbox/local/`);
    const seen = await inside(
      pid,
      "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; echo; tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null; true",
    );
    assert.ok(seen.includes(`${s.tokenEnv}=sbx_`), "the agent's environment was read");
    assert.ok(seen.includes(program), "the agent's command line was read");
    assert.ok(!seen.includes(key), "the key is in a process in the sandbox");
    const files = await inside(
      pid,
      "grep -rlF -f /dev/stdin -- /home/sandbox /tmp /workspace /opt /etc /run /cache 2>/dev/null; true",
      key,
    );
    assert.equal(files.trim(), "", "the key is in a file in the sandbox");
  } finally {
    held.release();
  }
  const [header, value] = s.keyHeader;
  assert.equal(
    fake.requests[0]?.headers.get(header),
    value(key),
    "the proxy sent the key upstream",
  );

  const result = await running;
  const context = explain(result);
  assert.equal(result.exitCode, 0, context);
  const lines = result.stdout.trim().split("\n").map((line) => JSON.parse(line));
  const ran = lines.find((m) =>
    m.type === "tool_result" && String(m.tool_output).includes(ATTACK_DONE)
  );
  assert.ok(ran, `the agent's command ran\n${context}`);
  assert.doesNotMatch(ran.tool_output, /ALLOWED/, "the agent changed its own program");
  assert.match(ran.tool_output, /Read-only file system/, context);
  assert.match(ran.tool_output, /hello from the agent/, "the script in /workspace ran");
  assert.equal(lines.at(-1).type, "usage", context);
  assert.match(result.stderr, /Unpacking \S+ into /, "the first unpack is said on stderr");

  const id = result.stderr.match(/^sandbox: run (\S+) \(/m)?.[1];
  assert.ok(id, context);
  assert.equal(await git(repo, "show", `sandbox/${id}:greet.sh`), SCRIPT_BODY.trimEnd(), context);
  assert.ok(fake.served >= s.script.length, "every scripted answer was used");

  const host = `${cache}/sandbox/agents/${await hostAgentName(
    AGENT_PACKAGES[s.agent],
    hostArchitecture()!,
  )}`;
  const file = await Deno.stat(`${host}/${AGENT_PACKAGES[s.agent].entrypoint}`);
  assert.equal((file.mode ?? 0) & 0o222, 0, "the host's copy of the program stays read-only");
  assert.ok(file.size > 1_000_000, "the host's copy of the program is whole");
  const left = await Array.fromAsync(Deno.readDir(`${fixture.stateDir}/sandbox/local`));
  assert.deepEqual(left.map((e) => e.name), [], "the sandbox's directory is gone");
}

Deno.test({
  name:
    "Claude Code runs in mode local from its package cached on the host: the key is in no process or file of the sandbox, its program is read-only to it, its script in /workspace runs and the branch comes back",
  ...localTest(),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: () =>
    scenario({
      agent: "claude-code",
      api: "anthropic",
      llmYaml: "provider: custom, api: anthropic, model: claude-sonnet-4-5",
      flags: ["--agent", "claude-code"],
      script: [
        { kind: "tool", name: "Write", input: { file_path: "greet.sh", content: SCRIPT_BODY } },
        {
          kind: "tool",
          name: "Bash",
          input: { command: attackThenRun(agentProgram("claude-code")), description: "Run it" },
        },
        { kind: "text", text: "Done." },
      ],
      tokenEnv: "ANTHROPIC_API_KEY",
      keyHeader: ["x-api-key", (key) => key],
    }),
});

Deno.test({
  name:
    "Codex runs in mode local (llm.agent: codex) from its package cached on the host: the key stays out, its program is read-only to it, the branch comes back",
  ...localTest(),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: () =>
    scenario({
      agent: "codex",
      api: "responses",
      llmYaml: "provider: custom, api: openai, model: gpt-5.5, agent: codex",
      flags: [],
      script: [
        {
          kind: "tool",
          name: "exec_command",
          input: { cmd: `printf '${SCRIPT_BODY.replace("\n", "\\n")}' > greet.sh` },
        },
        {
          kind: "tool",
          name: "exec_command",
          input: { cmd: attackThenRun(agentProgram("codex")) },
        },
        { kind: "text", text: "Done." },
      ],
      tokenEnv: "SANDBOX_LLM_TOKEN",
      keyHeader: ["authorization", (key) => `Bearer ${key}`],
    }),
});
