/**
 * The commands that manage sandboxes, as a user runs them against a real engine: `up` (fills the
 * warm pool runs claim from), and on the profile's development sandbox `exec`, `stop`, `start`,
 * `status --json`, `down`, `cp` both ways (`:PATH`, and `RUN_ID:PATH` into a kept run's sandbox),
 * `image build`, and where their output goes (human output on stdout, progress on stderr). One
 * profile of its own, removed afterwards, and a private state directory.
 */
import assert from "node:assert/strict";
import { run, type RunResult } from "../../lib/process.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  removeProfile,
  ROOT,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";

console.error("e2e: sandbox commands starting");

const STACK = /^\s+at |file:\/\//m;

class Fixture implements AsyncDisposable {
  readonly profile = uniqueProfile("e2e-cmds");
  config = "";
  constructor(readonly dir: { path: string } & AsyncDisposable) {}

  static async create(): Promise<Fixture> {
    const fixture = new Fixture(await tempDir("sandbox-e2e-cmds-"));
    fixture.config = await writeConfig(fixture.dir.path, `profiles:\n  ${fixture.profile}: {}\n`);
    return fixture;
  }

  get container(): string {
    return `sandbox-${this.profile}`;
  }

  /**
   * `sandbox ARGS` with this fixture's config placed after the command's own arguments (global
   * options anywhere) — before a `--`, after which everything belongs to `exec`'s command.
   */
  cli(args: string[], options: { cwd?: string } = {}): Promise<RunResult> {
    const end = args.includes("--") ? args.indexOf("--") : args.length;
    const withConfig = [...args.slice(0, end), "--config", this.config, ...args.slice(end)];
    return runCli(withConfig, {
      env: { XDG_STATE_HOME: `${this.dir.path}/state` },
      cwd: options.cwd,
      timeoutMs: 240_000,
    });
  }

  async ok(args: string[], options: { cwd?: string } = {}): Promise<RunResult> {
    const result = await this.cli(args, options);
    assert.equal(result.exitCode, 0, `sandbox ${args.join(" ")}\n${explain(result)}`);
    assert.doesNotMatch(result.stderr, STACK, explain(result));
    return result;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await removeProfile(this.profile);
    } finally {
      await this.dir[Symbol.asyncDispose]();
    }
  }
}

