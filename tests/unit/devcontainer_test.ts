/**
 * The devcontainer configuration, its run-time settings and its lifecycle commands, without Docker:
 * real git repositories in temporary directories, and a fake provider that records commands.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { ConfigError, type SandboxError } from "../../lib/errors.ts";
import {
  type DevcontainerConfig,
  normalizeRelative,
  readDevcontainerConfig,
} from "../../lib/sandbox/devcontainer/config.ts";
import { resolveRuntime, userFor } from "../../lib/sandbox/devcontainer/runtime.ts";
import {
  prepareWorkspace,
  runLifecycle,
  WORKSPACE_LINK,
} from "../../lib/sandbox/devcontainer/lifecycle.ts";
import type {
  ExecOptions,
  ExecResult,
  ExecStream,
  SandboxProvider,
} from "../../lib/sandbox/provider.ts";
import { tempDir } from "../_helpers.ts";

async function git(cwd: string, ...args: string[]): Promise<string> {
  const result = await run([
    "git",
    "-C",
    cwd,
    "-c",
    "user.name=t",
    "-c",
    "user.email=t@example.test",
    "-c",
    "commit.gpgsign=false",
    ...args,
  ]);
  assert.equal(result.exitCode, 0, result.stderr);
  return result.stdout.trim();
}

/** A repository with `files` committed (a value starting with "->" is a symbolic link to the rest). */
async function repoWith(
  dir: string,
  files: Record<string, string>,
): Promise<{ path: string; head: string }> {
  const path = `${dir}/proj`;
  await Deno.mkdir(path, { recursive: true });
  await git(path, "init", "-q", "-b", "main");
  for (const [name, content] of Object.entries(files)) {
    const file = `${path}/${name}`;
    await Deno.mkdir(file.slice(0, file.lastIndexOf("/")), { recursive: true });
    if (content.startsWith("->")) await Deno.symlink(content.slice(2), file);
    else await Deno.writeTextFile(file, content);
  }
  await git(path, "add", "-A");
  await git(path, "commit", "-q", "-m", "init");
  return { path: await Deno.realPath(path), head: await git(path, "rev-parse", "HEAD") };
}

const env = (vars: Record<string, string>) => (name: string) => vars[name];

async function readWith(
  files: Record<string, string>,
  options: Parameters<typeof readDevcontainerConfig>[2] = {},
) {
  await using dir = await tempDir();
  const repo = await repoWith(dir.path, files);
  return await readDevcontainerConfig(repo.path, repo.head, { hostEnv: env({}), ...options });
}

async function issuesOf(promise: Promise<unknown>): Promise<string[]> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof ConfigError, `expected a ConfigError, got ${error}`);
    return error.issues.map((i) => `${i.path}: ${i.message}`);
  }
  assert.fail("expected the configuration to be refused");
}

Deno.test("a JSONC devcontainer.json with comments and trailing commas is read from the committed tree, its variables substituted", async () => {
  await using dir = await tempDir();
  const repo = await repoWith(dir.path, {
    ".devcontainer/devcontainer.json": `{
      // a comment
      "image": "debian:12", /* another */
      "containerEnv": { "A": "\${localEnv:GREETING}", "B": "\${localEnv:UNSET_ONE:fallback}", "C": "\${localWorkspaceFolderBasename}", "D": "\${containerWorkspaceFolder}" },
      "remoteEnv": { "P": "\${containerEnv:PATH}:/x" },
    }`,
  });
  // An uncommitted change is not what the sandbox uses.
  await Deno.writeTextFile(
    `${repo.path}/.devcontainer/devcontainer.json`,
    `{"image": "uncommitted:1"}`,
  );
  const config = await readDevcontainerConfig(repo.path, repo.head, {
    hostEnv: env({ GREETING: "hi" }),
  });
  assert.deepEqual(config.source, { kind: "image", image: "debian:12" });
  assert.equal(config.file, ".devcontainer/devcontainer.json");
  assert.deepEqual(config.entry.containerEnv, {
    A: "hi",
    B: "fallback",
    C: "proj",
    D: "/workspaces/proj",
  });
  assert.deepEqual(config.entry.remoteEnv, { P: "${containerEnv:PATH}:/x" });
  assert.equal(config.workspaceFolder, "/workspaces/proj");
  assert.deepEqual(config.buildConfig, { image: "debian:12" });
});

