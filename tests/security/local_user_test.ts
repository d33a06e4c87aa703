/**
 * Sandbox mode local for an ordinary user (docs/local.md): a user this test creates (removed at the
 * end, whatever happens), with no access to any Docker socket, runs a replayed agentic run with
 * `--repo` on a repository of its own. The run succeeds and its branch comes back; the agent, in
 * the sandbox, cannot read a file of that user's home outside the checkout, which the user reads on
 * the host (twin); the user cannot connect to the Docker socket, which root can (twin). The same user
 * runs Claude Code and Codex from their pinned packages, unpacked in its own cache, against a fake
 * LLM on loopback: the branch comes back and the user's file stays out of the agent's reach.
 *
 * It needs root (to create the user): CI runs as root, so there it must run; on a developer
 * machine as another user it is skipped, like the other mode-local tests without bubblewrap.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { explain, IN_CI, ROOT, uniqueProfile } from "../_helpers.ts";
import { assertLocal, LOCAL_UNAVAILABLE } from "../_local.ts";
import { type AgentStep, FakeAgentLlm } from "../_fake_agent_llm.ts";
import { hostAgentName, hostArchitecture } from "../../lib/agents/host_agent.ts";
import { cachedTarballName, fetchTarball } from "../../lib/agents/npm_tarball.ts";
import { AGENT_PACKAGES } from "../../lib/agents/packages.ts";

const DOCKER_SOCKET = "/var/run/docker.sock";
/** Connect to a Unix socket: "connected", or the error (perl-base's Socket: any user has it). */
const CONNECT = 'use Socket; socket(my $s, PF_UNIX, SOCK_STREAM, 0) or die "socket: $!\\n"; ' +
  'connect($s, pack_sockaddr_un($ARGV[0])) ? print "connected\\n" : print "refused: $!\\n"';

/** Run `argv` as `user`, with only the environment given. */
function asUser(user: string, env: Record<string, string>, argv: string[], cwd?: string) {
  const vars = Object.entries(env).map(([name, value]) => `${name}=${value}`);
  return run(["runuser", "-u", user, "--", "env", "-i", ...vars, ...argv], {
    cwd,
    timeoutMs: 600_000,
  });
}

/** The checkout's CLI as `user`, with the configuration in `home` (its deno cache only: no download). */
function cliAsUser(user: string, env: Record<string, string>, home: string, args: string[]) {
  return asUser(user, env, [
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    "--cached-only",
    "--frozen",
    `${ROOT}/cli.ts`,
    "--config",
    `${home}/sandbox.yaml`,
    ...args,
  ], ROOT);
}

async function must(argv: string[]): Promise<string> {
  const result = await run(argv, { timeoutMs: 120_000 });
  assert.equal(result.exitCode, 0, `${argv.join(" ")}: ${explain(result)}`);
  return result.stdout.trim();
}

/**
 * The user's own deno cache: the host's npm packages, compiled modules and esbuild, hard-linked
 * into directories the user owns (the files stay root's and read-only to the user: the host's
 * cache cannot be changed through them). No download: the run is `--cached-only`.
 */
async function userDenoDir(user: string, denoDir: string): Promise<void> {
  const info = await run([Deno.execPath(), "info", "--json"], { timeoutMs: 60_000 });
  const host = JSON.parse(info.stdout).denoDir as string;
  await Deno.mkdir(denoDir);
  for (const part of ["npm", "gen", "dl"]) {
    if (await Deno.stat(`${host}/${part}`).then(() => true, () => false)) {
      // Hard links need one filesystem; a copy elsewhere (slower, the same files).
      const linked = await run(["cp", "-al", `${host}/${part}`, `${denoDir}/${part}`]);
      if (linked.exitCode !== 0) {
        await Deno.remove(`${denoDir}/${part}`, { recursive: true }).catch(() => {}); // maybe none
        await must(["cp", "-R", `${host}/${part}`, `${denoDir}/${part}`]);
      }
    }
  }
  await must(["find", denoDir, "-type", "d", "-exec", "chown", `${user}:${user}`, "{}", "+"]);
}

