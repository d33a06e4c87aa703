import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { DockerCli } from "../../lib/sandbox/docker.ts";
import {
  DockerSandboxProvider,
  parseDockerSize,
  RELAY_USER,
  SANDBOX_USER,
  sandboxRepo,
  teardownAll,
  teardownProfile,
} from "../../lib/sandbox/docker_provider.ts";
import type { SandboxError } from "../../lib/errors.ts";
import { imageTagFor } from "../../lib/sandbox/image.ts";
import { proxyMountSource } from "../../lib/sandbox/proxy_mount.ts";
import { explain, runCli, tempDir, withEnv, writeConfig } from "../_helpers.ts";
import { fakeDocker, inspectJson } from "./_fake_docker.ts";

function profileFrom(yaml: string, name: string) {
  const result = parseConfig(yaml, undefined, () => undefined);
  if (result.kind !== "ok") throw new Error(JSON.stringify(result.issues));
  return resolveProfile(result.config, name);
}

const WORK = profileFrom(
  `profiles:
  work:
    sandbox:
      resources: {memory: 2g, cpus: 1.5, pids: 256, disk: 1g}
      environment: {passthrough: [TERM, UNSET_VAR], set: {FOO: bar}}
`,
  "work",
);

/** Bash answers for a docker with nothing on it yet; after `run`, the container is running. */
function freshEngine(runningJson: string, extra = ""): string {
  return `
${extra}
case "$1 $2" in
  "container inspect")
    if called create; then cat <<'JSON'
${runningJson}
JSON
    else echo "Error: No such container: $3" >&2; exit 1; fi ;;
  "image inspect") echo '[{"Id":"sha256:base","Config":{"Labels":null}}]' ;;
  "network inspect"|"volume inspect") echo "Error: No such object: $3" >&2; exit 1 ;;
esac`;
}

async function runningJsonFor(provider: DockerSandboxProvider): Promise<string> {
  const { configHash } = await provider.runArgs();
  return inspectJson(provider.containerName, "running", provider.labels(configHash));
}