Deno.test("a ${localEnv} naming a secret is refused with its path, and a harmless one is substituted", async () => {
  const issues = await issuesOf(readWith({
    ".devcontainer.json":
      `{"image": "x", "containerEnv": {"K": "\${localEnv:OPENAI_API_KEY}"}, "build": {"args": {"T": "\${localEnv:GITHUB_TOKEN}"}}}`,
  }, { hostEnv: env({ OPENAI_API_KEY: "sk-secret-value", GITHUB_TOKEN: "ghp_x" }) }));
  assert.equal(issues.length, 2, issues.join("\n"));
  assert.match(issues[0], /^containerEnv\.K: \$\{localEnv:OPENAI_API_KEY\} names a secret/);
  assert.match(issues[1], /^build\.args\.T: \$\{localEnv:GITHUB_TOKEN\} names a secret/);
  assert.ok(!issues.join("\n").includes("sk-secret-value"));
  const config = await readWith(
    { ".devcontainer.json": `{"image": "x", "containerEnv": {"K": "\${localEnv:NODE_VERSION}"}}` },
    { hostEnv: env({ NODE_VERSION: "20" }) },
  );
  assert.deepEqual(config.entry.containerEnv, { K: "20" });
});

Deno.test("every key that would undo the hardening is listed once with the reason, and never reaches the build", async () => {
  const config = await readWith({
    ".devcontainer/devcontainer.json": JSON.stringify({
      build: { dockerfile: "Dockerfile", options: ["--network=host"], cacheFrom: "x" },
      privileged: true,
      capAdd: ["SYS_ADMIN"],
      securityOpt: ["seccomp=unconfined"],
      runArgs: ["--network=host", "--label", "x"],
      mounts: ["source=/var/run/docker.sock,target=/var/run/docker.sock,type=bind"],
      workspaceMount: "source=/,target=/host,type=bind",
      init: false,
      forwardPorts: [3000],
      appPort: 8080,
      initializeCommand: "touch /tmp/owned",
      postAttachCommand: "echo hi",
    }),
    ".devcontainer/Dockerfile": "FROM debian\n",
  });
  const keys = config.warnings.map((w) => w.match(/"([^"]+)"/)![1]);
  assert.deepEqual(keys.sort(), [
    "appPort",
    "build.cacheFrom",
    "build.options",
    "capAdd",
    "forwardPorts",
    "init",
    "initializeCommand",
    "mounts",
    "postAttachCommand",
    "privileged",
    "runArgs",
    "securityOpt",
    "workspaceMount",
  ]);
  assert.ok(
    config.warnings.some((w) =>
      w.includes('"runArgs" (--network=host) is ignored: docker run arguments')
    ),
    config.warnings.join("\n"),
  );
  assert.ok(config.warnings.some((w) => w.includes("docker.sock")), config.warnings.join("\n"));
  assert.ok(
    config.warnings.some((w) =>
      w.includes('"initializeCommand" is ignored: it would run on the host')
    ),
  );
  assert.deepEqual(config.buildConfig, { build: { dockerfile: "Dockerfile" } });
});

Deno.test("paths that leave the repository, symbolic links and uncommitted files are refused", async (t) => {
  await t.step("a build context above the repository", async () => {
    const issues = await issuesOf(readWith({
      ".devcontainer/devcontainer.json":
        `{"build": {"dockerfile": "Dockerfile", "context": "../.."}}`,
      ".devcontainer/Dockerfile": "FROM x\n",
    }));
    assert.ok(
      issues.some((i) => /^build\.context: "\.\.\/\.\." leaves the repository/.test(i)),
      issues.join("\n"),
    );
  });
  await t.step("a local feature above the repository", async () => {
    const issues = await issuesOf(
      readWith({
        ".devcontainer/devcontainer.json": `{"image": "x", "features": {"../../../etc": {}}}`,
      }),
    );
    assert.ok(issues.some((i) => /leaves the repository/.test(i)), issues.join("\n"));
  });
  await t.step("a Dockerfile that is a symbolic link to a host file", async () => {
    const issues = await issuesOf(readWith({
      ".devcontainer/devcontainer.json": `{"build": {"dockerfile": "Dockerfile"}}`,
      ".devcontainer/Dockerfile": "->/etc/passwd",
    }));
    assert.ok(issues.some((i) => /is a symbolic link/.test(i)), issues.join("\n"));
  });
  await t.step("a local feature holding a symbolic link", async () => {
    const issues = await issuesOf(readWith({
      ".devcontainer/devcontainer.json": `{"image": "x", "features": {"./f": {}}}`,
      ".devcontainer/f/devcontainer-feature.json": `{"id": "f"}`,
      ".devcontainer/f/install.sh": "->/root/.ssh/id_rsa",
    }));
    assert.ok(
      issues.some((i) => /holds a symbolic link \(".devcontainer\/f\/install.sh"\)/.test(i)),
      issues.join("\n"),
    );
  });
  await t.step("a local feature without install.sh", async () => {
    const issues = await issuesOf(readWith({
      ".devcontainer/devcontainer.json": `{"image": "x", "features": {"./f": {}}}`,
      ".devcontainer/f/devcontainer-feature.json": `{"id": "f"}`,
    }));
    assert.ok(issues.some((i) => /has no install\.sh/.test(i)), issues.join("\n"));
  });
  await t.step("a configuration that exists only in the working tree", async () => {
    await using dir = await tempDir();
    const repo = await repoWith(dir.path, { "README.md": "x\n" });
    await Deno.mkdir(`${repo.path}/.devcontainer`);
    await Deno.writeTextFile(`${repo.path}/.devcontainer/devcontainer.json`, `{"image": "x"}`);
    await assert.rejects(
      readDevcontainerConfig(repo.path, repo.head),
      (error: SandboxError) =>
        error.code === "usage" && /No devcontainer configuration/.test(error.message) &&
        /\.devcontainer\/devcontainer\.json and \.devcontainer\.json/.test(error.detail ?? ""),
    );
  });
});

