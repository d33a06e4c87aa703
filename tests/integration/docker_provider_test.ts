/**
 * The Docker provider against a real engine: every hardening rule is attempted and seen to hold.
 * Without an engine these tests are skipped locally, and fail under CI.
 */
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { DockerSandboxProvider, teardownAll } from "../../lib/sandbox/docker_provider.ts";
import { DockerCli } from "../../lib/sandbox/docker.ts";
import { ensureImage } from "../../lib/sandbox/image.ts";
import { run } from "../../lib/process.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  spawnCli,
  tempDir,
  unexpectedBinds,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { PROXY_MOUNT_PATH } from "../../lib/sandbox/proxy_mount.ts";

console.error("integration: docker provider tests starting");

function profileFrom(yaml: string, name: string) {
  const result = parseConfig(yaml, undefined, () => undefined);
  if (result.kind !== "ok") throw new Error(JSON.stringify(result.issues));
  return resolveProfile(result.config, name);
}

/** A provider for a fresh profile, removed (container, volume) on dispose. */
async function sandboxFor(sandboxYaml: string, prefix: string) {
  assertDocker();
  const name = uniqueProfile(prefix);
  const provider = new DockerSandboxProvider(
    profileFrom(`profiles:\n  ${name}:\n    sandbox: ${sandboxYaml}\n`, name),
  );
  await provider.ensureRunning();
  return Object.assign(provider, { [Symbol.asyncDispose]: () => removeProfile(name) });
}

interface Inspect {
  Mounts: { Type: string; Destination: string }[];
  Config: { User: string; Env: string[]; Labels: Record<string, string> };
  HostConfig: {
    Binds: string[] | null;
    CapDrop: string[];
    CapAdd: string[] | null;
    SecurityOpt: string[];
    Privileged: boolean;
    ReadonlyRootfs: boolean;
    Init: boolean;
    Memory: number;
    NanoCpus: number;
    PidsLimit: number;
    NetworkMode: string;
  };
}

async function inspect(name: string): Promise<Inspect> {
  return JSON.parse(await docker("container", "inspect", name))[0];
}

Deno.test({
  name:
    "the sandbox runs as a non-root user with no capabilities, no new privileges and a read-only root",
  ...dockerTest(),
  async fn() {
    await using sandbox = await sandboxFor("{}", "it-priv");
    const result = await sandbox.exec([
      "sh",
      "-c",
      "id -u; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status; " +
      "touch /etc/owned 2>/dev/null && echo root-writable || echo root-read-only; " +
      "touch /workspace/ok /tmp/ok ~/ok && echo work-writable; " +
      "test -e /var/run/docker.sock && echo socket || echo no-socket",
    ]);
    assert.equal(result.exitCode, 0, result.stderr);
    const lines = result.stdout.trim().split("\n");
    assert.equal(lines[0], "10001");
    assert.match(result.stdout, /CapEff:\s+0000000000000000/);
    assert.match(result.stdout, /CapPrm:\s+0000000000000000/);
    assert.match(result.stdout, /CapBnd:\s+0000000000000000/);
    assert.match(result.stdout, /NoNewPrivs:\s+1/);
    assert.ok(lines.includes("root-read-only"), result.stdout);
    assert.ok(lines.includes("work-writable"), result.stdout);
    assert.ok(lines.includes("no-socket"), result.stdout);
  },
});