/** The replayed recording, its `execute` call preceded by a read of `secret` (a host path). */
async function recordingReading(secret: string): Promise<string> {
  const recording = JSON.parse(
    await Deno.readTextFile(`${ROOT}/examples/hello/recording.json`),
  );
  for (const response of recording.responses) {
    for (const call of response.body.choices[0].message.tool_calls ?? []) {
      if (call.function.name !== "execute") continue;
      const args = JSON.parse(call.function.arguments);
      args.command = `cat ${secret} 2>&1; echo "home-read-exit:$?"; ${args.command}`;
      call.function.arguments = JSON.stringify(args);
    }
  }
  return JSON.stringify(recording);
}

Deno.test({
  name:
    "an ordinary user without Docker runs mode local: the branch comes back, the user's home stays out of the sandbox and the Docker socket out of reach (twins: the user reads it on the host, root reaches Docker)",
  ignore: (LOCAL_UNAVAILABLE !== undefined || Deno.uid() !== 0) && !IN_CI,
  fn: () => withTestUser(runAsUser),
});

for (const agent of ["claude-code", "codex"] as const) {
  Deno.test({
    name:
      `an ordinary user runs ${agent} in mode local from the package cached in its own home: the branch comes back, the key went upstream and the user's home stays out of the agent's reach (twin: the user reads it on the host)`,
    ignore: (LOCAL_UNAVAILABLE !== undefined || Deno.uid() !== 0) && !IN_CI,
    sanitizeResources: false,
    sanitizeOps: false,
    fn: () => withTestUser((user, home) => agentAsUser(agent, user, home)),
  });
}

/** `body` with a user this test creates (no Docker group), its home a new directory; both removed after. */
async function withTestUser(body: (user: string, home: string) => Promise<void>): Promise<void> {
  assertLocal();
  assert.equal(Deno.uid(), 0, "creating the test's user needs root");
  const user = `sbxt${crypto.randomUUID().replaceAll("-", "").slice(0, 10)}`;
  const home = await Deno.makeTempDir({ prefix: "sandbox-user-" });
  await must(["useradd", "--no-create-home", "--home-dir", home, "--shell", "/bin/sh", user]);
  try {
    await must(["chown", `${user}:${user}`, home]);
    await must(["chmod", "0700", home]);
    await body(user, home);
  } finally {
    // -f: even if a process of the user is left (it must not be; the test failed then anyway).
    await run(["userdel", "-f", user], { timeoutMs: 60_000 });
    // The agent's unpacked program is read-only: writable again so that its removal goes through.
    await run(["chmod", "-R", "u+w", "--", home]);
    await Deno.remove(home, { recursive: true });
  }
}

/** The user is in no docker group and cannot connect to the Docker socket, which root can (twin). */
async function assertNoDocker(user: string, env: Record<string, string>): Promise<void> {
  const groups = await must(["id", "-Gn", user]);
  assert.doesNotMatch(groups, /\bdocker\b/, "the user is in no docker group");
  const docker = await asUser(user, env, ["perl", "-e", CONNECT, DOCKER_SOCKET]);
  assert.match(docker.stdout, /^refused: Permission denied/, explain(docker));
  const rootDocker = await run(["perl", "-e", CONNECT, DOCKER_SOCKET]);
  assert.equal(rootDocker.stdout, "connected\n", `twin: root reaches Docker: ${rootDocker.stderr}`);
}

/** The user's environment: its own home, state, caches and configuration, nothing of root's. */
function userEnv(home: string) {
  return {
    HOME: home,
    PATH: "/usr/local/bin:/usr/bin:/bin",
    DENO_DIR: `${home}/deno`,
    DENO_NO_UPDATE_CHECK: "1",
    XDG_STATE_HOME: `${home}/state`,
    XDG_CACHE_HOME: `${home}/cache`,
    XDG_CONFIG_HOME: `${home}/config`,
  };
}

/**
 * A file only the user may read (`home`/secret.txt) holding a canary, and a git repository of the
 * user's (`home`/repo). Twin: the user reads the file on the host.
 */
async function userFiles(
  user: string,
  env: Record<string, string>,
  home: string,
): Promise<{ secret: string; canary: string }> {
  const secret = `${home}/secret.txt`;
  const canary = `user-secret-${crypto.randomUUID()}`;
  const files = await asUser(user, env, [
    "sh",
    "-c",
    'umask 077 && printf "%s\\n" "$1" >"$2" && cat "$2" && ' +
    'git init -q "$3" && git -C "$3" -c user.name=t -c user.email=t@t.invalid commit -q --allow-empty -m init',
    "sh",
    canary,
    secret,
    `${home}/repo`,
  ]);
  assert.equal(
    files.stdout,
    `${canary}\n`,
    `twin: the user reads it on the host: ${explain(files)}`,
  );
  return { secret, canary };
}