Deno.test({
  name:
    "stop keeps a sandbox and its files, start resumes it, and status --json tells when each happened",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using f = await Fixture.create();

    await t.step(
      "up fills the warm pool and prints its sandbox on stdout, with --config after the command; exec starts the development sandbox",
      async () => {
        const up = await f.ok(["up", "-p", f.profile]);
        const pooled = up.stdout.match(
          new RegExp(
            `^sandbox (${f.container}-p[0-9a-f]{8}) is ready \\(profile ${f.profile}\\)\\n$`,
          ),
        );
        assert.ok(pooled, explain(up));
        assert.equal(
          await docker(
            "inspect",
            "--format",
            '{{index .Config.Labels "dev.sandbox.kind"}}',
            pooled[1],
          ),
          "pool",
        );
        // up starts no development sandbox: exec does, and the pooled one is not it.
        const before = await run(["docker", "container", "inspect", f.container]);
        assert.notEqual(before.exitCode, 0, "up started the development sandbox");
        await f.ok(["exec", "-p", f.profile, "--", "sh", "-c", "echo kept > /workspace/kept.txt"]);
        const inPool = await docker(
          "exec",
          pooled[1],
          "sh",
          "-c",
          "test -e /workspace/kept.txt && echo found || echo absent",
        );
        assert.equal(inPool, "absent", "exec wrote into the pooled sandbox");
      },
    );

    let firstStart = "";
    await t.step(
      "a running sandbox has startedAt, no stoppedAt, and its workspace path",
      async () => {
        const status = JSON.parse((await f.ok(["status", "--json"])).stdout).find((
          s: { name: string },
        ) => s.name === f.container);
        assert.ok(status, "the sandbox is not listed");
        assert.equal(status.state, "running");
        assert.equal(status.kind, "shared", JSON.stringify(status));
        assert.ok(
          Date.parse(status.startedAt) >= Date.parse(status.createdAt),
          JSON.stringify(status),
        );
        assert.equal(status.stoppedAt, null);
        assert.equal(status.workspacePath, "/workspace");
        firstStart = status.startedAt;
      },
    );

    await t.step("stop leaves the container stopped, with stoppedAt set", async () => {
      const stopped = await f.ok(["stop", "-p", f.profile, "--json"]);
      const status = JSON.parse(stopped.stdout);
      assert.equal(status.state, "stopped", stopped.stdout);
      assert.ok(Date.parse(status.stoppedAt) >= Date.parse(firstStart), stopped.stdout);
      assert.equal(await docker("inspect", "--format", "{{.State.Running}}", f.container), "false");
    });

    await t.step(
      "start runs the same container again, and the file written before is still there",
      async () => {
        const id = await docker("inspect", "--format", "{{.Id}}", f.container);
        const started = await f.ok(["start", "-p", f.profile]);
        assert.match(
          started.stdout,
          new RegExp(`^sandbox ${f.container} is running`),
          explain(started),
        );
        assert.equal(
          await docker("inspect", "--format", "{{.Id}}", f.container),
          id,
          "start replaced the container",
        );
        const status = JSON.parse((await f.ok(["status", "--json"], {})).stdout).find((
          s: { name: string },
        ) => s.name === f.container);
        assert.equal(status.stoppedAt, null);
        assert.ok(Date.parse(status.startedAt) > Date.parse(firstStart), JSON.stringify(status));
        const cat = await f.ok(["exec", "-p", f.profile, "--", "cat", "/workspace/kept.txt"]);
        assert.equal(cat.stdout, "kept\n");
      },
    );

    await t.step(
      "down prints what it removed on stdout (the development sandbox, the pool, their volumes); down again says there is nothing",
      async () => {
        const pooled = JSON.parse((await f.ok(["status", "--json"])).stdout)
          .filter((s: { profile: string; kind: string }) =>
            s.profile === f.profile && s.kind === "pool"
          )
          .map((s: { name: string }) => s.name);
        assert.equal(pooled.length, 1, JSON.stringify(pooled));
        const down = await f.ok(["down", "-p", f.profile, "--volumes"]);
        const removed = down.stdout.match(/^removed (.*)\n$/)?.[1].split(", ").sort();
        const expected = [
          f.container,
          `${f.container}-workspace`,
          pooled[0],
          `${pooled[0]}-workspace`,
        ].sort();
        assert.deepEqual(removed, expected, explain(down));
        const again = await f.ok(["down", "-p", f.profile]);
        assert.equal(again.stdout, `no sandbox for profile ${f.profile}\n`, explain(again));
        assert.equal(again.stderr, "");
      },
    );

    await t.step(
      "stop of a sandbox that does not exist fails and says how to start it; start makes it anew, with an empty workspace",
      async () => {
        const stop = await f.cli(["stop", "-p", f.profile]);
        assert.notEqual(stop.exitCode, 0, explain(stop));
        assert.match(
          stop.stderr,
          new RegExp(
            `^sandbox: error: Sandbox "${f.container}" does not exist\\nsandbox:   Start it with: sandbox start$`,
            "m",
          ),
        );
        assert.doesNotMatch(stop.stderr, STACK, explain(stop));
        const started = await f.ok(["start", "-p", f.profile]);
        assert.match(
          started.stdout,
          new RegExp(`^sandbox ${f.container} is running`),
          explain(started),
        );
        const cat = await f.cli(["exec", "-p", f.profile, "--", "cat", "/workspace/kept.txt"]);
        assert.notEqual(cat.exitCode, 0, `the removed workspace's file is back\n${explain(cat)}`);
      },
    );
  },
});