Deno.test({
  name:
    "docker inspect shows no bind mounts but its own proxy sockets (read-only), our labels, the limits, and no host environment",
  ...dockerTest(),
  async fn() {
    Deno.env.set("SANDBOX_TEST_HOST_ONLY", "must-not-leak");
    try {
      await using sandbox = await sandboxFor(
        "{resources: {memory: 256m, cpus: 0.5, pids: 100}}",
        "it-inspect",
      );
      const info = await inspect(sandbox.containerName);
      assert.deepEqual(unexpectedBinds(info.Mounts), [], JSON.stringify(info.Mounts));
      assert.equal(info.HostConfig.Binds, null);
      assert.deepEqual(
        info.Mounts.map((m) => [m.Type, m.Destination]).sort(),
        [["bind", PROXY_MOUNT_PATH], ["volume", "/workspace"]],
      );
      assert.equal(info.Config.Labels["dev.sandbox.owner"], "sandbox");
      assert.equal(info.Config.Labels["dev.sandbox.profile"], sandbox.profile.name);
      assert.match(info.Config.Labels["dev.sandbox.config-hash"], /^[0-9a-f]{16}$/);
      assert.equal(info.Config.User, "10001:10001");
      assert.deepEqual(info.HostConfig.CapDrop, ["ALL"]);
      assert.equal(info.HostConfig.CapAdd, null);
      assert.ok(info.HostConfig.SecurityOpt.includes("no-new-privileges"));
      assert.equal(info.HostConfig.Privileged, false);
      assert.equal(info.HostConfig.ReadonlyRootfs, true);
      // Not Docker's init: pid 1 is sandbox-exec --init, which nothing in the sandbox can ptrace.
      assert.notEqual(info.HostConfig.Init, true);
      assert.equal(info.HostConfig.Memory, 256 * 1024 ** 2);
      assert.equal(info.HostConfig.NanoCpus, 500_000_000);
      assert.equal(info.HostConfig.PidsLimit, 100);
      assert.ok(
        info.Config.Env.every((e) => !e.includes("must-not-leak")),
        info.Config.Env.join("\n"),
      );
      const env = await sandbox.exec(["env"]);
      assert.doesNotMatch(env.stdout, /must-not-leak|SANDBOX_TEST_HOST_ONLY/);
      // No network of its own (tests/security/network_test.ts attacks it): nothing to label.
      assert.equal(info.HostConfig.NetworkMode, "none");
    } finally {
      Deno.env.delete("SANDBOX_TEST_HOST_ONLY");
    }
  },
});