Deno.test("ensureRunning() starts the container with exactly the hardening flags and limits", async () => {
  await using state = await tempDir();
  await withEnv({
    XDG_STATE_HOME: state.path,
    DOCKER_HOST: undefined,
    DOCKER_CONTEXT: undefined,
    DOCKER_CONFIG: state.path,
  }, async () => {
    const hostEnv = (
      name: string,
    ) => (name === "TERM" ? "xterm" : name === "HOME" ? "/root" : undefined);
    const probe = new DockerSandboxProvider(WORK, { hostEnv });
    await using docker = await fakeDocker(freshEngine(await runningJsonFor(probe)));
    const provider = new DockerSandboxProvider(WORK, { docker: docker.program, hostEnv });
    const { configHash } = await provider.runArgs();
    const mountSource = await proxyMountSource("sandbox-work");
    assert.match(mountSource, /^\/tmp\/sandbox-proxy-[0-9a-f]{16}\/[0-9a-f]{12}$/);
    const status = await provider.ensureRunning();
    assert.equal(status.state, "running");
    assert.equal(status.current, true);

    const runs = await docker.callsStartingWith("create");
    assert.equal(runs.length, 1);
    const tag = await imageTagFor("sandbox-base:bookworm");
    assert.deepEqual(runs[0], [
      "create",
      "--name",
      "sandbox-work",
      "--label",
      "dev.sandbox.owner=sandbox",
      "--label",
      "dev.sandbox.profile=work",
      "--label",
      "dev.sandbox.kind=shared",
      "--label",
      `dev.sandbox.config-hash=${configHash}`,
      "--hostname",
      "sandbox-work",
      "--user",
      "10001:10001",
      "--cap-drop",
      "ALL",
      "--security-opt",
      "no-new-privileges",
      "--read-only",
      // Each tmpfs a quarter of the memory limit: together they leave half of it for processes.
      "--tmpfs",
      "/tmp:rw,nosuid,nodev,size=536870912",
      "--tmpfs",
      "/home/sandbox:rw,nosuid,nodev,size=536870912,uid=10001,gid=10001,mode=0700",
      "--mount",
      "type=volume,src=sandbox-work-workspace,dst=/workspace",
      "--memory",
      "2147483648",
      "--memory-swap",
      "2147483648",
      "--cpus",
      "1.5",
      "--pids-limit",
      "256",
      "--network",
      "none",
      "--restart",
      "no",
      "--env",
      "TERM",
      "--env",
      "FOO",
      // The one host directory: the proxies' sockets of this container's sessions, read-only
      // (a local engine; not in the configuration hash: it changes no rule).
      "--mount",
      `type=bind,src=${mountSource},dst=/run/sandbox-proxy,readonly`,
      tag,
    ]);
    // Its parent keeps every other host user out; the sandbox user may only pass through it.
    const mountParent = mountSource.slice(0, mountSource.lastIndexOf("/"));
    assert.equal((await Deno.stat(mountParent)).mode! & 0o777, 0o700);
    assert.equal((await Deno.stat(mountSource)).mode! & 0o777, 0o711);
    await Deno.remove(mountParent, { recursive: true });
    // Nothing else of the host is mounted or inherited, and no variable's value is on the command
    // line: the docker client takes them from its own environment.
    const argv = runs[0].filter((a) => !a.startsWith(`type=bind,src=${mountSource},`)).join(" ");
    assert.doesNotMatch(
      argv,
      /--volume|-v |type=bind|docker\.sock|--privileged|--cap-add|HOME=|--init|xterm|bar/,
    );
    const calls = await docker.calls();
    const env = (await docker.environments())[calls.findIndex((c) => c[0] === "create")];
    assert.equal(env.TERM, "xterm");
    assert.equal(env.FOO, "bar");

    // No network of its own: the sandbox has only `lo`, and no network is created.
    assert.deepEqual(await docker.callsStartingWith("network"), []);
    // The workspace asks for a kernel quota of resources.disk first (this engine grants it).
    const volumes = await docker.callsStartingWith("volume", "create");
    assert.deepEqual(volumes, [[
      "volume",
      "create",
      "--label",
      "dev.sandbox.owner=sandbox",
      "--label",
      "dev.sandbox.profile=work",
      "--label",
      "dev.sandbox.kind=shared",
      "--opt",
      "size=1073741824",
      "sandbox-work-workspace",
    ]]);
    const [build] = await docker.callsStartingWith("build");
    assert.equal(build[1], "--build-arg");
    assert.equal(build[2], "BASE_IMAGE=sandbox-base:bookworm");
    // Ownership is set on what the tool creates (container, network, volume above), not on the
    // image, whose labels every container started from it would inherit.
    assert.ok(!build.some((a) => a.startsWith("dev.sandbox.owner=")), build.join(" "));
    assert.ok(build.some((a) => a.startsWith("dev.sandbox.content-hash=")));
    assert.equal(build[build.indexOf("--tag") + 1], tag);
  });
});