async function runAsUser(user: string, home: string): Promise<void> {
  const env = userEnv(home);
  await assertNoDocker(user, env);
  const { secret, canary } = await userFiles(user, env, home);
  const profile = uniqueProfile("local-user");
  await Deno.writeTextFile(
    `${home}/sandbox.yaml`,
    `profiles:\n  ${profile}:\n    sandbox: {mode: local}\n`,
  );
  await Deno.copyFile(`${ROOT}/examples/hello/prompt.txt`, `${home}/prompt.txt`);
  await Deno.writeTextFile(`${home}/recording.json`, await recordingReading(secret));
  await userDenoDir(user, env.DENO_DIR);
  await must([
    "chown",
    `${user}:${user}`,
    ...["sandbox.yaml", "prompt.txt", "recording.json"]
      .map((f) => `${home}/${f}`),
  ]);

  const result = await cliAsUser(user, env, home, [
    "run",
    "agentic",
    "-p",
    profile,
    "--prompt-file",
    `${home}/prompt.txt`,
    "--model",
    `replay:${home}/recording.json`,
    "--format",
    "ndjson",
    "--repo",
    `${home}/repo`,
  ]);
  assert.equal(result.exitCode, 0, explain(result));
  const messages = result.stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
  const ran = messages.find((m) => m.type === "tool_result" && m.tool_name === "execute");
  const output = String(ran?.tool_output);
  assert.match(output, /Hello from the sandbox/, explain(result));
  assert.match(output, /home-read-exit:[1-9]/, "the user's file is not readable inside");
  assert.doesNotMatch(result.stdout, new RegExp(canary));
  const branch = /branch (sandbox\/\S+) in /.exec(result.stderr)?.[1];
  assert.ok(branch, explain(result));
  const show = await asUser(user, env, ["git", "-C", `${home}/repo`, "show", `${branch}:greet.sh`]);
  assert.match(show.stdout, /Hello from the sandbox/, explain(show));
  await assertLockedDirsRemoved(user, env, home, profile);
}

/**
 * A command that leaves directories no one may enter or change (mode 0, as the user's own uid
 * outside) still leaves no sandbox directory behind: the host mends the modes, then removes it.
 */
async function assertLockedDirsRemoved(
  user: string,
  env: Record<string, string>,
  home: string,
  profile: string,
): Promise<void> {
  const exec = await cliAsUser(user, env, home, [
    "exec",
    "-p",
    profile,
    "--",
    "sh",
    "-c",
    "mkdir -p /tmp/locked/sub && touch /tmp/locked/sub/f && chmod 0 /tmp/locked/sub /tmp/locked && " +
    "rm -rf /tmp/locked 2>/dev/null; test -d /tmp/locked && echo still-there",
  ]);
  // Twin: the user's own uid cannot remove them as they are.
  assert.equal(exec.stdout, "still-there\n", explain(exec));
  assert.equal(exec.exitCode, 0, explain(exec));
  const left = await Array.fromAsync(Deno.readDir(`${home}/state/sandbox/local`));
  assert.deepEqual(left.map((entry) => entry.name), [], "no sandbox directory is left");
}

const KEY_ENV = "SANDBOX_USER_TEST_KEY";

const GREET = "echo hello from the agent\n";

/** What each agent is told, and how its key travels upstream (tests/e2e/local_agent_cli_test.ts). */
const AGENTS = {
  "claude-code": {
    api: "anthropic",
    llm: "provider: custom, api: anthropic, model: claude-sonnet-4-5",
    flags: ["--agent", "claude-code"],
    steps: (command: string): AgentStep[] => [
      { kind: "tool", name: "Write", input: { file_path: "greet.sh", content: GREET } },
      { kind: "tool", name: "Bash", input: { command, description: "Run it" } },
      { kind: "text", text: "Done." },
    ],
    key: ["x-api-key", (key: string) => key],
  },
  codex: {
    api: "responses",
    llm: "provider: custom, api: openai, model: gpt-5.5, agent: codex",
    flags: [],
    steps: (command: string): AgentStep[] => [
      {
        kind: "tool",
        name: "exec_command",
        input: { cmd: `printf 'echo hello from the agent\\n' > greet.sh` },
      },
      { kind: "tool", name: "exec_command", input: { cmd: command } },
      { kind: "text", text: "Done." },
    ],
    key: ["authorization", (key: string) => `Bearer ${key}`],
  },
} as const;