Deno.test({
  name:
    "a fork bomb is stopped by the pids limit while the host and then the sandbox stay responsive",
  ...dockerTest(),
  async fn(t) {
    await using sandbox = await sandboxFor("{resources: {pids: 64, cpus: 1}}", "it-fork");
    const processCount = async () => {
      const after = await sandbox.exec(["sh", "-c", "echo alive; ps -e --no-headers | wc -l"]);
      assert.equal(after.exitCode, 0, after.stderr);
      const [alive, processes] = after.stdout.trim().split("\n");
      assert.equal(alive, "alive");
      return Number(processes);
    };
    const hostLatencies: number[] = [];
    const probeHost = async (until: Promise<unknown>) => {
      let done = false;
      until.finally(() => done = true);
      while (!done) {
        const started = performance.now();
        assert.equal((await run(["true"])).exitCode, 0);
        hostLatencies.push(performance.now() - started);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    };

    await t.step("a bomb that hits the limit is reaped when its command ends", async () => {
      // The command ends once the kernel has refused a fork at the pids limit (the cgroup's
      // pids.events "max" counter rose): the event itself, not a guess at how long that takes.
      // Builtins only: with every pid taken, the wait itself cannot fork.
      // cgroup v2 has the file at the root, v1 under pids/.
      const waitForLimit =
        'e=/sys/fs/cgroup/pids.events; [ -r "$e" ] || e=/sys/fs/cgroup/pids/pids.events; ' +
        'read -r _ before < "$e"; bomb() { bomb | bomb & }; bomb; ' +
        'while read -r _ now < "$e"; [ "$now" = "$before" ]; do :; done';
      const bomb = sandbox.exec(["bash", "-c", waitForLimit], { timeoutMs: 60_000 });
      await probeHost(bomb);
      const result = await bomb;
      assert.match(result.stderr, /fork: .*Resource temporarily unavailable/);
      assert.ok(await processCount() < 10);
    });

    await t.step(
      "a bomb still running at its timeout is killed, even with no pid free",
      async () => {
        const bomb = sandbox.exec(["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 600"], {
          timeoutMs: 3_000,
        });
        await probeHost(bomb);
        const result = await bomb;
        assert.equal(result.timedOut, true);
        assert.equal(result.exitCode, 124);
        assert.ok(await processCount() < 10);
      },
    );

    // The host kept spawning processes while the bombs ran (every probe above asserted exit 0).
    // How fast is not asserted: these machines are noisy, and a bound would test the machine.
    assert.ok(hostLatencies.length > 0);
  },
});

Deno.test({
  name: "allocating past the memory limit gets the process killed and reported as such",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const profile = uniqueProfile("it-oom");
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${profile}:\n    sandbox: {resources: {memory: 64m}}\n`,
    );
    try {
      // `tail` keeps an endless line of /dev/zero in memory until the kernel kills it.
      const result = await runCli(["exec", "--profile", profile, "--", "tail", "/dev/zero"], {
        config,
      });
      assert.equal(result.exitCode, 137, explain(result));
      assert.match(result.stderr, /killed by the sandbox memory limit \(64 MiB\)/);
      // An ordinary SIGKILL is not blamed on memory.
      const killed = await runCli(["exec", "--profile", profile, "--", "sh", "-c", "kill -9 $$"], {
        config,
      });
      assert.equal(killed.exitCode, 137, explain(killed));
      assert.doesNotMatch(killed.stderr, /memory limit/);
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name: "two concurrent `sandbox start` end with one development sandbox and no error",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const profile = uniqueProfile("it-race");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
    try {
      const [a, b] = await Promise.all([
        runCli(["start", "--profile", profile, "--json"], { config }),
        runCli(["start", "--profile", profile, "--json"], { config }),
      ]);
      assert.equal(a.exitCode, 0, explain(a));
      assert.equal(b.exitCode, 0, explain(b));
      assert.equal(JSON.parse(a.stdout).id, JSON.parse(b.stdout).id);
      const ids = await docker("ps", "-aq", "--filter", `label=dev.sandbox.profile=${profile}`);
      assert.equal(ids.split("\n").length, 1, ids);
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "changing the profile's resources replaces the development sandbox at the next exec; an unchanged profile keeps it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const profile = uniqueProfile("it-change");
    const write = (memory: string) =>
      writeConfig(
        dir.path,
        `profiles:\n  ${profile}:\n    sandbox: {resources: {memory: ${memory}}}\n`,
      );
    try {
      const config = await write("128m");
      const id = () => docker("inspect", "--format", "{{.Id}}", `sandbox-${profile}`);
      const exec = () => runCli(["exec", "--profile", profile, "--", "true"], { config });
      const first = await exec();
      assert.equal(first.exitCode, 0, explain(first));
      const firstId = await id();
      const again = await exec();
      assert.equal(again.exitCode, 0, explain(again));
      assert.equal(await id(), firstId);
      assert.doesNotMatch(again.stderr, /Replacing sandbox/, explain(again));
      await write("256m");
      const changed = await exec();
      assert.equal(changed.exitCode, 0, explain(changed));
      assert.notEqual(await id(), firstId);
      assert.equal((await inspect(`sandbox-${profile}`)).HostConfig.Memory, 256 * 1024 ** 2);
      assert.match(changed.stderr, /configuration changed/);
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "a stopped development sandbox is started again by ensureRunning (exec), keeping its workspace",
  ...dockerTest(),
  async fn() {
    await using sandbox = await sandboxFor("{}", "it-stop");
    await sandbox.writeFile("/workspace/kept.txt", "still here");
    await docker("stop", "--time", "1", sandbox.containerName);
    const status = await sandbox.ensureRunning();
    assert.equal(status.state, "running");
    assert.equal(
      new TextDecoder().decode(await sandbox.readFile("/workspace/kept.txt")),
      "still here",
    );
  },
});

Deno.test({
  name:
    "`down --volumes` removes everything of its profile, including the network an older version made, and nothing of another profile",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const profile = uniqueProfile("it-down");
    const other = uniqueProfile("it-down-other");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n  ${other}: {}\n`);
    const legacy = (
      name: string,
    ) => [
      "--label",
      "dev.sandbox.owner=sandbox",
      "--label",
      `dev.sandbox.profile=${name}`,
      `sandbox-${name}-internal`,
    ];
    try {
      await docker("network", "create", "--internal", ...legacy(profile));
      await docker("network", "create", "--internal", ...legacy(other));
      // The warm pool's sandbox and the development sandbox.
      const up = await runCli(["up", "--profile", profile, "--json"], { config });
      assert.equal(up.exitCode, 0, explain(up));
      const pooled: string[] = JSON.parse(up.stdout).ready;
      assert.equal(pooled.length, 1, up.stdout);
      const start = await runCli(["start", "--profile", profile], { config });
      assert.equal(start.exitCode, 0, explain(start));
      const down = await runCli(["down", "--profile", profile, "--volumes", "--json"], { config });
      assert.equal(down.exitCode, 0, explain(down));
      const report = JSON.parse(down.stdout);
      assert.deepEqual({
        ...report,
        containers: report.containers.sort(),
        volumes: report.volumes.sort(),
      }, {
        containers: [`sandbox-${profile}`, pooled[0]].sort(),
        networks: [`sandbox-${profile}-internal`],
        volumes: [`sandbox-${profile}-workspace`, `${pooled[0]}-workspace`].sort(),
      });
      const left = await run([
        "docker",
        "ps",
        "-a",
        "--filter",
        `label=dev.sandbox.profile=${profile}`,
        "--format",
        "{{.Names}}",
      ]);
      assert.equal(left.stdout.trim(), "");
      assert.equal(
        (await run(["docker", "network", "inspect", `sandbox-${profile}-internal`])).exitCode,
        1,
      );
      assert.equal(
        (await run(["docker", "volume", "inspect", `sandbox-${profile}-workspace`])).exitCode,
        1,
      );
      assert.equal(
        (await run(["docker", "volume", "inspect", `${pooled[0]}-workspace`])).exitCode,
        1,
      );
      // The other profile's network is not touched.
      assert.equal(
        (await run(["docker", "network", "inspect", `sandbox-${other}-internal`])).exitCode,
        0,
      );
    } finally {
      await removeProfile(profile);
      await removeProfile(other);
    }
  },
});

