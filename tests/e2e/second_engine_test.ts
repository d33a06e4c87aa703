/**
 * Any engine the docker CLI reaches works, because the exec stream is a path between the sandbox
 * and its proxies that needs nothing else: the test starts a second Docker engine of its own — its
 * own data root, exec root, socket, and network namespace (`unshare --net`: with `--bridge none` a
 * daemon deletes the host's `docker0`, which would break the first engine's default network) —
 * and runs the CLI against it with `DOCKER_HOST`, kept to the exec stream (what a remote engine
 * gets), and as it comes (this engine shares the machine's filesystem: the mounted sockets). The
 * engine and everything in it are removed after.
 */
import assert from "node:assert/strict";
import { run, spawn } from "../../lib/process.ts";
import {
  DOCKER_AVAILABLE,
  explain,
  IN_CI,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("e2e: second engine test starting");

const KEY_ENV = "SANDBOX_TEST_ENGINE_KEY";
const ENGINE_START_MS = 60_000;

/** A second dockerd on its own socket; `stop()` ends it and removes its data. */
async function startEngine(root: string): Promise<{ host: string; stop(): Promise<void> }> {
  const socket = `${root}/docker.sock`;
  const host = `unix://${socket}`;
  const daemon = new Deno.Command("unshare", {
    args: [
      "--net",
      "dockerd",
      "--data-root",
      `${root}/data`,
      "--exec-root",
      `${root}/exec`,
      "--pidfile",
      `${root}/dockerd.pid`,
      "-H",
      host,
      "--bridge",
      "none",
      "--iptables=false",
      "--ip6tables=false",
      "--cgroup-parent",
      "sandbox-test-engine",
    ],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  const stop = async () => {
    // Everything in this engine is the test's own: its containers go first (no stop timeout).
    const all = await run(["docker", "ps", "--all", "--quiet"], {
      env: { DOCKER_HOST: host },
      timeoutMs: 30_000,
    });
    const ids = all.stdout.split("\n").filter(Boolean);
    if (ids.length > 0) {
      await run(["docker", "rm", "--force", "--volumes", ...ids], {
        env: { DOCKER_HOST: host },
        timeoutMs: 60_000,
      });
    }
    try {
      daemon.kill("SIGTERM");
    } catch {
      // Already gone.
    }
    const late = setTimeout(() => {
      try {
        daemon.kill("SIGKILL");
      } catch {
        // Gone meanwhile.
      }
    }, 30_000);
    await daemon.status;
    clearTimeout(late);
    // Whatever the daemon left mounted under its root must go before the root itself.
    const mounts = (await Deno.readTextFile("/proc/mounts")).split("\n").map((l) => l.split(" ")[1])
      .filter((m) => m?.startsWith(root));
    for (const mount of mounts.reverse()) await run(["umount", "-l", mount]);
    await Deno.remove(root, { recursive: true });
  };
  const deadline = Date.now() + ENGINE_START_MS;
  while (true) {
    const info = await run(["docker", "info", "--format", "{{.ServerVersion}}"], {
      env: { DOCKER_HOST: host },
      timeoutMs: 10_000,
    });
    if (info.exitCode === 0) return { host, stop };
    if (Date.now() > deadline) {
      await stop();
      throw new Error(
        `the second engine did not answer within ${ENGINE_START_MS} ms: ${info.stderr}`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

Deno.test({
  name:
    "the CLI works against a second engine reached through DOCKER_HOST: no network in the sandbox, proxies through the relay, over the exec stream or the mounted sockets",
  // Starting a daemon needs root: CI runs as root; elsewhere this runs only when it can.
  ignore: !IN_CI && (!DOCKER_AVAILABLE || Deno.uid() !== 0),
  async fn() {
    assert.ok(DOCKER_AVAILABLE, "CI is set but no Docker engine is reachable");
    assert.equal(Deno.uid(), 0, "this test starts a Docker daemon: run it as root");
    await using upstream = new FakeUpstream({ key: "sk-test-engine" });
    const server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      () => new Response("hello from the host\n"),
    );
    await using _server = Object.assign(server, { [Symbol.asyncDispose]: () => server.shutdown() });
    await using dir = await tempDir();
    // Short: the engine's sockets live under it.
    const root = await Deno.makeTempDir({ prefix: "sbx-engine-" });
    const bridgesBefore = hostBridges();
    const engine = await startEngine(root);
    try {
      // The base image cannot be pulled here: it goes over from the first engine.
      const save = spawn(["docker", "save", "sandbox-base:bookworm"]);
      const load = await run(["docker", "load"], {
        stdin: save.stdout,
        env: { DOCKER_HOST: engine.host },
      });
      assert.equal((await save.finished).exitCode, 0);
      assert.equal(load.exitCode, 0, explain(load));

      const profile = uniqueProfile("e2e-engine");
      const port = server.addr.port;
      const config = await writeConfig(
        dir.path,
        `profiles:
  ${profile}:
    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}
    sandbox:
      network:
        allow: ["allowed.test:${port}"]
        hosts: {allowed.test: 127.0.0.1}
`,
      );
      const env = {
        DOCKER_HOST: engine.host,
        [KEY_ENV]: "sk-test-engine",
        XDG_STATE_HOME: `${dir.path}/state`,
      };
      const script = [
        "ls /sys/class/net",
        `curl -s -m 10 -o /dev/null -w "llm %{http_code}\\n" -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`,
        `curl -sS -m 10 http://allowed.test:${port}/`,
      ].join("\n");
      for (const [transport, path] of [["stream", "stream"], ["auto", "socket"]]) {
        const result = await runCli(["exec", "--profile", profile, "--", "sh", "-c", script], {
          config,
          env: { ...env, SANDBOX_RELAY_TRANSPORT: transport, SANDBOX_TRACE: "1" },
          timeoutMs: 600_000,
        });
        assert.equal(result.exitCode, 0, explain(result));
        assert.match(result.stderr, new RegExp(`relay ready \\(${path} path\\)`), result.stderr);
        assert.deepEqual(result.stdout.trim().split("\n"), [
          "lo",
          "llm 200",
          "hello from the host",
        ]);
      }
      assert.equal(upstream.requests.length, 2);

      // The sandbox lives on the second engine, with no network, and not on the first.
      const there = await run([
        "docker",
        "inspect",
        "--format",
        "{{.HostConfig.NetworkMode}}",
        `sandbox-${profile}`,
      ], {
        env: { DOCKER_HOST: engine.host },
      });
      assert.equal(there.stdout.trim(), "none", explain(there));
      assert.equal(
        (await run(["docker", "inspect", `sandbox-${profile}`])).exitCode,
        1,
        "the sandbox is on the first engine",
      );
    } finally {
      await engine.stop();
    }
    // The second engine touched nothing of the first one's networking.
    assert.deepEqual(hostBridges(), bridgesBefore);
  },
});

/** The first engine's default bridge, if the host has it (other bridges come and go with other users' networks). */
function hostBridges(): string[] {
  return [
    ...new Set(Deno.networkInterfaces().map((i) => i.name).filter((name) => name === "docker0")),
  ];
}
