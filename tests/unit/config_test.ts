import assert from "node:assert/strict";
import {
  findConfigFile,
  isSecretName,
  loadConfig,
  parseConfig,
  resolveProfile,
} from "../../lib/config.ts";
import { ConfigError, SandboxError } from "../../lib/errors.ts";
import { parseDuration, parseSize } from "../../lib/units.ts";
import { tempDir } from "../_helpers.ts";

const noEnv = () => undefined;

function issuesOf(yaml: string, env: (n: string) => string | undefined = noEnv) {
  const result = parseConfig(yaml, "test.yaml", env);
  assert.equal(result.kind, "invalid", `expected invalid config: ${yaml}`);
  return result.kind === "invalid" ? result.issues.map((i) => `${i.path}: ${i.message}`) : [];
}

Deno.test("an empty configuration yields a working default profile", () => {
  const result = parseConfig("", undefined, noEnv);
  assert.equal(result.kind, "ok");
  if (result.kind !== "ok") return;
  const profile = resolveProfile(result.config);
  assert.equal(profile.name, "default");
  assert.equal(profile.sandbox.mode, "container");
  assert.equal(profile.sandbox.network.mode, "allowlist");
  assert.equal(profile.sandbox.container, "shared");
  assert.equal(profile.resources.memoryBytes, 4 * 1024 ** 3);
  assert.equal(profile.resources.pids, 512);
  assert.equal(profile.resources.timeoutMs, 30 * 60_000);
});

Deno.test("validation errors name the path of the offending value", () => {
  assert.deepEqual(
    issuesOf("profiles:\n  work:\n    sandbox:\n      resources:\n        memory: lots\n"),
    ['profiles.work.sandbox.resources.memory: expected a size like "4g"'],
  );
  assert.deepEqual(
    issuesOf(
      "profiles:\n  work:\n    sandbox:\n      network:\n        allow: ['ok.com', 'bad domain']\n",
    ),
    ['profiles.work.sandbox.network.allow[1]: expected a domain like "example.com", "*.example.com" or "example.com:8443"'],
  );
  assert.deepEqual(
    issuesOf("profiles:\n  work:\n    sandbox:\n      mode: vm\n"),
    ['profiles.work.sandbox.mode: expected one of "none", "container", "devcontainer"'],
  );
  assert.deepEqual(
    issuesOf("profiles:\n  work:\n    sandbox:\n      resources:\n        timeout: soon\n"),
    ['profiles.work.sandbox.resources.timeout: expected a duration like "30m", "90s" or "1h"'],
  );
});

Deno.test("unknown keys are rejected at every level", () => {
  assert.deepEqual(issuesOf("profile: {}\n"), [': unknown key "profile"']);
  assert.deepEqual(
    issuesOf("profiles:\n  work:\n    sandbox:\n      resources:\n        memroy: 4g\n"),
    ['profiles.work.sandbox.resources: unknown key "memroy"'],
  );
});

Deno.test("every problem is reported, not just the first", () => {
  const issues = issuesOf(
    "profiles:\n  a:\n    sandbox:\n      resources: {memory: x, pids: 2}\n      network: {mode: open}\n",
  );
  assert.equal(issues.length, 3, issues.join("\n"));
});

Deno.test("${VAR} interpolation substitutes, falls back, escapes, and reports unset variables", () => {
  const env = (name: string) => ({ MEM: "2g", IMAGE: "debian:12" } as Record<string, string>)[name];
  const result = parseConfig(
    "profiles:\n  w:\n    description: cost $${HOME}\n    sandbox:\n      image: ${IMAGE}\n      resources: {memory: '${MEM}', disk: '${DISK:-5g}'}\n",
    undefined,
    env,
  );
  assert.equal(result.kind, "ok", JSON.stringify(result));
  if (result.kind !== "ok") return;
  const profile = resolveProfile(result.config, "w");
  assert.equal(profile.sandbox.image, "debian:12");
  assert.equal(profile.resources.memoryBytes, 2 * 1024 ** 3);
  assert.equal(profile.resources.diskBytes, 5 * 1024 ** 3);
  assert.equal(profile.description, "cost ${HOME}");
  assert.deepEqual(
    issuesOf("profiles:\n  w:\n    sandbox:\n      image: ${NOPE}\n"),
    ['profiles.w.sandbox.image: environment variable "NOPE" is not set (use ${NOPE:-default} for a fallback)'],
  );
});