Deno.test({
  name:
    "teardownAll() removes an orphaned labelled container, network and volume, and leaves unlabelled ones alone (scoped to this test's own label: other work on the engine is never touched)",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const suffix = crypto.randomUUID().slice(0, 8);
    const labels = [
      "--label",
      "dev.sandbox.owner=sandbox",
      "--label",
      `dev.sandbox.profile=orphan-${suffix}`,
    ];
    const image = "sandbox-base:bookworm";
    await docker("run", "-d", "--name", `orphan-${suffix}`, ...labels, image, "sleep", "300");
    await docker("network", "create", ...labels, `orphan-net-${suffix}`);
    await docker("volume", "create", ...labels, `orphan-vol-${suffix}`);
    await docker("run", "-d", "--name", `unlabelled-${suffix}`, image, "sleep", "300");
    await docker("volume", "create", `unlabelled-vol-${suffix}`);
    // A container a user starts by hand from the tool's own sandbox image is the user's: the image
    // must not lend it the owner label.
    const sandboxImage = (await ensureImage(new DockerCli(), image)).tag;
    await docker("run", "-d", "--name", `from-image-${suffix}`, sandboxImage, "sleep", "300");
    try {
      const inherited = JSON.parse(
        await docker("inspect", "--format", "{{json .Config.Labels}}", `from-image-${suffix}`),
      );
      assert.equal(inherited?.["dev.sandbox.owner"], undefined, JSON.stringify(inherited));
      // The whole of `teardown --all` would remove every sandbox on this engine, other tests'
      // too: the same function, narrowed to what this test labelled.
      const report = await teardownAll(
        new DockerCli(),
        undefined,
        `dev.sandbox.profile=orphan-${suffix}`,
      );
      const shown = JSON.stringify(report);
      assert.ok(report.containers.includes(`orphan-${suffix}`), shown);
      assert.ok(report.networks.includes(`orphan-net-${suffix}`), shown);
      assert.ok(report.volumes.includes(`orphan-vol-${suffix}`), shown);
      assert.equal(await docker("ps", "-aq", "--filter", `name=orphan-${suffix}`), "");
      assert.notEqual(await docker("ps", "-q", "--filter", `name=unlabelled-${suffix}`), "");
      assert.ok(!report.containers.includes(`from-image-${suffix}`), shown);
      assert.notEqual(
        await docker("ps", "-q", "--filter", `name=from-image-${suffix}`),
        "",
        "teardown removed a hand-made container of the sandbox image",
      );
      assert.equal(
        await docker("volume", "ls", "-q", "--filter", `name=unlabelled-vol-${suffix}`),
        `unlabelled-vol-${suffix}`,
      );
    } finally {
      await run([
        "docker",
        "rm",
        "-f",
        `unlabelled-${suffix}`,
        `orphan-${suffix}`,
        `from-image-${suffix}`,
      ]);
      await run([
        "docker",
        "volume",
        "rm",
        "-f",
        `unlabelled-vol-${suffix}`,
        `orphan-vol-${suffix}`,
      ]);
      await run(["docker", "network", "rm", `orphan-net-${suffix}`]);
    }
  },
});

