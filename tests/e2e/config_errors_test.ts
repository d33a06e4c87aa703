/**
 * Configuration errors as a user meets them, the same for every command: the real CLI as a
 * subprocess, a fake `docker` first on PATH that records what it is asked (no engine involved), and
 * a private XDG_CONFIG_HOME / XDG_STATE_HOME per test.
 */
import assert from "node:assert/strict";
import type { RunResult } from "../../lib/process.ts";
import { explain, runCli, tempDir } from "../_helpers.ts";
import { fakeDocker } from "../unit/_fake_docker.ts";

console.error("e2e: configuration error tests starting");

/**
 * A fake docker whose engine is down: anything that reaches it fails with exit 125 — except the
 * listing by label that `down` starts with (one leftover container per profile), and its removal
 * (gone meanwhile: as docker 20.10 says it for `rm --force`, exit 0 and nothing on stdout).
 */
const ENGINE_DOWN = `
case "$1" in
  ps) for a in "$@"; do case "$a" in label=dev.sandbox.profile=*) echo "sandbox-\${a#label=dev.sandbox.profile=}" ;; esac; done ;;
  rm) echo "Error: No such container: \${@: -1}" >&2; exit 0 ;;
  network) exit 0 ;;  # down also looks for networks older versions made: none here
  *) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2; exit 1 ;;
esac`;

async function setup() {
  const dir = await tempDir("sandbox-e2e-config-");
  const docker = await fakeDocker(ENGINE_DOWN);
  const env = {
    PATH: `${docker.dir}:${Deno.env.get("PATH")}`,
    XDG_CONFIG_HOME: `${dir.path}/xdg`,
    XDG_STATE_HOME: `${dir.path}/state`,
    SANDBOX_CONFIG: "",
  };
  const cli = (args: string[], extra: Record<string, string> = {}) =>
    runCli(args, { env: { ...env, ...extra }, cwd: dir.path, timeoutMs: 60_000 });
  return {
    dir,
    docker,
    cli,
    async [Symbol.asyncDispose]() {
      await docker[Symbol.asyncDispose]();
      await dir[Symbol.asyncDispose]();
    },
  };
}

/** Run `jobs` two at a time: the machine is shared, but thirty CLI starts in a row are slow. */
async function inPairs<T>(jobs: (() => Promise<T>)[]): Promise<T[]> {
  const results: T[] = [];
  for (let i = 0; i < jobs.length; i += 2) {
    results.push(...await Promise.all(jobs.slice(i, i + 2).map((job) => job())));
  }
  return results;
}

const COMMANDS: string[][] = [
  ["status"],
  ["ls"],
  ["stats"],
  ["runs"],
  ["logs", "no-such-run"],
  ["down", "-p", "work"],
  ["up", "-p", "work"],
  ["exec", "-p", "work", "--", "true"],
  ["config", "show"],
  ["trust", "--list"],
];

function assertConfigError(result: RunResult, path: string, problem: RegExp, what: string): void {
  const context = `${what}\n${explain(result)}`;
  assert.equal(result.exitCode, 2, context);
  assert.match(
    result.stderr,
    new RegExp(`Invalid configuration in "${path.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}"`),
    context,
  );
  assert.match(result.stderr, problem, context);
  assert.doesNotMatch(result.stderr, /\n\s+at /, `stack trace\n${context}`);
}

Deno.test("every command refuses a missing or invalid named config with exit 2, the path and the problem", async () => {
  await using t = await setup();
  const missing = `${t.dir.path}/missing.yaml`;
  const invalid = `${t.dir.path}/invalid.yaml`;
  await Deno.writeTextFile(invalid, "profiles: {work: {sandbox: {resources: {memory: lots}}}}\n");
  const cases = [
    ...COMMANDS.map((args) => ({
      args: ["-c", missing, ...args],
      env: {},
      path: missing,
      problem: /cannot read: file not found/,
    })),
    ...COMMANDS.map((args) => ({
      args,
      env: { SANDBOX_CONFIG: missing },
      path: missing,
      problem: /cannot read: file not found/,
    })),
    ...COMMANDS.map((args) => ({
      args: ["-c", invalid, ...args],
      env: {},
      path: invalid,
      problem: /profiles\.work\.sandbox\.resources\.memory: expected a size like "4g"/,
    })),
  ];
  const results = await inPairs(cases.map((c) => () => t.cli(c.args, c.env)));
  cases.forEach((c, i) =>
    assertConfigError(
      results[i],
      c.path,
      c.problem,
      `${JSON.stringify(c.env)} sandbox ${c.args.join(" ")}`,
    )
  );
  assert.deepEqual(
    await t.docker.calls(),
    [],
    "a command went on to docker despite the broken config",
  );

  // The twin: with a valid named config the same commands get past the configuration (and meet
  // the engine, which is down here, or answer from the state directory).
  const valid = `${t.dir.path}/valid.yaml`;
  await Deno.writeTextFile(valid, "profiles: {work: {}}\n");
  for (const args of [["status"], ["runs"], ["config", "show"], ["up", "-p", "work"]]) {
    const result = await t.cli(["-c", valid, ...args]);
    assert.notEqual(result.exitCode, 2, `sandbox ${args.join(" ")}\n${explain(result)}`);
  }
});

