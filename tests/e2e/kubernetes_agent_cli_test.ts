/**
 * Agent CLIs in mode kubernetes: `sandbox run agentic --agent claude-code` (and Codex by
 * `llm.agent`) with `--repo`, through the real CLI, in a pod of the tests' API server
 * (tests/_kube_api.ts, pods as real Docker containers) from the agent's image layer; the agent
 * talks to a scripted fake LLM on 127.0.0.1 only through the relay on the pod's exec stream and the
 * host's credential proxy. While the agent waits for its first answer the test looks for the key in
 * the pod (every process's environment and command line, the files the sandbox user can read),
 * in every pod spec and every exec the API server received, and finds none; the branch comes back.
 */
import { createRepo, git } from "../_git.ts";
import assert from "node:assert/strict";
import { RunFixture } from "../_run_fixture.ts";
import { type AgentStep, FakeAgentLlm } from "../_fake_agent_llm.ts";
import { assertDocker, dockerTest, explain, tempDir, writeConfig } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";
import { run } from "../../lib/process.ts";
import { agentImageTagFor } from "../../lib/agents/agent_image.ts";
import { SANDBOX_CONTAINER } from "../../lib/sandbox/kubernetes/pod_spec.ts";

console.error("e2e: kubernetes agent CLI tests starting");

const KEY_ENV = "SANDBOX_KUBE_AGENT_KEY";
const SCRIPT_BODY = "echo hello from the agent\n";

/** `sh -c SCRIPT` in the pod's sandbox container as the sandbox user, `needle` on stdin. */
async function inPod(container: string, script: string, needle?: string): Promise<string> {
  const result = await run(
    ["docker", "exec", ...(needle ? ["--interactive"] : []), "--user", "10001:10001", container]
      .concat("sh", "-c", script),
    { stdin: needle },
  );
  assert.equal(result.exitCode, 0, `in ${container}: ${script}\n${result.stderr}`);
  return result.stdout;
}

interface Scenario {
  agent: "claude-code" | "codex";
  api: "anthropic" | "responses";
  llmYaml: string;
  flags: string[];
  script: AgentStep[];
  tokenEnv: string;
}

async function scenario(s: Scenario): Promise<void> {
  assertDocker();
  const image = await ensureSandboxImage();
  await using kube = new KubeApiServer();
  await using dir = await tempDir(`sandbox-kube-${s.agent}-`);
  const key = `sk-kube-${crypto.randomUUID().replaceAll("-", "")}`;
  await using fake = new FakeAgentLlm(s.api, s.script, key, "fake-model");
  await using fixture = await RunFixture.make({
    prefix: `e2e-kube-${s.agent}`,
    llmUrl: fake.baseUrl,
    keyEnv: KEY_ENV,
    prompt: "Write greet.sh, then run it.\n",
  });
  fixture.env[KEY_ENV] = key;
  fixture.config = await writeConfig(
    fixture.dir.path,
    `profiles:\n  ${fixture.profile}:\n` +
      `    llm: {${s.llmYaml}, base_url: "${fake.baseUrl}", key: {env: ${KEY_ENV}}}\n` +
      `    sandbox: {mode: kubernetes, pool: 0, kubernetes: {pool: own}}\n`,
  );
  await kube.writeKubeconfig(`${fixture.dir.path}/kubeconfig`);
  fixture.env.KUBECONFIG = `${fixture.dir.path}/kubeconfig`;
  const repo = `${dir.path}/repo`;
  await createRepo(repo);

  const held = fake.hold();
  const running = fixture.cli(
    ["run", "agentic", "-p", fixture.profile, ...s.flags, "--prompt-file", fixture.promptFile]
      .concat("--repo", repo, "--format", "ndjson"),
  );
  const reached = await Promise.race([held.reached.then(() => true), running.then(() => false)]);
  if (!reached) assert.fail(`the agent never called the LLM\n${explain(await running)}`);
  console.error(`marker: ${s.agent} in a pod called the LLM`);
  try {
    const [pod] = [...kube.pods.keys()];
    const container = kube.containerOf(pod, SANDBOX_CONTAINER);
    const environ = await inPod(
      container,
      "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; echo; tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null; true",
    );
    assert.ok(environ.includes(`${s.tokenEnv}=sbx_`), "the agent's environment was read");
    assert.ok(!environ.includes(key), "the key is in a process in the pod");
    const files = await inPod(
      container,
      "grep -rlF -f /dev/stdin -- /home/sandbox /tmp /workspace /opt 2>/dev/null; true",
      key,
    );
    assert.equal(files.trim(), "", "the key is in a file in the pod");
  } finally {
    held.release();
  }
  const result = await running;
  const context = explain(result);
  assert.equal(result.exitCode, 0, context);
  const lines = result.stdout.trim().split("\n").map((line) => JSON.parse(line));
  const ran = lines.find((m) =>
    m.type === "tool_result" && /hello from the agent/.test(m.tool_output)
  );
  assert.ok(ran, `the command ran in the pod\n${context}`);
  assert.equal(lines.at(-1).type, "usage", context);

  const id = result.stderr.match(/^sandbox: run (\S+) \(/m)?.[1];
  assert.ok(id, context);
  assert.equal(await git(repo, "show", `sandbox/${id}:greet.sh`), SCRIPT_BODY.trimEnd(), context);

  const agentImage = await agentImageTagFor(image, s.agent);
  assert.deepEqual(
    kube.created.map((p) => p.spec!.containers[0].image),
    [agentImage],
    "one pod, from the agent's image layer",
  );
  assert.ok(!JSON.stringify(kube.created).includes(key), "the key is in a pod spec");
  assert.ok(!JSON.stringify(kube.execs).includes(key), "the key is in an exec's argv");
  assert.ok(fake.served >= s.script.length, "every scripted answer was used");
  assert.equal(kube.pods.size, 0, "the run's pod is gone");
}

Deno.test({
  name:
    "Claude Code runs in a pod: it writes and runs a script in the repository through the relay and the credential proxy; the key is in no pod process, file, spec or exec; the branch comes back",
  ...dockerTest(),
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
        { kind: "tool", name: "Bash", input: { command: "sh greet.sh", description: "Run it" } },
        { kind: "text", text: "Done." },
      ],
      tokenEnv: "ANTHROPIC_API_KEY",
    }),
});

Deno.test({
  name:
    "Codex runs in a pod (llm.agent: codex): it writes and runs a script in the repository through the relay and the credential proxy; the key stays out; the branch comes back",
  ...dockerTest(),
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
        { kind: "tool", name: "exec_command", input: { cmd: "sh greet.sh" } },
        { kind: "text", text: "Done." },
      ],
      tokenEnv: "SANDBOX_LLM_TOKEN",
    }),
});