Deno.test({
  name:
    "`sandbox exec` streams output line by line before the command ends, passes stdin, and exits with its code",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const profile = uniqueProfile("it-exec");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
    try {
      const start = await runCli(["start", "--profile", profile], { config });
      assert.equal(start.exitCode, 0, explain(start));
      const stdin = new TransformStream<Uint8Array, Uint8Array>();
      // The command blocks on stdin after its first line: that line must reach us while it runs.
      const child = spawnCli(
        [
          "exec",
          "--profile",
          profile,
          "--",
          "sh",
          "-c",
          'echo "first from $(hostname)"; read reply; echo "got $reply"; exit 3',
        ],
        { config, stdin: stdin.readable },
      );
      const lines = child.lines();
      assert.equal((await lines.next()).value, `first from sandbox-${profile}`);
      const writer = stdin.writable.getWriter();
      await writer.write(new TextEncoder().encode("pong\n"));
      await writer.close();
      assert.equal((await lines.next()).value, "got pong");
      assert.equal((await lines.next()).done, true);
      assert.equal((await child.finished).exitCode, 3);
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name: "files round-trip through writeFile/readFile and copyIn/copyOut, owned by the sandbox user",
  ...dockerTest(),
  async fn() {
    await using sandbox = await sandboxFor("{}", "it-files");
    await using dir = await tempDir();
    await Deno.mkdir(`${dir.path}/src/nested`, { recursive: true });
    await Deno.writeTextFile(`${dir.path}/src/nested/a.txt`, "alpha");
    await sandbox.copyIn(`${dir.path}/src`, "/workspace/copied");
    const listing = await sandbox.exec(["stat", "-c", "%U %n", "/workspace/copied/nested/a.txt"]);
    assert.equal(listing.stdout.trim(), "sandbox /workspace/copied/nested/a.txt");
    await sandbox.writeFile("/workspace/copied/nested/b.txt", "beta");
    const mode = await sandbox.exec(["stat", "-c", "%a", "/workspace/copied/nested/b.txt"]);
    assert.equal(mode.stdout.trim(), "600");
    await sandbox.copyOut("/workspace/copied", `${dir.path}/back`);
    assert.equal(await Deno.readTextFile(`${dir.path}/back/nested/a.txt`), "alpha");
    assert.equal(await Deno.readTextFile(`${dir.path}/back/nested/b.txt`), "beta");
  },
});