Deno.test({
  name: "cp copies files and directories into a sandbox and out of it, by :PATH and by RUN_ID:PATH",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using f = await Fixture.create();
    const d = f.dir.path;
    await f.ok(["start", "-p", f.profile]);
    await Deno.mkdir(`${d}/src/nested`, { recursive: true });
    await Deno.writeTextFile(`${d}/src/nested/a.txt`, "alpha\n");
    await Deno.writeTextFile(`${d}/single.txt`, "one\n");

    await t.step(
      "a host directory into the sandbox, relative to /workspace, owned by the sandbox user",
      async () => {
        await f.ok(["cp", "-p", f.profile, `${d}/src`, ":project/src"]);
        const owner = await f.ok([
          "exec",
          "-p",
          f.profile,
          "--",
          "stat",
          "-c",
          "%U %n",
          "/workspace/project/src/nested/a.txt",
        ]);
        assert.equal(owner.stdout, "sandbox /workspace/project/src/nested/a.txt\n");
      },
    );

    await t.step("a file into an existing sandbox directory lands under its own name", async () => {
      await f.ok(["cp", "-p", f.profile, `${d}/single.txt`, ":project"]);
      const cat = await f.ok([
        "exec",
        "-p",
        f.profile,
        "--",
        "cat",
        "/workspace/project/single.txt",
      ]);
      assert.equal(cat.stdout, "one\n");
    });

    await t.step(
      "a sandbox directory out to a new host path, and a file into an existing host directory",
      async () => {
        await f.ok([
          "exec",
          "-p",
          f.profile,
          "--",
          "sh",
          "-c",
          "echo changed >> /workspace/project/src/nested/a.txt",
        ]);
        await f.ok(["cp", "-p", f.profile, ":project/src", `${d}/back`]);
        assert.equal(await Deno.readTextFile(`${d}/back/nested/a.txt`), "alpha\nchanged\n");
        await Deno.mkdir(`${d}/into`);
        await f.ok(["cp", "-p", f.profile, ":/workspace/project/single.txt", `${d}/into`]);
        assert.equal(await Deno.readTextFile(`${d}/into/single.txt`), "one\n");
      },
    );

    await t.step("a path that does not exist in the sandbox is a clear error", async () => {
      const result = await f.cli(["cp", "-p", f.profile, ":project/nothing.txt", `${d}/x`]);
      assert.equal(result.exitCode, 2, explain(result));
      assert.match(
        result.stderr,
        new RegExp(
          `^sandbox: error: No such file or directory: ${f.container}:/workspace/project/nothing\\.txt$`,
          "m",
        ),
      );
      assert.doesNotMatch(result.stderr, STACK);
    });

    await t.step(
      "a run's file, by RUN_ID:PATH relative to the run's directory, while its sandbox is kept (--keep-worktree); a run whose sandbox went has nothing to copy",
      async () => {
        await Deno.copyFile(`${ROOT}/examples/hello/prompt.txt`, `${d}/prompt.txt`);
        const repo = `${d}/repo`;
        await Deno.mkdir(repo);
        for (
          const args of [["init", "-q", "-b", "main"], [
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "init",
          ]]
        ) {
          const git = await new Deno.Command("git", {
            args: ["-C", repo, "-c", "user.name=u", "-c", "user.email=u@x", ...args],
          }).output();
          assert.equal(git.code, 0, new TextDecoder().decode(git.stderr));
        }
        const replay = [
          "run",
          "agentic",
          "-p",
          f.profile,
          "--prompt-file",
          `${d}/prompt.txt`,
          "-m",
          `replay:${ROOT}/examples/hello/recording.json`,
          "--format",
          "ndjson",
        ];
        const ran = await f.ok([...replay, "--repo", repo, "--keep-worktree"]);
        const id = ran.stderr.match(/^sandbox: run (\S+) /m)?.[1];
        assert.ok(id, explain(ran));
        await f.ok(["cp", `${id}:greet.sh`, `${d}/greet.sh`]);
        assert.match(await Deno.readTextFile(`${d}/greet.sh`), /Hello from the sandbox/);
        // -p naming another profile than the run's is refused, not silently ignored.
        const wrong = await f.cli(["cp", "-p", "default", `${id}:greet.sh`, `${d}/g.sh`]);
        assert.equal(wrong.exitCode, 2, explain(wrong));
        assert.match(wrong.stderr, /is of profile/);
        // Twin: the same run without a repository to keep; its sandbox went with it.
        const gone = await f.ok(replay);
        const goneId = gone.stderr.match(/^sandbox: run (\S+) /m)?.[1];
        assert.ok(goneId, explain(gone));
        const nothing = await f.cli(["cp", `${goneId}:greet.sh`, `${d}/gone.sh`]);
        assert.equal(nothing.exitCode, 2, explain(nothing));
        assert.match(
          nothing.stderr,
          new RegExp(`^sandbox: error: Run "${goneId}" left nothing to copy`, "m"),
        );
      },
    );

    await t.step("a stopped sandbox is refused with the command that starts it", async () => {
      await f.ok(["stop", "-p", f.profile]);
      const result = await f.cli(["cp", "-p", f.profile, ":project/single.txt", `${d}/y`]);
      assert.equal(result.exitCode, 2, explain(result));
      assert.match(result.stderr, new RegExp(`Start it with: sandbox start -p ${f.profile}`));
    });
  },
});