Deno.test("secret-looking variables can be neither passed through nor set", () => {
  const issues = issuesOf(
    "profiles:\n  w:\n    sandbox:\n      environment:\n        passthrough: [TERM, OPENAI_API_KEY]\n        set: {GITHUB_TOKEN: x, OK: y}\n",
  );
  assert.equal(issues.length, 2, issues.join("\n"));
  assert.match(
    issues[0],
    /^profiles\.w\.sandbox\.environment\.passthrough\[1\]: looks like a secret/,
  );
  assert.match(
    issues[1],
    /^profiles\.w\.sandbox\.environment\.set\.GITHUB_TOKEN: looks like a secret/,
  );
  for (
    const name of [
      "AWS_SECRET_ACCESS_KEY",
      "DATABASE_URL",
      "SSH_AUTH_SOCK",
      "ANTHROPIC_API_KEY",
      "db_password",
    ]
  ) {
    assert.ok(isSecretName(name), name);
  }
  for (const name of ["TERM", "LANG", "NODE_ENV", "PATH"]) assert.ok(!isSecretName(name), name);
});

Deno.test("YAML syntax errors are reported, not thrown", () => {
  const issues = issuesOf("profiles: [unclosed\n");
  assert.match(issues[0], /YAML syntax/);
});

Deno.test("an unknown profile is a usage error listing the defined ones", () => {
  const result = parseConfig("profiles: {work: {}}", undefined, noEnv);
  assert.equal(result.kind, "ok");
  if (result.kind !== "ok") return;
  assert.throws(() => resolveProfile(result.config, "nope"), (error: unknown) => {
    assert.ok(error instanceof SandboxError);
    assert.equal(error.code, "usage");
    assert.equal(error.detail, "Defined profiles: default, work");
    return true;
  });
  assert.equal(resolveProfile(result.config, "work").name, "work");
});

Deno.test("default_profile must name a defined profile", () => {
  assert.deepEqual(issuesOf("default_profile: work\nprofiles: {}\n"), [
    'default_profile: no profile named "work"',
  ]);
});

Deno.test("an explicitly named file that is missing or invalid never falls back to defaults", async () => {
  await using dir = await tempDir();
  const missing = await loadConfig({ explicit: `${dir.path}/missing.yaml` });
  assert.equal(missing.kind, "invalid");
  await Deno.writeTextFile(`${dir.path}/bad.yaml`, "profiles: {w: {sandbox: {mode: vm}}}");
  const bad = await loadConfig({ explicit: `${dir.path}/bad.yaml` });
  assert.equal(bad.kind, "invalid");
  assert.equal(bad.file, `${dir.path}/bad.yaml`);
  const error = new ConfigError(bad.file, bad.kind === "invalid" ? bad.issues : []);
  assert.equal(error.code, "config_invalid");
  assert.match(error.detail ?? "", /profiles\.w\.sandbox\.mode/);
});

Deno.test("the config file is found in the current directory, then the repository root", async () => {
  await using dir = await tempDir();
  const repo = dir.path;
  await Deno.mkdir(`${repo}/.git`);
  await Deno.mkdir(`${repo}/sub/deeper`, { recursive: true });
  await Deno.writeTextFile(`${repo}/sandbox.yaml`, "profiles: {}");
  const previous = Deno.env.get("SANDBOX_CONFIG");
  Deno.env.delete("SANDBOX_CONFIG");
  try {
    assert.equal(await findConfigFile({ cwd: `${repo}/sub/deeper` }), `${repo}/sandbox.yaml`);
    await Deno.writeTextFile(`${repo}/sub/deeper/sandbox.yaml`, "profiles: {}");
    assert.equal(
      await findConfigFile({ cwd: `${repo}/sub/deeper` }),
      `${repo}/sub/deeper/sandbox.yaml`,
    );
    assert.equal(await findConfigFile({ cwd: repo, explicit: "/x.yaml" }), "/x.yaml");
  } finally {
    if (previous !== undefined) Deno.env.set("SANDBOX_CONFIG", previous);
  }
});

Deno.test("sizes and durations parse in the units people write", () => {
  assert.equal(parseSize("4g"), 4 * 1024 ** 3);
  assert.equal(parseSize("512m"), 512 * 1024 ** 2);
  assert.equal(parseSize("1.5GB"), 1.5 * 1024 ** 3);
  assert.equal(parseSize("lots"), undefined);
  assert.equal(parseDuration("30m"), 1_800_000);
  assert.equal(parseDuration("1h30m"), 5_400_000);
  assert.equal(parseDuration("500ms"), 500);
  assert.equal(parseDuration("soon"), undefined);
});

Deno.test("network.hosts values must be IP addresses: the egress proxy never looks a mapped value up", () => {
  for (const value of ["abc", "cafe", "256.1.1.1", "1.2.3", "db.internal"]) {
    assert.deepEqual(
      issuesOf(`profiles:\n  p:\n    sandbox:\n      network:\n        hosts: {a.test: "${value}"}\n`),
      ["profiles.p.sandbox.network.hosts.a.test: expected an IP address"],
      value,
    );
  }
  for (const value of ["10.1.2.3", "255.255.255.255", "::1", "fd00::1", "::ffff:127.0.0.1"]) {
    const yaml = `profiles:\n  p:\n    sandbox:\n      network:\n        hosts: {a.test: "${value}"}\n`;
    assert.equal(parseConfig(yaml, "test.yaml", noEnv).kind, "ok", value);
  }
});