Deno.test("down -p removes a sandbox by its profile name whatever the configuration says", async () => {
  await using t = await setup();
  // A broken user configuration: the commands that need it refuse, `down -p` and `status` do not.
  await Deno.mkdir(`${t.dir.path}/xdg/sandbox`, { recursive: true });
  const userConfig = `${t.dir.path}/xdg/sandbox/config.yaml`;
  await Deno.writeTextFile(
    userConfig,
    "default_profile: work\nprofiles: {work: {sandbox: {mode: vm}}}\n",
  );

  const down = await t.cli(["down", "-p", "work"]);
  assert.equal(down.exitCode, 0, explain(down));
  // Human output: on stdout (progress and diagnostics alone go to stderr).
  assert.equal(down.stdout, "no sandbox for profile work\n", explain(down));
  // Every container labelled with the profile (its development sandboxes, its pool, its runs'),
  // found by label and removed by name.
  const listed = (
    name: string,
  ) => [
    "ps",
    "--all",
    "--filter",
    "label=dev.sandbox.owner=sandbox",
    "--filter",
    `label=dev.sandbox.profile=${name}`,
    "--format",
    '{{.Names}} {{.Label "dev.sandbox.kind"}}',
  ];
  const removed = (name: string) => ["rm", "--force", name];
  assert.deepEqual(await t.docker.callsStartingWith("ps"), [listed("work")]);
  assert.deepEqual(await t.docker.callsStartingWith("rm"), [removed("sandbox-work")]);

  const byEnv = await t.cli(["down"], { SANDBOX_PROFILE: "other" });
  assert.equal(byEnv.exitCode, 0, explain(byEnv));
  assert.deepEqual((await t.docker.callsStartingWith("ps")).at(-1), listed("other"));
  assert.deepEqual((await t.docker.callsStartingWith("rm")).at(-1), removed("sandbox-other"));

  // Without a name, the profile would come from the broken file: refused, saying how to proceed.
  const unnamed = await t.cli(["down"]);
  assert.equal(unnamed.exitCode, 2, explain(unnamed));
  assert.match(
    unnamed.stderr,
    /Cannot tell which profile's sandbox to remove: Invalid configuration in ".*config\.yaml"/,
  );
  assert.match(unnamed.stderr, /profiles\.work\.sandbox\.mode/);
  assert.match(unnamed.stderr, /sandbox down -p PROFILE/);

  assertConfigError(
    await t.cli(["up", "-p", "work"]),
    userConfig,
    /profiles\.work\.sandbox\.mode/,
    "up",
  );
  const status = await t.cli(["status"]);
  assert.notEqual(status.exitCode, 2, `status needs no configuration\n${explain(status)}`);

  // A profile the (now valid) configuration does not define, or defines with mode none, still has
  // its leftover sandbox removed by name.
  await Deno.writeTextFile(userConfig, "profiles: {work: {sandbox: {mode: none}}}\n");
  for (const profile of ["work", "gone"]) {
    const result = await t.cli(["down", "-p", profile]);
    assert.equal(result.exitCode, 0, explain(result));
    assert.deepEqual((await t.docker.callsStartingWith("ps")).at(-1), listed(profile));
    assert.deepEqual(
      (await t.docker.callsStartingWith("rm")).at(-1),
      removed(`sandbox-${profile}`),
    );
  }
  const bad = await t.cli(["down", "-p", "../x"]);
  assert.equal(bad.exitCode, 2, explain(bad));
  assert.match(bad.stderr, /Invalid profile name "\.\.\/x"/);
});

Deno.test("exec -e refuses a secret-looking name, as the configuration does", async () => {
  await using t = await setup();
  for (const name of ["MY_TOKEN", "OPENAI_API_KEY", "db_password", "MY_SESSION"]) {
    const result = await t.cli(["exec", "-e", `${name}=x`, "--", "true"]);
    assert.equal(result.exitCode, 2, explain(result));
    assert.match(
      result.stderr,
      new RegExp(`Refusing --env "${name}": the name looks like a secret`),
    );
  }
  assert.deepEqual(
    await t.docker.calls(),
    [],
    "exec went on to docker with a secret-looking variable",
  );
  // The twin: an innocent name gets past the check to the engine (down here: exit 125).
  const innocent = await t.cli(["exec", "-e", "NOTES=x", "--", "true"]);
  assert.equal(innocent.exitCode, 125, explain(innocent));
  assert.match(innocent.stderr, /Cannot reach the Docker engine/);
});