Deno.test("the proxies' socket directory is mounted only where the engine may share this machine's filesystem", async (t) => {
  await using state = await tempDir();
  const mounts = async (vars: Record<string, string | undefined>, respond = "", options = {}) =>
    await withEnv({
      XDG_STATE_HOME: state.path,
      DOCKER_CONFIG: state.path,
      DOCKER_HOST: undefined,
      DOCKER_CONTEXT: undefined,
      ...vars,
    }, async () => {
      const probe = new DockerSandboxProvider(WORK);
      await using docker = await fakeDocker(freshEngine(await runningJsonFor(probe), respond));
      await new DockerSandboxProvider(WORK, { docker: docker.program, ...options }).ensureRunning();
      return (await docker.callsStartingWith("create")).map((run) =>
        run.filter((a) => a.includes("dst=/run/sandbox-proxy")).length
      );
    });
  await t.step("the default engine, or one on a Unix socket: mounted", async () => {
    assert.deepEqual(await mounts({}), [1]);
    assert.deepEqual(await mounts({ DOCKER_HOST: "unix:///run/user/1000/docker.sock" }), [1]);
  });
  await t.step("a remote engine (tcp, ssh): not mounted", async () => {
    assert.deepEqual(await mounts({ DOCKER_HOST: "tcp://10.0.0.5:2376" }), [0]);
    assert.deepEqual(await mounts({ DOCKER_HOST: "ssh://user@build-host" }), [0]);
  });
  await t.step("a context: as its endpoint says", async () => {
    const endpoint = (url: string) =>
      `if [ "$1 $2" = "context inspect" ]; then echo '${url}'; exit 0; fi`;
    assert.deepEqual(
      await mounts({ DOCKER_CONTEXT: "rootless" }, endpoint("unix:///run/user/1000/docker.sock")),
      [1],
    );
    assert.deepEqual(
      await mounts({ DOCKER_CONTEXT: "remote" }, endpoint("ssh://user@build-host")),
      [0],
    );
    await Deno.writeTextFile(
      `${state.path}/config.json`,
      JSON.stringify({ currentContext: "remote" }),
    );
    assert.deepEqual(await mounts({}, endpoint("tcp://10.0.0.5:2376")), [0]);
    await Deno.remove(`${state.path}/config.json`);
  });
  await t.step("an engine that cannot bind it: the container is made without it", async () => {
    // Nothing is made by a refused create: until one without the mount, no container is there.
    const refuse = `if [ "$1" = create ] && printf '%s\n' "$@" | grep -q '^type=bind'; then
  echo 'docker: Error response from daemon: invalid mount config for type "bind": bind source path does not exist' >&2; exit 125
fi
if [ "$1 $2" = "container inspect" ] && ! grep -v 'type=bind' "$CALLS" | grep -q '^create'; then
  echo "Error: No such container: $3" >&2; exit 1
fi`;
    assert.deepEqual(await mounts({}, refuse), [1, 0]);
  });
  await t.step("proxyMount: false: not mounted", async () => {
    assert.deepEqual(await mounts({}, "", { proxyMount: false }), [0]);
  });
});

Deno.test("network modes none and allowlist run the sandbox with no network; full on Docker's default bridge", async () => {
  for (const [mode, expected] of [["none", "none"], ["allowlist", "none"], ["full", "bridge"]]) {
    const profile = profileFrom(`profiles: {p: {sandbox: {network: {mode: ${mode}}}}}`, "p");
    const probe = new DockerSandboxProvider(profile);
    await using docker = await fakeDocker(freshEngine(await runningJsonFor(probe)));
    await new DockerSandboxProvider(profile, { docker: docker.program }).ensureRunning();
    const [run] = await docker.callsStartingWith("create");
    assert.equal(run[run.indexOf("--network") + 1], expected, mode);
    assert.equal(run.filter((a) => a === "--network").length, 1);
    assert.ok(!run.includes("--dns"), "a sandbox with no network needs no resolver setting");
    assert.deepEqual(
      await docker.callsStartingWith("network"),
      [],
      `mode ${mode} created a network`,
    );
  }
});

Deno.test("down removes the container and the profile's networks older versions made, and the volume only when asked", async () => {
  // As docker does, each removal prints the name of what it removed.
  await using docker = await fakeDocker(`
case "$1 $2" in
  "network ls") echo sandbox-work-internal ;;
  "rm --force") echo "\${@: -1}" ;;
  "volume rm") echo "$3" ;;
esac`);
  const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
  const report = await provider.teardown();
  assert.deepEqual(report, {
    containers: ["sandbox-work"],
    networks: ["sandbox-work-internal"],
    volumes: [],
  });
  const [list] = await docker.callsStartingWith("network", "ls");
  assert.ok(
    list.includes("label=dev.sandbox.owner=sandbox") &&
      list.includes("label=dev.sandbox.profile=work"),
    list.join(" "),
  );
  assert.deepEqual(await docker.callsStartingWith("network", "rm"), [[
    "network",
    "rm",
    "sandbox-work-internal",
  ]]);
  assert.deepEqual(await docker.callsStartingWith("volume", "rm"), []);
  const withVolumes = await provider.teardown({ volumes: true });
  assert.deepEqual(withVolumes.volumes, ["sandbox-work-workspace"]);
});

Deno.test("ensureRunning() is a single inspect when the container is current and running", async () => {
  const provider0 = new DockerSandboxProvider(WORK);
  await using docker = await fakeDocker(`
case "$1 $2" in "container inspect") cat <<'JSON'
${await runningJsonFor(provider0)}
JSON
;; esac`);
  await new DockerSandboxProvider(WORK, { docker: docker.program }).ensureRunning();
  assert.deepEqual((await docker.calls()).map((c) => c.slice(0, 2).join(" ")), [
    "container inspect",
  ]);
});