Deno.test({
  name:
    "image build shows phases with their time on stderr and keeps docker's whole output in a log file",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using f = await Fixture.create();
    const result = await f.ok(["image", "build", "-p", f.profile]);
    const context = explain(result);
    const log = result.stdout.match(
      /^built (sandbox-runtime:[0-9a-f]{16}) \(on sandbox-base:bookworm; log: (\S+)\)$/m,
    );
    assert.ok(log, context);
    assert.match(
      result.stderr,
      /^sandbox: Building sandbox image sandbox-runtime:[0-9a-f]{16} on sandbox-base:bookworm \(log: .*\)$/m,
      context,
    );
    assert.match(
      result.stderr,
      /^sandbox: Built sandbox image sandbox-runtime:[0-9a-f]{16} in \d+\.\ds$/m,
      context,
    );
    // docker's own output, the legacy builder's deprecation notice included, is in the log only.
    assert.doesNotMatch(
      result.stderr,
      /Step \d+\/\d+|DEPRECATED|Sending build context|Successfully/,
      context,
    );
    const text = await Deno.readTextFile(log[2]);
    assert.match(text, /Step 1\/\d+ : ARG BASE_IMAGE/);
    assert.match(text, new RegExp(`Successfully tagged ${log[1].replace(/[.:]/g, "\\$&")}`));
    // The image carries no owner label: a container started from it by hand is not the tool's.
    const labels = JSON.parse(
      await docker("image", "inspect", "--format", "{{json .Config.Labels}}", log[1]),
    );
    assert.equal(labels["dev.sandbox.owner"], undefined, JSON.stringify(labels));
    assert.match(labels["dev.sandbox.content-hash"], /^[0-9a-f]{64}$/);
  },
});

Deno.test({
  name:
    "config show prints every profile's model in effect, and runs with no runs says so on stdout",
  async fn() {
    await using dir = await tempDir("sandbox-e2e-show-");
    const config = await writeConfig(
      dir.path,
      "profiles:\n  a: {llm: {provider: anthropic}}\n  b: {llm: {model: gpt-4o}}\n",
    );
    const env = { XDG_STATE_HOME: `${dir.path}/state` };
    const show = await runCli(["config", "show", "--json", "-c", config], { env });
    assert.equal(show.exitCode, 0, explain(show));
    const effective = JSON.parse(show.stdout);
    assert.equal(effective.profiles.a.llm.model, "claude-sonnet-4-5");
    assert.equal(effective.profiles.b.llm.model, "gpt-4o");
    assert.equal(effective.profiles.default.llm.model, "gpt-4.1-mini");
    const runs = await runCli(["runs", "-c", config], { env });
    assert.equal(runs.exitCode, 0, explain(runs));
    assert.equal(
      runs.stdout,
      "no runs yet (start one with: sandbox run agentic --prompt-file FILE)\n",
    );
    assert.equal(runs.stderr, "");
    const valid = await runCli(["config", "validate", config], { env });
    assert.equal(valid.stdout, `${config} is valid (profiles: default, a, b)\n`, explain(valid));
  },
});
