/**
 * The secret guard: no value entering a sandbox (container or exec environment, exec argv, files the
 * tool writes) may contain a secret this process knows, whatever the variable is called. Each
 * boundary is driven the way a caller would, with a fake docker that records what would have run.
 */
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { SandboxError } from "../../lib/errors.ts";
import { KeyStore } from "../../lib/keys.ts";
import {
  assertNoSecrets,
  isSecretName,
  knownSecrets,
  registerSecret,
  secretNameRules,
} from "../../lib/secret_guard.ts";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import { HostProvider } from "../../lib/sandbox/host_provider.ts";
import { tempDir } from "../_helpers.ts";
import { fakeDocker } from "./_fake_docker.ts";

/** A fresh secret value, unique to one test. */
function freshSecret(): string {
  return `sk-guard-${crypto.randomUUID().replaceAll("-", "")}`;
}

/** Asserts a refusal: a config error naming `where`, never containing `secret`. */
function refusedNaming(where: RegExp, secret: string) {
  return (error: unknown) => {
    assert.ok(error instanceof SandboxError, `not a SandboxError: ${error}`);
    assert.equal(error.code, "config_invalid");
    assert.match(error.message, where);
    assert.ok(
      !error.message.includes(secret) && !(error.detail ?? "").includes(secret),
      "the secret is in the error",
    );
    return true;
  };
}

function profile(yaml = "profiles: {work: {}}") {
  const result = parseConfig(yaml, undefined, () => undefined);
  if (result.kind !== "ok") throw new Error(JSON.stringify(result.issues));
  return resolveProfile(result.config, "work");
}

// Each rule of the secret-name pattern on its own: every name below matches exactly one rule, so
// dropping any rule (or any exact name) fails this test. SSH_AUTH_SOCK also matches AUTH; its own
// exact rule is asserted by the rule list, and AUTH is asserted alone by MY_AUTH.
const ONE_RULE_NAMES: [name: string, rules: string[]][] = [
  ["MY_KEY", ["KEY"]],
  ["MY_TOKEN", ["TOKEN"]],
  ["MY_SECRET", ["SECRET"]],
  ["MY_PASSWORD", ["PASSWORD"]],
  ["MY_PASSWD", ["PASSWD"]],
  ["MY_PASSPHRASE", ["PASSPHRASE"]],
  ["MY_CREDENTIAL", ["CREDENTIAL"]],
  ["MY_PRIVATE", ["PRIVATE"]],
  ["MY_AUTH", ["AUTH"]],
  ["MY_SESSION", ["SESSION"]],
  ["MY_COOKIE", ["COOKIE"]],
  ["SENTRY_DSN", ["DSN"]],
  ["DATABASE_URL", ["DATABASE_URL"]],
  ["SSH_AUTH_SOCK", ["AUTH", "SSH_AUTH_SOCK"]],
  ["DOCKER_HOST", ["DOCKER_HOST"]],
  ["KUBECONFIG", ["KUBECONFIG"]],
  ["NETRC", ["NETRC"]],
];

for (const [name, rules] of ONE_RULE_NAMES) {
  Deno.test(`the secret-name pattern refuses ${name} by the ${rules.join(" and ")} rule`, () => {
    assert.deepEqual(secretNameRules(name), rules);
    assert.equal(isSecretName(name), true);
    assert.equal(isSecretName(name.toLowerCase()), true, "case-insensitive");
  });
}

Deno.test("the secret-name pattern lets ordinary names through", () => {
  for (
    const name of [
      "TERM",
      "LANG",
      "NODE_ENV",
      "PATH",
      "NOTES",
      "MY_DOCKER",
      "HOST",
      "DOCKER_HOSTNAME_X",
    ]
  ) {
    assert.deepEqual(secretNameRules(name), [], name);
  }
});

Deno.test("a value holding a host variable's secret is refused under an innocent name, naming the variable, never the value", () => {
  const secret = freshSecret();
  const secrets = knownSecrets({ OPENAI_API_KEY: secret, NOTES_SOURCE: "harmless-value" });
  assert.throws(
    () =>
      assertNoSecrets('sandbox "s"', {
        env: { NOTES: `prefix ${secret} suffix` },
        envKind: "exec environment",
      }, secrets),
    refusedNaming(
      /exec environment variable "NOTES" contains the value of environment variable "OPENAI_API_KEY"/,
      secret,
    ),
  );
  assert.throws(
    () =>
      assertNoSecrets('sandbox "s"', { argv: ["curl", "-H", `Authorization: ${secret}`] }, secrets),
    refusedNaming(/argv\[2\] of the command/, secret),
  );
  assert.throws(
    () =>
      assertNoSecrets('sandbox "s"', {
        file: { path: "/tmp/p", data: new TextEncoder().encode(secret) },
      }, secrets),
    refusedNaming(/file "\/tmp\/p"/, secret),
  );
  // The twin: the same places with an innocent value pass.
  assertNoSecrets('sandbox "s"', {
    env: { NOTES: "harmless-value" },
    argv: ["echo", "hello world"],
    file: { path: "/p", data: "text" },
  }, secrets);
});

