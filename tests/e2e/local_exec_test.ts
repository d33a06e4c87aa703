/**
 * `sandbox exec` in sandbox mode local, from the CLI: the command runs in a bubblewrap sandbox
 * made for it (docs/local.md), its output, stdin and exit code passed through; the profile's
 * development workspace and home persist between commands, its /tmp does not; the user's home
 * stays out of sight; its egress goes through the host's proxy, to an allowed (mapped) name only.
 */
import assert from "node:assert/strict";
import { explain, runCli, tempDir, uniqueProfile } from "../_helpers.ts";
import { assertLocal, localTest } from "../_local.ts";

/** A config with one mode-local profile allowed to reach `allowed.test:PORT` (127.0.0.1). */
async function localConfig(dir: string, profile: string, port: number): Promise<string> {
  const config = `${dir}/sandbox.yaml`;
  await Deno.writeTextFile(
    config,
    `profiles:
  ${profile}:
    sandbox:
      mode: local
      network:
        allow: ["allowed.test:${port}"]
        hosts: {allowed.test: 127.0.0.1}
`,
  );
  return config;
}

Deno.test({
  name:
    "sandbox exec in mode local passes output, stdin and exit code through and keeps the workspace between commands",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-exec-");
    const profile = uniqueProfile("e2e-lexec");
    const config = await localConfig(dir.path, profile, 9);
    const env = { XDG_STATE_HOME: `${dir.path}/state` };
    const exec = (script: string, stdin?: string) =>
      runCli(["exec", "-p", profile, "--", "sh", "-c", script], { config, env, stdin });
    const first = await exec(
      'echo started; cat >/workspace/kept; echo home >"$HOME/h"; echo tmp >/tmp/t; ' +
        "id -u; pwd; echo oops >&2; exit 7",
      "from stdin\n",
    );
    assert.equal(first.exitCode, 7, explain(first));
    assert.equal(first.stdout, "started\n10001\n/workspace\n", explain(first));
    assert.match(first.stderr, /^oops$/m, explain(first));
    const second = await exec('cat /workspace/kept "$HOME/h"; ls -A /tmp; echo end');
    assert.equal(second.exitCode, 0, explain(second));
    assert.equal(
      second.stdout,
      "from stdin\nhome\nend\n",
      "the workspace and home are kept, /tmp is not",
    );
    const other = await runCli(["exec", "-p", profile, "--cwd", "/nonexistent", "--", "true"], {
      config,
      env,
    });
    assert.notEqual(other.exitCode, 0, explain(other));
    const repo = await runCli(["exec", "-p", profile, "--repo", dir.path, "--", "true"], {
      config,
      env,
    });
    assert.equal(repo.exitCode, 2, explain(repo));
    assert.match(repo.stderr, /^sandbox: .*--repo.*mode "local"/, explain(repo));
  },
});

Deno.test({
  name:
    "sandbox exec in mode local cannot read a file of the user's home, which the host reads (twin)",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-exec-");
    const profile = uniqueProfile("e2e-lexec");
    const config = await localConfig(dir.path, profile, 9);
    const home = Deno.env.get("HOME") ?? "/root";
    const secret = `${home}/.sandbox-lexec-secret-${crypto.randomUUID().slice(0, 8)}`;
    await Deno.writeTextFile(secret, "host secret\n");
    try {
      assert.equal(await Deno.readTextFile(secret), "host secret\n", "twin: the host reads it");
      const result = await runCli(
        // By its host path, and where the sandbox's home is (the user's must not be bound there).
        [
          "exec",
          "-p",
          profile,
          "--",
          "sh",
          "-c",
          'echo marker; cat -- "$1"; cat -- "$HOME/${1##*/}"',
          "sh",
          secret,
        ],
        { config, env: { XDG_STATE_HOME: `${dir.path}/state` } },
      );
      assert.match(result.stdout, /^marker$/m, explain(result));
      assert.doesNotMatch(result.stdout, /host secret/, explain(result));
      assert.notEqual(result.exitCode, 0, explain(result));
    } finally {
      await Deno.remove(secret);
    }
  },
});

Deno.test({
  name: "sandbox exec in mode local reaches an allowed name through the egress proxy and no other",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-exec-");
    await using server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      () => new Response("upstream says hi\n"),
    );
    const port = server.addr.port;
    const profile = uniqueProfile("e2e-lexec");
    const config = await localConfig(dir.path, profile, port);
    const curl = (url: string) =>
      runCli(["exec", "-p", profile, "--", "curl", "-sS", "--max-time", "60", url], {
        config,
        env: { XDG_STATE_HOME: `${dir.path}/state` },
      });
    const allowed = await curl(`http://allowed.test:${port}/`);
    assert.equal(allowed.exitCode, 0, explain(allowed));
    assert.equal(allowed.stdout, "upstream says hi\n");
    const direct = await curl(`http://127.0.0.1:${port}/`);
    assert.notEqual(direct.exitCode, 0, explain(direct));
    assert.doesNotMatch(direct.stdout, /upstream says hi/);
  },
});

Deno.test({
  name:
    "sandbox exec in mode local says what to enable, exit 125, where bwrap is refused user namespaces",
  ...localTest(),
  async fn() {
    assertLocal();
    await using dir = await tempDir("sandbox-e2e-local-exec-");
    const profile = uniqueProfile("e2e-lexec");
    const config = await localConfig(dir.path, profile, 9);
    await Deno.mkdir(`${dir.path}/bin`);
    await Deno.writeTextFile(
      `${dir.path}/bin/bwrap`,
      "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
      { mode: 0o755 },
    );
    const env = { XDG_STATE_HOME: `${dir.path}/state` };
    const refused = await runCli(["exec", "-p", profile, "--", "true"], {
      config,
      env: { ...env, PATH: `${dir.path}/bin:${Deno.env.get("PATH")}` },
    });
    assert.equal(refused.exitCode, 125, explain(refused));
    assert.match(
      refused.stderr,
      /needs unprivileged user namespaces.*No permissions/,
      explain(refused),
    );
    assert.match(refused.stderr, /Enable them/, explain(refused));
    const twin = await runCli(["exec", "-p", profile, "--", "true"], { config, env });
    assert.equal(twin.exitCode, 0, explain(twin));
  },
});