Deno.test("a container whose config hash differs is removed by id and replaced", async () => {
  const provider0 = new DockerSandboxProvider(WORK);
  const stale = inspectJson("sandbox-work", "running", provider0.labels("0000000000000000"));
  const current = await runningJsonFor(provider0);
  await using docker = await fakeDocker(`
case "$1 $2" in
  "container inspect") if called create; then cat <<'JSON'
${current}
JSON
  elif called rm; then echo "Error: No such container: $3" >&2; exit 1
  else cat <<'JSON'
${stale}
JSON
  fi ;;
  "image inspect") echo '[{"Id":"sha256:base","Config":{"Labels":null}}]' ;;
  "volume inspect") echo '[{"Name":"sandbox-work-workspace"}]' ;;
esac`);
  const progress: string[] = [];
  await new DockerSandboxProvider(WORK, {
    docker: docker.program,
    onProgress: (l) => progress.push(l),
  }).ensureRunning();
  const names = (await docker.calls()).map((c) => c[0]);
  // Its anonymous volumes are not asked for: the workspace volume is named, and it stays.
  assert.deepEqual(await docker.callsStartingWith("rm"), [[
    "rm",
    "--force",
    "sandbox-work-id-0123456789",
  ]]);
  assert.ok(names.indexOf("rm") < names.indexOf("create"));
  assert.match(progress.join("\n"), /configuration changed/);
});

Deno.test("a stopped container with the current config is restarted, not replaced", async () => {
  const provider0 = new DockerSandboxProvider(WORK);
  const { configHash } = await provider0.runArgs();
  const exited = inspectJson("sandbox-work", "exited", provider0.labels(configHash));
  const running = inspectJson("sandbox-work", "running", provider0.labels(configHash));
  await using docker = await fakeDocker(`
case "$1 $2" in
  "container inspect") if called start; then echo '${running}'; else echo '${exited}'; fi ;;
esac`);
  await new DockerSandboxProvider(WORK, { docker: docker.program }).ensureRunning();
  assert.deepEqual(await docker.callsStartingWith("start"), [[
    "start",
    "sandbox-work-id-0123456789",
  ]]);
  assert.equal((await docker.callsStartingWith("create")).length, 0);
  assert.equal((await docker.callsStartingWith("rm")).length, 0);
});

Deno.test("losing the race for the container name adopts the winner's container", async () => {
  const provider0 = new DockerSandboxProvider(WORK);
  const running = await runningJsonFor(provider0);
  await using docker = await fakeDocker(freshEngine(
    running,
    `
if [ "$1" = run ]; then
  echo 'docker: Error response from daemon: Conflict. The container name "/sandbox-work" is already in use by container "abc".' >&2
  exit 125
fi`,
  ));
  const status = await new DockerSandboxProvider(WORK, { docker: docker.program }).ensureRunning();
  assert.equal(status.state, "running");
  assert.equal((await docker.callsStartingWith("create")).length, 1);
});