Deno.test("the profile's config and workspace_folder pick the file; Compose and system workspace folders are refused", async (t) => {
  await t.step("config and workspace_folder", async () => {
    const config = await readWith({
      "services/api/.devcontainer/devcontainer.json":
        `{"image": "api", "workspaceFolder": "/src/\${localWorkspaceFolderBasename}"}`,
      "other/dc.json": `{"image": "other"}`,
    }, { workspaceFolder: "services/api" });
    assert.equal(config.file, "services/api/.devcontainer/devcontainer.json");
    assert.equal(config.workspaceSubdir, "services/api");
    assert.equal(config.workspaceFolder, "/src/api");
    const other = await readWith({ "other/dc.json": `{"image": "other"}` }, {
      config: "other/dc.json",
    });
    assert.deepEqual(other.source, { kind: "image", image: "other" });
  });
  await t.step("dockerComposeFile", async () => {
    const issues = await issuesOf(
      readWith({ ".devcontainer.json": `{"dockerComposeFile": "compose.yml", "service": "app"}` }),
    );
    assert.ok(
      issues.some((i) =>
        /^dockerComposeFile: Docker Compose devcontainers are not supported/.test(i)
      ),
      issues.join("\n"),
    );
  });
  await t.step("a workspace folder on a system folder", async () => {
    const issues = await issuesOf(
      readWith({ ".devcontainer.json": `{"image": "x", "workspaceFolder": "/usr"}` }),
    );
    assert.ok(
      issues.some((i) => /^workspaceFolder: "\/usr" is a system folder/.test(i)),
      issues.join("\n"),
    );
  });
  await t.step("a malformed lifecycle command and JSON syntax errors", async () => {
    const issues = await issuesOf(
      readWith({ ".devcontainer.json": `{"image": "x", "postCreateCommand": 42}` }),
    );
    assert.ok(
      issues.some((i) => /^postCreateCommand: expected a command string/.test(i)),
      issues.join("\n"),
    );
    const syntax = await issuesOf(readWith({ ".devcontainer.json": `{"image": }` }));
    assert.match(syntax[0], /JSONC syntax at line 1, column 11: ValueExpected/);
  });
});

Deno.test("normalizeRelative() resolves inside the repository and refuses what leaves it", () => {
  assert.equal(normalizeRelative(".devcontainer", "."), ".devcontainer");
  assert.equal(normalizeRelative(".devcontainer", ".."), "");
  assert.equal(normalizeRelative(".devcontainer", "../docker/Dockerfile"), "docker/Dockerfile");
  assert.equal(normalizeRelative(".devcontainer", "../.."), undefined);
  assert.equal(normalizeRelative("", "/etc"), undefined);
});

/** A configuration value for the run-time tests. */
function configOf(entry: DevcontainerConfig["entry"]): DevcontainerConfig {
  return {
    repoPath: "/src/proj",
    base: "0".repeat(40),
    file: ".devcontainer/devcontainer.json",
    workspaceSubdir: "",
    workspaceFolder: "/workspaces/proj",
    source: { kind: "image", image: "x" },
    localFeatures: [],
    remoteFeatures: [],
    buildConfig: {},
    entry,
    warnings: [],
  };
}

