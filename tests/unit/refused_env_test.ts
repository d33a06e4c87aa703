/**
 * Environment variables no configuration may set in a sandbox (lib/refused_env.ts): those that
 * change how the loader, a shell, git or an interpreter starts. Refused with a warning naming the
 * key, never applied — from a devcontainer.json and from a profile alike; an ordinary variable
 * beside them is kept.
 */
import assert from "node:assert/strict";
import { REFUSED_ENV, refusedEnvReason, withoutRefusedEnv } from "../../lib/refused_env.ts";
import { resolveRuntime } from "../../lib/sandbox/devcontainer/runtime.ts";
import type { DevcontainerConfig } from "../../lib/sandbox/devcontainer/config.ts";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";

const REFUSED = [
  "LD_PRELOAD",
  "LD_LIBRARY_PATH",
  "LD_AUDIT",
  "GCONV_PATH",
  "GLIBC_TUNABLES",
  "MALLOC_CHECK_",
  "LOCPATH",
  "PERL5OPT",
  "PERL5DB",
  "PERL5LIB",
  "PERLLIB",
  "PERLIO",
  "NODE_OPTIONS",
  "NODE_PATH",
  "NODE_EXTRA_CA_CERTS",
  "BUN_OPTIONS",
  "DENO_DIR",
  "DENO_CERT",
  "BASH_ENV",
  "ENV",
  "SHELLOPTS",
  "PS4",
  "CDPATH",
  "GIT_CONFIG_COUNT",
  "GIT_CONFIG_KEY_0",
  "GIT_EXEC_PATH",
  "GIT_SSH_COMMAND",
  "GIT_DIR",
  "XDG_CONFIG_HOME",
  "PYTHONSTARTUP",
  "RUBYOPT",
  "JAVA_TOOL_OPTIONS",
  "_JAVA_OPTIONS",
  "JDK_JAVA_OPTIONS",
];
const KEPT = [
  "PATH",
  "GREETING",
  "NODE_ENV",
  "PYTHONPATH",
  "RUBYLIB",
  "CLASSPATH",
  "LANG",
  "EDITOR",
  "GOPATH",
  "ENVIRONMENT",
  "LD",
];

Deno.test("names that change how the loader, a shell, git or an interpreter starts are refused; ordinary ones are not", () => {
  for (const name of REFUSED) assert.ok(refusedEnvReason(name), `${name} is not refused`);
  for (const name of KEPT) assert.equal(refusedEnvReason(name), undefined, `${name} is refused`);
  assert.match(refusedEnvReason("PERL5OPT")!, /^it changes how perl starts/);
  assert.match(refusedEnvReason("LD_PRELOAD")!, /dynamic loader/);
  // Every rule says what it changes.
  for (const rule of REFUSED_ENV) assert.ok(rule.changes.length > 10 && rule.names.length > 0);
});

Deno.test("withoutRefusedEnv() keeps the ordinary variables and names each refused one where it was set", () => {
  const { env, warnings } = withoutRefusedEnv({
    GREETING: "hi",
    LD_PRELOAD: "/x.so",
    PERL5OPT: "-d",
  }, (n) => `here "${n}"`);
  assert.deepEqual(env, { GREETING: "hi" });
  assert.deepEqual(warnings, [
    'here "LD_PRELOAD" is refused and not set: it changes the dynamic loader (libraries loaded into every process)',
    'here "PERL5OPT" is refused and not set: it changes how perl starts (options, modules, debugger, I/O layers)',
  ]);
});

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
  } as DevcontainerConfig;
}

Deno.test("a devcontainer's containerEnv and remoteEnv lose the refused names, each named once in a warning; the rest is set", () => {
  const runtime = resolveRuntime(
    configOf({
      containerEnv: {
        PERL5OPT: "-d",
        PERL5DB: "BEGIN { system 'id' }",
        LD_PRELOAD: "/workspace/x.so",
        GREETING: "hello",
      },
      remoteEnv: {
        NODE_OPTIONS: "--require /workspace/x.js",
        BASH_ENV: null,
        FROM: "${containerEnv:GREETING}",
      },
    }),
    { metadata: [{ id: "feature", remoteEnv: { GIT_CONFIG_COUNT: "1" } }], env: {}, volumes: [] },
    { allowRoot: false },
  );
  assert.deepEqual(runtime.env, { GREETING: "hello", FROM: "hello" });
  const refused = runtime.warnings.filter((w) => w.includes("is refused"));
  assert.deepEqual(refused.map((w) => w.split(" is refused")[0]).sort(), [
    'devcontainer.json: "containerEnv.LD_PRELOAD"',
    'devcontainer.json: "containerEnv.PERL5DB"',
    'devcontainer.json: "containerEnv.PERL5OPT"',
    'devcontainer.json: "remoteEnv.GIT_CONFIG_COUNT"',
    'devcontainer.json: "remoteEnv.NODE_OPTIONS"',
  ]);
  // Unsetting one (null) sets nothing: no warning.
  assert.ok(!runtime.warnings.some((w) => w.includes("BASH_ENV")));
});

Deno.test("a profile's environment.set and passthrough lose the refused names, named by their key; the container never gets them", () => {
  const parsed = parseConfig(
    "profiles:\n  work:\n    sandbox:\n      environment:\n        set: {LD_PRELOAD: /x.so, GREETING: hello, NODE_OPTIONS: --inspect}\n        passthrough: [PERL5LIB, TERM]\n",
  );
  assert.equal(parsed.kind, "ok");
  if (parsed.kind !== "ok") return;
  const profile = resolveProfile(parsed.config, "work");
  assert.deepEqual(profile.sandbox.environment.set, { GREETING: "hello" });
  assert.deepEqual(profile.sandbox.environment.passthrough, ["TERM"]);
  assert.deepEqual(profile.warnings, [
    "profiles.work.sandbox.environment.set.LD_PRELOAD is refused and not set: it changes the dynamic loader (libraries loaded into every process)",
    "profiles.work.sandbox.environment.set.NODE_OPTIONS is refused and not set: it changes how node starts (options, modules, certificates)",
    'profiles.work.sandbox.environment.passthrough "PERL5LIB" is refused and not passed: it changes how perl starts (options, modules, debugger, I/O layers)',
  ]);
  // A profile made another way (a library caller's) loses them where the container is made.
  const raw = {
    ...profile,
    sandbox: {
      ...profile.sandbox,
      environment: {
        set: { LD_PRELOAD: "/x.so", GREETING: "hi" },
        passthrough: ["PERL5LIB", "TERM"],
      },
    },
  };
  const provider = new DockerSandboxProvider(raw, {
    hostEnv: (name) => ({ PERL5LIB: "/evil", TERM: "xterm" })[name],
  });
  assert.deepEqual(provider.containerEnv(), { TERM: "xterm", GREETING: "hi" });
  // A profile without refused names has no warnings.
  assert.equal(resolveProfile(parsed.config, "default").warnings, undefined);
});