Deno.test("docker errors map to typed codes", async (t) => {
  await t.step("no docker CLI → docker_missing", async () => {
    const provider = new DockerSandboxProvider(WORK, { docker: "/nonexistent/bin/docker" });
    await assert.rejects(
      provider.ensureRunning(),
      (e: SandboxError) => e.code === "docker_missing",
    );
  });

  await t.step("engine not reachable → daemon_down", async () => {
    await using docker = await fakeDocker(`
echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
exit 1`);
    const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
    await assert.rejects(provider.ensureRunning(), (e: SandboxError) => e.code === "daemon_down");
    await assert.rejects(provider.exec(["true"]), (e: SandboxError) => e.code === "daemon_down");
  });

  await t.step("failing image build → image_build_failed with the build log tail", async () => {
    await using docker = await fakeDocker(`
case "$1 $2" in
  "container inspect") echo "Error: No such container: x" >&2; exit 1 ;;
  "image inspect") echo '[{"Id":"sha256:base","Config":{"Labels":null}}]' ;;
esac
if [ "$1" = build ]; then for i in $(seq 1 30); do echo "step $i"; done; echo "E: unable to locate package" >&2; exit 1; fi`);
    const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
    await assert.rejects(provider.ensureRunning(), (e: SandboxError) => {
      assert.equal(e.code, "image_build_failed");
      assert.match(e.detail ?? "", /step 30/);
      assert.match(e.detail ?? "", /unable to locate package/);
      assert.doesNotMatch(e.detail ?? "", /step 1\n/);
      return true;
    });
  });

  await t.step("exec in a missing container → container_not_found", async () => {
    // A reachable engine (version answers) where no container of that name is listed.
    await using docker = await fakeDocker(`case "$1" in
  version) echo 20.10 ;;
  ps) ;;
  *) echo "Error response from daemon: No such container: sandbox-work" >&2; exit 1 ;;
esac`);
    const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
    await assert.rejects(
      provider.exec(["true"]),
      (e: SandboxError) => e.code === "container_not_found",
    );
  });

  await t.step("a command's own non-zero exit is a result, not an error", async () => {
    // A reachable engine, the container running: the exit is the command's.
    await using docker = await fakeDocker(`case "$1" in
  version) echo 20.10 ;;
  container) echo true ;;
  *) echo "usage: thing" >&2; exit 3 ;;
esac`);
    const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
    const result = await provider.exec(["thing"]);
    assert.equal(result.exitCode, 3);
    assert.equal(result.stderr, "usage: thing\n");
    assert.equal(result.oomKilled, false);
  });
});

Deno.test("exec passes cwd, env and stdin as docker flags and runs through the session wrapper", async () => {
  await using docker = await fakeDocker(`[ "$1" = exec ] && cat`);
  const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
  const result = await provider.exec(["echo", "a b"], {
    cwd: "/workspace/x",
    env: { A: "1" },
    stdin: "in",
  });
  assert.equal(result.stdout, "in");
  const [call] = await docker.callsStartingWith("exec");
  assert.deepEqual(call.slice(0, 9), [
    "exec",
    "--interactive",
    "--user",
    "10001:10001",
    "--workdir",
    "/workspace/x",
    "--env",
    "SANDBOX_EXEC_ENV_A",
    "sandbox-work",
  ]);
  assert.equal(call[9], "sandbox-exec");
  assert.deepEqual(call.slice(11), ["echo", "a b"]);
  // The value travels in the docker client's environment, renamed inside by sandbox-exec.
  const [env] = await docker.environments();
  assert.equal(env.SANDBOX_EXEC_ENV_A, "1");
});

Deno.test("exec never puts a variable's value on the docker command line, whatever its name", async () => {
  await using docker = await fakeDocker(`[ "$1" = exec ] && echo ok`);
  const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
  const token = `sbx_${crypto.randomUUID()}`;
  // Names the docker client obeys itself get the same treatment: under the prefix, they cannot
  // redirect or reconfigure the client.
  const env = {
    SANDBOX_LLM_TOKEN: token,
    OPENAI_API_KEY: token,
    HTTP_PROXY: `http://${token}@proxy:1`,
    DOCKER_HOST: "tcp://elsewhere:1",
  };
  const result = await provider.exec(["true"], { env });
  assert.equal(result.stdout, "ok\n");
  const [call] = await docker.callsStartingWith("exec");
  assert.ok(!call.join(" ").includes(token), call.join(" "));
  assert.ok(!call.join(" ").includes("elsewhere"), call.join(" "));
  const [seen] = await docker.environments();
  assert.equal(seen.SANDBOX_EXEC_ENV_SANDBOX_LLM_TOKEN, token);
  assert.equal(seen.SANDBOX_EXEC_ENV_HTTP_PROXY, `http://${token}@proxy:1`);
  assert.notEqual(seen.DOCKER_HOST, "tcp://elsewhere:1");
  assert.equal(seen.HTTP_PROXY, Deno.env.get("HTTP_PROXY"));
});

Deno.test("on storage without project quotas the workspace falls back to a plain volume", async () => {
  const probe = new DockerSandboxProvider(WORK);
  await using docker = await fakeDocker(freshEngine(
    await runningJsonFor(probe),
    `if [ "$1 $2" = "volume create" ] && [ "$(( $# ))" -gt 9 ]; then
       echo "Error response from daemon: create $9: quota size requested but no quota support" >&2; exit 1
     fi`,
  ));
  const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
  await provider.ensureRunning();
  const volumes = await docker.callsStartingWith("volume", "create");
  assert.equal(volumes.length, 2);
  assert.deepEqual(volumes[0].slice(-3), ["--opt", "size=1073741824", "sandbox-work-workspace"]);
  assert.deepEqual(volumes[1].slice(-2), ["dev.sandbox.kind=shared", "sandbox-work-workspace"]);
});

