/**
 * Sandbox mode local for an ordinary user (docs/local.md): a user this test creates (removed at the
 * end, whatever happens), with no access to any Docker socket, runs a replayed agentic run with
 * `--repo` on a repository of its own. The run succeeds and its branch comes back; the agent, in
 * the sandbox, cannot read a file of that user's home outside the checkout, which the user reads on
 * the host (twin); the user cannot connect to the Docker socket, which root can (twin).
 *
 * It needs root (to create the user): CI runs as root, so there it must run; on a developer
 * machine as another user it is skipped, like the other mode-local tests without bubblewrap.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { explain, IN_CI, ROOT, uniqueProfile } from "../_helpers.ts";
import { assertLocal, LOCAL_UNAVAILABLE } from "../_local.ts";

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
  async fn() {
    assertLocal();
    assert.equal(Deno.uid(), 0, "creating the test's user needs root");
    const user = `sbxt${crypto.randomUUID().replaceAll("-", "").slice(0, 10)}`;
    const home = await Deno.makeTempDir({ prefix: "sandbox-user-" });
    await must(["useradd", "--no-create-home", "--home-dir", home, "--shell", "/bin/sh", user]);
    try {
      await must(["chown", `${user}:${user}`, home]);
      await must(["chmod", "0700", home]);
      await runAsUser(user, home);
    } finally {
      // -f: even if a process of the user is left (it must not be; the test failed then anyway).
      await run(["userdel", "-f", user], { timeoutMs: 60_000 });
      await Deno.remove(home, { recursive: true });
    }
  },
});

/** The user is in no docker group and cannot connect to the Docker socket, which root can (twin). */
async function assertNoDocker(user: string, env: Record<string, string>): Promise<void> {
  const groups = await must(["id", "-Gn", user]);
  assert.doesNotMatch(groups, /\bdocker\b/, "the user is in no docker group");
  const docker = await asUser(user, env, ["perl", "-e", CONNECT, DOCKER_SOCKET]);
  assert.match(docker.stdout, /^refused: Permission denied/, explain(docker));
  const rootDocker = await run(["perl", "-e", CONNECT, DOCKER_SOCKET]);
  assert.equal(rootDocker.stdout, "connected\n", `twin: root reaches Docker: ${rootDocker.stderr}`);
}

async function runAsUser(user: string, home: string): Promise<void> {
  const env = {
    HOME: home,
    PATH: "/usr/local/bin:/usr/bin:/bin",
    DENO_DIR: `${home}/deno`,
    DENO_NO_UPDATE_CHECK: "1",
    XDG_STATE_HOME: `${home}/state`,
    XDG_CACHE_HOME: `${home}/cache`,
    XDG_CONFIG_HOME: `${home}/config`,
  };
  await assertNoDocker(user, env);

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