Deno.test("root is refused unless the profile allows it, and then it runs as the unprivileged sandbox user", () => {
  for (const user of ["root", "0"]) {
    assert.throws(
      () => userFor(configOf({ remoteUser: user }), [], "", false),
      (error: SandboxError) =>
        error.code === "config_invalid" && /asks to run as root/.test(error.message) &&
        /allow_root/.test(error.detail ?? ""),
    );
  }
  assert.throws(
    () => userFor(configOf({}), [{ remoteUser: "root" }], "", false),
    /asks to run as root/,
  );
  assert.equal(userFor(configOf({ remoteUser: "root" }), [], "", true), undefined);
  const runtime = resolveRuntime(configOf({ remoteUser: "root" }), {
    metadata: [],
    env: {},
    volumes: [],
  }, { allowRoot: true });
  assert.equal(runtime.user, undefined);
  assert.ok(
    runtime.warnings.some((w) =>
      /runs as the unprivileged sandbox user \(uid 10001, no capabilities\)/.test(w)
    ),
  );
});

Deno.test("the user is remoteUser, else containerUser, else the image's non-root USER, else the sandbox's own", () => {
  assert.equal(
    userFor(configOf({ remoteUser: "dev", containerUser: "other" }), [], "", false),
    "dev",
  );
  assert.equal(userFor(configOf({ containerUser: "other" }), [], "", false), "other");
  assert.equal(userFor(configOf({}), [{ remoteUser: "vscode" }], "", false), "vscode");
  assert.equal(userFor(configOf({}), [], "node:node", false), "node");
  assert.equal(userFor(configOf({}), [], "root", false), undefined);
  assert.equal(userFor(configOf({}), [], "", false), undefined);
});

Deno.test("run-time settings merge the image's metadata with the configuration; what the sandbox sets stays its own", () => {
  const runtime = resolveRuntime(
    configOf({
      containerEnv: { A: "a", HOME: "/root", HTTPS_PROXY: "http://evil" },
      remoteEnv: { PATH: "${containerEnv:PATH}:/extra", GONE: null, FROM_A: "${containerEnv:A}" },
      postCreateCommand: "make setup",
      onCreateCommand: ["echo", "config"],
    }),
    {
      metadata: [
        {
          id: "ghcr.io/x/docker-in-docker:2",
          privileged: true,
          mounts: [{ source: "dind", target: "/var/lib/docker", type: "volume" }],
          onCreateCommand: "feature-setup",
          remoteEnv: { GONE: "x" },
        },
        { remoteUser: "vscode" },
      ],
      env: { PATH: "/usr/bin" },
      volumes: ["/data"],
    },
    { allowRoot: false },
  );
  assert.equal(runtime.user, "vscode");
  assert.deepEqual(runtime.env, { A: "a", PATH: "/usr/bin:/extra", FROM_A: "a" });
  assert.deepEqual(runtime.lifecycle.map((s) => [s.hook, s.source, s.command]), [
    ["onCreateCommand", 'feature "ghcr.io/x/docker-in-docker:2"', "feature-setup"],
    ["onCreateCommand", "devcontainer.json", ["echo", "config"]],
    ["postCreateCommand", "devcontainer.json", "make setup"],
  ]);
  const text = runtime.warnings.join("\n");
  assert.match(text, /feature "ghcr\.io\/x\/docker-in-docker:2": "privileged" is ignored/);
  assert.match(text, /feature "ghcr\.io\/x\/docker-in-docker:2": "mounts" is ignored/);
  assert.match(text, /"HOME" is ignored: the sandbox sets it/);
  assert.match(text, /"HTTPS_PROXY" is ignored: the sandbox sets it/);
  assert.match(text, /VOLUME \/data gets an anonymous Docker volume/);
});

/** A provider that records commands and answers from a script. */
class FakeProvider {
  readonly calls: { argv: readonly string[]; options: ExecOptions }[] = [];
  constructor(
    readonly answer: (
      argv: readonly string[],
    ) => { exitCode: number; stdout?: string; stderr?: string },
  ) {}

  exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    this.calls.push({ argv, options });
    const { exitCode, stdout = "", stderr = "" } = this.answer(argv);
    return Promise.resolve({
      exitCode,
      stdout,
      stderr,
      durationMs: 1,
      timedOut: false,
      oomKilled: false,
    });
  }

  execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
    this.calls.push({ argv, options });
    const { exitCode, stdout = "", stderr = "" } = this.answer(argv);
    for (const line of stderr.split("\n").filter(Boolean)) options.onStderrLine?.(line);
    const lines = stdout.split("\n").filter(Boolean);
    return {
      async *[Symbol.asyncIterator]() {
        yield* lines;
      },
      outcome: Promise.resolve({
        exitCode,
        durationMs: 1,
        timedOut: false,
        oomKilled: false,
        stderrTail: stderr,
      }),
    };
  }
}

Deno.test("lifecycle commands: a string runs in a shell, an array as argv, an object's commands all run; output goes to progress", async () => {
  const provider = new FakeProvider((argv) => ({
    exitCode: 0,
    stdout: `out of ${argv.at(-1)}`,
    stderr: "a warning",
  }));
  const progress: string[] = [];
  await runLifecycle(provider as unknown as SandboxProvider, [
    { hook: "onCreateCommand", source: "devcontainer.json", command: "make deps" },
    { hook: "postCreateCommand", source: 'feature "f"', command: ["npm", "ci"] },
    {
      hook: "postStartCommand",
      source: "devcontainer.json",
      command: { a: "echo a", b: ["echo", "b"] },
    },
  ], {
    cwd: "/workspaces/proj",
    env: { HTTP_PROXY: "http://p" },
    timeoutMs: 1000,
    onProgress: (l) => progress.push(l),
  });
  assert.deepEqual(provider.calls.map((c) => c.argv), [
    ["/bin/sh", "-c", "make deps"],
    ["npm", "ci"],
    ["/bin/sh", "-c", "echo a"],
    ["echo", "b"],
  ]);
  assert.ok(provider.calls.every((c) => c.options.cwd === "/workspaces/proj"));
  assert.ok(progress.includes("onCreateCommand: out of make deps"), progress.join("\n"));
  assert.ok(progress.includes("onCreateCommand: a warning"), progress.join("\n"));
  assert.ok(
    progress.includes('postCreateCommand: running "[\\"npm\\",\\"ci\\"]" (from feature "f")'),
    progress.join("\n"),
  );
  assert.ok(progress.includes("postStartCommand.b: out of b"), progress.join("\n"));
});

Deno.test("a failing lifecycle command is an error naming the command, and later commands do not run", async () => {
  const provider = new FakeProvider((argv) => ({ exitCode: argv.includes("exit 3") ? 3 : 0 }));
  await assert.rejects(
    runLifecycle(provider as unknown as SandboxProvider, [
      { hook: "onCreateCommand", source: "devcontainer.json", command: "exit 3" },
      { hook: "postCreateCommand", source: "devcontainer.json", command: "never" },
    ], { cwd: "/w", env: {}, timeoutMs: 1000 }),
    (error: SandboxError) =>
      error.code === "exec_failed" &&
      error.message === 'Devcontainer onCreateCommand failed: "exit 3" exited with code 3',
  );
  assert.equal(provider.calls.length, 1);
});

Deno.test("prepareWorkspace() links the workspace folder to the run's folder and gives lifecycle commands only the egress proxy", async () => {
  const provider = new FakeProvider((argv) =>
    argv[0] === "sh" ? { exitCode: 0, stdout: `${argv.at(-1)}\n` } : { exitCode: 0 }
  );
  const cwd = await prepareWorkspace(provider as unknown as SandboxProvider, {
    worktree: "/workspace/worktrees/r1",
    subdir: "services/api",
    workspaceFolder: "/workspaces/api",
    lifecycle: [{ hook: "postCreateCommand", source: "devcontainer.json", command: "env" }],
    env: {
      HTTP_PROXY: "http://gw:1",
      https_proxy: "http://gw:1",
      NO_PROXY: "gw",
      SANDBOX_LLM_TOKEN: "tok",
      OPENAI_API_KEY: "tok",
    },
    timeoutMs: 1000,
  });
  assert.equal(cwd, "/workspaces/api");
  assert.deepEqual(provider.calls[0].argv.slice(-3), [
    "/workspace/worktrees/r1/services/api",
    WORKSPACE_LINK,
    "/workspaces/api",
  ]);
  assert.deepEqual(provider.calls[1].options.env, {
    HTTP_PROXY: "http://gw:1",
    https_proxy: "http://gw:1",
    NO_PROXY: "gw",
  });
  assert.equal(provider.calls[1].options.cwd, "/workspaces/api");
});