Deno.test("workspaceQuota() reads the volume's size option, and nothing when it has none", async () => {
  await using quota = await fakeDocker(
    `[ "$1 $2" = "volume inspect" ] && echo '[{"Name":"v","Options":{"size":"1073741824"}}]'`,
  );
  assert.equal(
    await new DockerSandboxProvider(WORK, { docker: quota.program }).workspaceQuota(),
    1024 ** 3,
  );
  await using plain = await fakeDocker(
    `[ "$1 $2" = "volume inspect" ] && echo '[{"Name":"v","Options":null}]'`,
  );
  assert.equal(
    await new DockerSandboxProvider(WORK, { docker: plain.program }).workspaceQuota(),
    undefined,
  );
});

Deno.test("each repository gets a development sandbox and volume of its own, labelled with it, and so do its runs' pooled and cold containers; down removes them all, a run's volume with its container", async () => {
  const repo = await sandboxRepo("app-0123456789ab");
  const other = await sandboxRepo("lib-ba9876543210");
  assert.match(repo.id, /^[0-9a-f]{12}$/);
  assert.notEqual(repo.id, other.id);
  const probe = new DockerSandboxProvider(WORK, { repository: repo });
  assert.equal(probe.containerName, `sandbox-work-repo-${repo.id}`);
  assert.equal(probe.names.volume, `sandbox-work-repo-${repo.id}-workspace`);
  assert.notEqual(
    new DockerSandboxProvider(WORK, { repository: other }).containerName,
    probe.containerName,
  );
  assert.equal(new DockerSandboxProvider(WORK).containerName, "sandbox-work");
  assert.equal(probe.labels()["dev.sandbox.repo"], "app-0123456789ab");
  assert.equal(probe.labels()["dev.sandbox.kind"], "shared");
  // A run's container: pooled (`p` and 8 hex digits) or cold (the run's id), named after the repository.
  const pooled = new DockerSandboxProvider(WORK, {
    repository: repo,
    instance: "p0123abcd",
    pooled: true,
  });
  assert.equal(pooled.containerName, `sandbox-work-repo-${repo.id}-p0123abcd`);
  assert.equal(pooled.labels()["dev.sandbox.kind"], "pool");
  assert.equal(pooled.labels()["dev.sandbox.repo"], "app-0123456789ab");
  const cold = new DockerSandboxProvider(WORK, {
    repository: repo,
    instance: "20990101-000000-abcdef",
  });
  assert.equal(cold.containerName, `sandbox-work-repo-${repo.id}-20990101-000000-abcdef`);
  assert.equal(cold.labels()["dev.sandbox.kind"], "run");

  await using docker = await fakeDocker(`
case "$1" in
  ps) echo "sandbox-work shared"; echo "sandbox-work-repo-${repo.id} shared"; echo "sandbox-work-repo-${repo.id}-p0123abcd pool" ;;
  volume) [ "$2" = ls ] && { echo sandbox-work-workspace; echo "sandbox-work-repo-${repo.id}-workspace"; }
    [ "$2" = rm ] && echo "$3" ;;
  rm) echo "\${@: -1}" ;;
esac`);
  const report = await teardownProfile(new DockerCli(docker.program), "work", { volumes: true });
  assert.deepEqual(report.containers, [
    "sandbox-work",
    `sandbox-work-repo-${repo.id}`,
    `sandbox-work-repo-${repo.id}-p0123abcd`,
  ]);
  assert.deepEqual(report.volumes, [
    `sandbox-work-repo-${repo.id}-p0123abcd-workspace`,
    "sandbox-work-workspace",
    `sandbox-work-repo-${repo.id}-workspace`,
  ]);
  const [ps] = await docker.callsStartingWith("ps");
  assert.ok(
    ps.includes("label=dev.sandbox.owner=sandbox") && ps.includes("label=dev.sandbox.profile=work"),
    ps.join(" "),
  );
  const [volumeLs] = await docker.callsStartingWith("volume", "ls");
  assert.ok(volumeLs.includes("label=dev.sandbox.profile=work"), volumeLs.join(" "));
});