Deno.test("values shorter than 8 characters are not treated as secrets", () => {
  const secrets = knownSecrets({ MY_TOKEN: "1234567", MY_KEY: "12345678" });
  assert.deepEqual(secrets.map((s) => s.source), ['environment variable "MY_KEY"']);
  assertNoSecrets("x", { env: { A: "1234567" } }, secrets);
  assert.throws(() => assertNoSecrets("x", { env: { A: "12345678" } }, secrets), SandboxError);
});

Deno.test("a key resolved by KeyStore is refused at the boundary even from a variable with an innocent name", async () => {
  const secret = freshSecret();
  const keys = new KeyStore({ env: (name) => (name === "INNOCENT_NAME" ? secret : undefined) });
  // Not known before it is resolved (the name does not look secret and is not in this process's env)…
  assertNoSecrets("x", { env: { NOTES: secret } }, knownSecrets({}));
  await keys.resolve({ env: "INNOCENT_NAME" });
  // …and refused everywhere once it is.
  assert.throws(
    () => assertNoSecrets("x", { env: { NOTES: secret } }, knownSecrets({})),
    refusedNaming(
      /contains the value of the key from environment variable "INNOCENT_NAME"/,
      secret,
    ),
  );
});

Deno.test("docker exec with a secret in its environment or argv is refused before docker runs", async () => {
  const secret = freshSecret();
  registerSecret(secret, "the test key");
  await using docker = await fakeDocker(`[ "$1" = exec ] && cat`);
  const provider = new DockerSandboxProvider(profile(), { docker: docker.program });
  await assert.rejects(
    provider.exec(["true"], { env: { NOTES: secret } }),
    refusedNaming(
      /sandbox "sandbox-work": exec environment variable "NOTES" contains the value of the test key/,
      secret,
    ),
  );
  assert.throws(
    () => provider.execStream(["echo", secret]),
    refusedNaming(/argv\[1\] of the command/, secret),
  );
  await assert.rejects(
    provider.writeFile("/tmp/prompt", `please use ${secret}`),
    refusedNaming(/file "\/tmp\/prompt"/, secret),
  );
  assert.deepEqual(await docker.calls(), [], "docker was called with the secret");
  // The twin: the same exec with an innocent value reaches docker.
  await provider.exec(["true"], { env: { NOTES: "harmless-value" } });
  const [call] = await docker.callsStartingWith("exec");
  // By name: the value travels in the docker client's environment, not its argv.
  assert.ok(call.includes("SANDBOX_EXEC_ENV_NOTES"), call.join(" "));
  assert.equal((await docker.environments())[0].SANDBOX_EXEC_ENV_NOTES, "harmless-value");
});

Deno.test("a container whose passthrough variable holds a secret is refused before docker run", async () => {
  const secret = freshSecret();
  registerSecret(secret, "the test key");
  const work = profile("profiles: {work: {sandbox: {environment: {passthrough: [NOTES]}}}}");
  await using docker = await fakeDocker("");
  const hostEnv = (value: string) => (name: string) => name === "NOTES" ? value : undefined;
  const provider = new DockerSandboxProvider(work, {
    docker: docker.program,
    hostEnv: hostEnv(`x${secret}`),
  });
  await assert.rejects(
    provider.ensureRunning(),
    refusedNaming(/container environment variable "NOTES"/, secret),
  );
  assert.deepEqual(await docker.calls(), []);
  const innocent = new DockerSandboxProvider(work, {
    docker: docker.program,
    hostEnv: hostEnv("harmless-value"),
  });
  const innocentRun = await innocent.runArgs();
  assert.ok(innocentRun.args.includes("NOTES"), innocentRun.args.join(" "));
  assert.equal(innocentRun.env.NOTES, "harmless-value");
});

Deno.test("sandbox mode none refuses a secret in the host command's environment or argv before it runs", async () => {
  const secret = freshSecret();
  registerSecret(secret, "the test key");
  await using dir = await tempDir();
  const marker = `${dir.path}/ran`;
  const host = new HostProvider("work");
  await assert.rejects(
    host.exec(["touch", marker], { env: { NOTES: secret } }),
    refusedNaming(/the host process \(sandbox mode none\): environment variable "NOTES"/, secret),
  );
  await assert.rejects(host.exec(["touch", marker, secret]), refusedNaming(/argv\[2\]/, secret));
  await assert.rejects(host.writeFile(`${dir.path}/prompt`, secret), refusedNaming(/file/, secret));
  assert.equal(await Deno.stat(marker).then(() => true, () => false), false, "the command ran");
  // The twin.
  const ran = await host.exec(["touch", marker], { env: { NOTES: "harmless-value" } });
  assert.equal(ran.exitCode, 0);
  assert.ok((await Deno.stat(marker)).isFile);
});