/**
 * An agent CLI run by the user: its pinned tarball in the user's own cache (linked from this
 * machine's npm cache, where the image layer would fetch it), unpacked there by the run and bound
 * read-only into the sandbox. A fake LLM on the host's loopback, reached only through the relay
 * and the user's credential proxy, has the agent write greet.sh, then try the user's file and run
 * the script.
 */
async function agentAsUser(
  name: keyof typeof AGENTS,
  user: string,
  home: string,
): Promise<void> {
  const env = { ...userEnv(home), [KEY_ENV]: `sk-user-${crypto.randomUUID().replaceAll("-", "")}` };
  const { secret, canary } = await userFiles(user, env, home);
  const how = AGENTS[name];
  const script = how.steps(`cat ${secret} 2>&1; echo "home-read-exit:$?"; sh greet.sh`);
  await using fake = new FakeAgentLlm(how.api, script, env[KEY_ENV], "fake-model");
  const agent = AGENT_PACKAGES[name];
  const tarball = agent.tarballs[hostArchitecture()!];
  const npm = `${env.XDG_CACHE_HOME}/sandbox/npm`;
  await Deno.mkdir(npm, { recursive: true });
  const cached = await fetchTarball(tarball);
  // The link stays root's and read-only to the user: this machine's cache cannot change through it.
  await Deno.link(cached, `${npm}/${cachedTarballName(tarball)}`).catch(() =>
    Deno.copyFile(cached, `${npm}/${cachedTarballName(tarball)}`)
  );
  const profile = uniqueProfile(`local-user-${name}`);
  await Deno.writeTextFile(
    `${home}/sandbox.yaml`,
    `profiles:\n  ${profile}:\n    llm: {${how.llm}, ` +
      `base_url: "${fake.baseUrl}", key: {env: ${KEY_ENV}}}\n    sandbox: {mode: local}\n`,
  );
  await Deno.writeTextFile(`${home}/prompt.txt`, "Write greet.sh, then run it.\n");
  await userDenoDir(user, env.DENO_DIR);
  await must([
    "find",
    `${home}/cache`,
    "-type",
    "d",
    "-exec",
    "chown",
    `${user}:${user}`,
    "{}",
    "+",
  ]);
  await must(["chown", `${user}:${user}`, `${home}/sandbox.yaml`, `${home}/prompt.txt`]);

  const result = await cliAsUser(user, env, home, [
    "run",
    "agentic",
    "-p",
    profile,
    ...how.flags,
    "--prompt-file",
    `${home}/prompt.txt`,
    "--format",
    "ndjson",
    "--repo",
    `${home}/repo`,
  ]);
  const context = explain(result);
  assert.equal(result.exitCode, 0, context);
  const messages = result.stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
  const ran = messages.find((m) =>
    m.type === "tool_result" && String(m.tool_output).includes("home-read-exit")
  );
  assert.ok(ran, `the agent's command ran\n${context}`);
  assert.match(String(ran.tool_output), /hello from the agent/, context);
  assert.match(
    String(ran.tool_output),
    /home-read-exit:[1-9]/,
    "the user's file is unreadable inside",
  );
  assert.doesNotMatch(result.stdout, new RegExp(canary));
  const [header, value] = how.key;
  assert.equal(fake.requests[0]?.headers.get(header), value(env[KEY_ENV]), "the key went upstream");
  const branch = /branch (sandbox\/\S+) in /.exec(result.stderr)?.[1];
  assert.ok(branch, context);
  const show = await asUser(user, env, ["git", "-C", `${home}/repo`, "show", `${branch}:greet.sh`]);
  assert.equal(show.stdout, GREET, explain(show));
  const unpacked = `${env.XDG_CACHE_HOME}/sandbox/agents/${await hostAgentName(
    agent,
    hostArchitecture()!,
  )}/${agent.entrypoint}`;
  const program = await Deno.stat(unpacked);
  assert.equal(program.uid, Number(await must(["id", "-u", user])), "unpacked by the user");
  assert.equal((program.mode ?? 0) & 0o222, 0, "the user's copy of the program is read-only");
}