Deno.test("teardownAll() removes only objects carrying the owner label", async () => {
  await using docker = await fakeDocker(`
case "$1" in
  ps) echo sandbox-a; echo sandbox-b ;;
  network) [ "$2" = ls ] && echo sandbox-a-internal ;;
  volume) [ "$2" = ls ] && echo sandbox-a-workspace ;;
esac`);
  const report = await teardownAll(new DockerCli(docker.program));
  assert.deepEqual(report, {
    containers: ["sandbox-a", "sandbox-b"],
    networks: ["sandbox-a-internal"],
    volumes: ["sandbox-a-workspace"],
  });
  for (
    const list of [
      ...await docker.callsStartingWith("ps"),
      ...await docker.callsStartingWith("network", "ls"),
      ...await docker.callsStartingWith("volume", "ls"),
    ]
  ) {
    assert.ok(list.includes("label=dev.sandbox.owner=sandbox"), list.join(" "));
  }
  assert.deepEqual(await docker.callsStartingWith("rm"), [[
    "rm",
    "--force",
    "sandbox-a",
    "sandbox-b",
  ]]);
});

Deno.test("docker's human sizes parse to bytes", () => {
  assert.equal(parseDockerSize("1.5MiB"), 1_572_864);
  assert.equal(parseDockerSize("512kB"), 512_000);
  assert.equal(parseDockerSize("4GiB"), 4 * 1024 ** 3);
  assert.equal(parseDockerSize("0B"), 0);
});

Deno.test("the CLI maps errors to exit codes without stack traces", async (t) => {
  await using dir = await tempDir();
  await using docker = await fakeDocker(`
echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
exit 1`);
  const env = { PATH: `${docker.dir}:${Deno.env.get("PATH")}` };
  const good = await writeConfig(dir.path, "profiles: {work: {}}");

  await t.step("daemon down → 125", async () => {
    const result = await runCli(["up", "--profile", "work"], { config: good, env });
    assert.equal(result.exitCode, 125, explain(result));
    assert.match(result.stderr, /sandbox: error: Cannot reach the Docker engine/);
    assert.doesNotMatch(result.stderr, /\n\s+at /);
  });

  await t.step("invalid config → 2, naming the path", async () => {
    const bad = await writeConfig(
      dir.path,
      "profiles: {work: {sandbox: {resources: {memory: lots}}}}",
      "bad.yaml",
    );
    const result = await runCli(["up"], { config: bad, env });
    assert.equal(result.exitCode, 2, explain(result));
    assert.match(
      result.stderr,
      /profiles\.work\.sandbox\.resources\.memory: expected a size like "4g"/,
    );
  });

  await t.step("unknown command or option → 2", async () => {
    assert.equal((await runCli(["frobnicate"], { env })).exitCode, 2);
    assert.equal((await runCli(["up", "--bogus"], { env })).exitCode, 2);
  });

  await t.step("--help on every command → 0", async () => {
    for (
      const args of [
        ["--help"],
        ["up", "--help"],
        ["exec", "--help"],
        ["config", "show", "--help"],
        ["image", "build", "--help"],
      ]
    ) {
      const result = await runCli(args, { env });
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(result.stdout, /Usage: sandbox/);
    }
  });
});

Deno.test("stopExec() stops a relay as the relay's uid, which the sandbox user cannot signal, and other execs as the sandbox user", async () => {
  await using docker = await fakeDocker("");
  const provider = new DockerSandboxProvider(WORK, { docker: docker.program });
  await provider.stopExec("relay-run1-1234");
  await provider.stopExec("exec-5678");
  assert.deepEqual(await docker.callsStartingWith("exec"), [
    ["exec", "--user", RELAY_USER, "sandbox-work", "sandbox-exec", "--kill", "relay-run1-1234"],
    ["exec", "--user", SANDBOX_USER, "sandbox-work", "sandbox-exec", "--kill", "exec-5678"],
  ]);
  assert.notEqual(RELAY_USER, SANDBOX_USER);
});
