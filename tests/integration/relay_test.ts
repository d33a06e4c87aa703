/**
 * Faults on the relay of a real sandbox session: whatever ends the exec stream (the relay killed
 * inside, the docker exec client killed on the host, the container restarted), a request in
 * flight fails at once — never hangs — and the next one works within about a second. On both
 * paths: the exec stream (kept to with `relayTransport: "stream"`, as a remote engine gets it) and
 * the mounted sockets (this engine is local), where the exec still holds the relay's lifetime. And
 * both ways the relay's exec is made: through the docker CLI (a client process on the host, which
 * can be killed) and through the engine's socket (lib/sandbox/engine_api.ts: no client process).
 */
import { relayTransportFor } from "../../lib/sandbox/providers.ts";
import assert from "node:assert/strict";
import { parseConfig, resolveProfile } from "../../lib/config.ts";
import { openSession } from "../../lib/proxy/session.ts";
import { DockerSandboxProvider, RELAY_USER } from "../../lib/sandbox/docker_provider.ts";
import { run } from "../../lib/process.ts";
import { engineSocket, resetEngineSocket } from "../../lib/sandbox/engine_api.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  removeProfile,
  tempDir,
  uniqueProfile,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("integration: relay fault tests starting");

const KEY_ENV = "SANDBOX_TEST_RELAY_KEY";

function profileFrom(yaml: string, name: string) {
  const result = parseConfig(yaml, undefined, () => undefined);
  if (result.kind !== "ok") throw new Error(JSON.stringify(result.issues));
  return resolveProfile(result.config, name);
}

function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  const late = new Promise<never>((
    _,
    reject,
  ) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** curl's answer to one LLM request from inside: "<http code> <curl exit code>". */
const REQUEST = `curl -s -m 60 -o /dev/null -w '%{http_code} %{exitcode}' ` +
  `-H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`;

/** Pids of processes on this host whose command line contains every one of `parts`. */
async function hostPids(...parts: string[]): Promise<number[]> {
  const pids: number[] = [];
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (parts.every((part) => cmdline.includes(part))) pids.push(Number(entry.name));
  }
  return pids;
}

const VARIANTS = [
  { transport: "stream", exec: "the docker CLI" },
  { transport: "stream", exec: "the engine's socket" },
  { transport: "socket", exec: "the docker CLI" },
] as const;

for (const { transport, exec } of VARIANTS) {
  Deno.test({
    name: transport === "stream"
      ? `when the relay's exec stream dies, an in-flight request fails at once and the next one works within a second (the stream path, the exec through ${exec})`
      : `on the socket path too, when the relay's exec ends, an in-flight request fails at once and the next one works within a second (the exec through ${exec})`,
    ...dockerTest(),
    async fn(t) {
      assertDocker();
      const cli = exec === "the docker CLI";
      const savedChoice = Deno.env.get("SANDBOX_DOCKER_API");
      if (cli) Deno.env.set("SANDBOX_DOCKER_API", "0");
      resetEngineSocket();
      // On a machine whose engine is the CLI's default one, the other way is the socket's.
      if (!cli && !Deno.env.get("DOCKER_HOST")) {
        assert.ok(engineSocket(), "the engine's socket is not used here");
      }
      await using upstream = new FakeUpstream({ key: "sk-test-relay" });
      await using dir = await tempDir();
      const name = uniqueProfile(`it-relay-${transport}`);
      const profile = profileFrom(
        `profiles:\n  ${name}:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
        name,
      );
      const provider = new DockerSandboxProvider(profile);
      const events: string[] = [];
      Deno.env.set(KEY_ENV, "sk-test-relay");
      try {
        await provider.ensureRunning();
        await using session = await openSession(profile, relayTransportFor(provider), {
          accessLogPath: `${dir.path}/access.ndjson`,
          onProgress: (line) => events.push(line),
          relayTransport: transport === "stream" ? "stream" : "auto",
        });
        assert.equal(session.relay.transport, transport);
        const request = () =>
          provider.exec(["sh", "-c", REQUEST], { env: session.env, timeoutMs: 90_000 });

        /** Start a request the upstream holds; end the exec with `fault`; see both outcomes. */
        const survive = async (fault: () => Promise<void>) => {
          upstream.behaviour = "hang";
          const arrived = upstream.nextRequest();
          const inFlight = request();
          await within(arrived, 10_000, "the request reaching the upstream");
          const restarted = session.relay.nextReady();
          await fault();
          // curl sees the connection end with nothing received: exit 52 (empty reply) or 56 (recv
          // error). Its own deadline is 60 s: an answer within 2 s is the connection failing.
          const failed = await within(inFlight, 2_000, "the in-flight request failing");
          assert.match(
            failed.stdout,
            /^000 (52|56)$/,
            `in-flight request: ${failed.stdout} ${failed.stderr}`,
          );
          await within(restarted, 1_000, "a new relay after the in-flight request failed");
          assert.equal(session.relay.transport, transport, "the new relay takes the same path");
          upstream.behaviour = "ok";
          const next = await request();
          assert.equal(next.stdout, "200 0", next.stderr);
        };

        await t.step("the relay killed inside the sandbox", async () => {
          const pids = (await docker(
            "exec",
            provider.containerName,
            "pgrep",
            "-f",
            "^deno run .*/opt/sandbox/relay.js",
          )).split("\n");
          assert.equal(pids.length, 1, `relay processes: ${pids}`);
          // Killed as its own uid: the sandbox user cannot (tests/security/relay_uid_test.ts).
          await survive(async () =>
            void await docker(
              "exec",
              "--user",
              RELAY_USER,
              provider.containerName,
              "kill",
              "-KILL",
              pids[0],
            )
          );
        });

        const clients = await hostPids("exec", provider.containerName, "/opt/sandbox/relay.js");
        if (cli) {
          await t.step("the docker exec client killed on the host", async () => {
            assert.equal(clients.length, 1, `docker exec clients of the relay: ${clients}`);
            await survive(() => Promise.resolve(Deno.kill(clients[0], "SIGKILL")));
          });
        } else {
          // Through the engine's socket there is no client process to kill: the stream is this one's.
          assert.equal(clients.length, 0, `docker exec clients of the relay: ${clients}`);
        }

        await t.step("the container restarted", async () => {
          const restarted = session.relay.nextReady();
          await docker("restart", "--time", "1", provider.containerName);
          const runningAt = performance.now();
          await within(restarted, 5_000, "a new relay after the container came back");
          assert.ok(
            performance.now() - runningAt < 2_000,
            "the relay took more than a second or so to come back",
          );
          assert.equal(session.relay.transport, transport);
          const next = await request();
          assert.equal(next.stdout, "200 0", next.stderr);
        });
        assert.ok(
          events.some((line) => /relay ended.*restarting it/.test(line)),
          events.join("\n"),
        );
        assert.ok(session.relay.starts >= (cli ? 4 : 3), `starts: ${session.relay.starts}`);
      } finally {
        Deno.env.delete(KEY_ENV);
        if (savedChoice === undefined) Deno.env.delete("SANDBOX_DOCKER_API");
        else Deno.env.set("SANDBOX_DOCKER_API", savedChoice);
        resetEngineSocket();
        await removeProfile(name);
      }
    },
  });
}

Deno.test({
  name:
    "a session's sockets are in a directory only this user can enter, even when the state directory's path is too long for a socket, and close() removes it and ends the relay",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const name = uniqueProfile("it-relay-close");
    const profile = profileFrom(`profiles:\n  ${name}: {}\n`, name);
    const provider = new DockerSandboxProvider(profile);
    const saved = {
      state: Deno.env.get("XDG_STATE_HOME"),
      runtime: Deno.env.get("XDG_RUNTIME_DIR"),
    };
    // A state directory whose sockets would not fit in sun_path (108 bytes).
    const longState = `${dir.path}/${"s".repeat(80)}`;
    Deno.env.set("XDG_STATE_HOME", longState);
    Deno.env.delete("XDG_RUNTIME_DIR");
    try {
      await provider.ensureRunning();
      const session = await openSession(profile, relayTransportFor(provider), {
        accessLogPath: `${dir.path}/access.ndjson`,
      });
      assert.ok(!session.socketDir.startsWith(longState), session.socketDir);
      // In the container's mounted directory, the session's own is 0711 (the sandbox user goes
      // through to its sockets); the directory above it, this user's only, keeps everyone else out.
      const parent = session.socketDir.replace(/\/[^/]+\/[^/]+$/, "");
      const closed = session.sandboxSocketDir ? parent : session.socketDir;
      assert.equal((await Deno.stat(closed)).mode! & 0o777, 0o700, closed);
      const sockets = [...Deno.readDirSync(session.socketDir)].map((e) => e.name).sort();
      assert.deepEqual(sockets, ["egress.sock", "llm.sock"]);
      const before = await run([
        "docker",
        "exec",
        provider.containerName,
        "pgrep",
        "-f",
        "/opt/sandbox/relay.js",
      ]);
      assert.equal(
        before.stdout.trim().split("\n").length,
        2,
        `the wrapper and the relay: ${before.stdout}`,
      );

      await within(session.close(), 5_000, "close");
      const after = await run([
        "docker",
        "exec",
        provider.containerName,
        "pgrep",
        "-f",
        "/opt/sandbox/relay.js",
      ]);
      assert.equal(after.stdout.trim(), "", `left running: ${after.stdout}`);
      assert.deepEqual(await hostPids("exec", provider.containerName, "/opt/sandbox/relay.js"), []);
      await assert.rejects(() => Deno.stat(session.socketDir), Deno.errors.NotFound);
    } finally {
      for (
        const [variable, value] of [["XDG_STATE_HOME", saved.state], [
          "XDG_RUNTIME_DIR",
          saved.runtime,
        ]] as const
      ) {
        if (value === undefined) Deno.env.delete(variable);
        else Deno.env.set(variable, value);
      }
      await removeProfile(name);
    }
  },
});

Deno.test({
  name:
    "a container made without the socket mount (by an older version, or where the engine could not bind it) carries the session over the exec stream",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream({ key: "sk-test-relay" });
    await using dir = await tempDir();
    const name = uniqueProfile("it-relay-nomount");
    const profile = profileFrom(
      `profiles:\n  ${name}:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
      name,
    );
    Deno.env.set(KEY_ENV, "sk-test-relay");
    try {
      await new DockerSandboxProvider(profile, { proxyMount: false }).ensureRunning();
      const mounts = await docker(
        "inspect",
        "--format",
        "{{range .Mounts}}{{.Destination}} {{end}}",
        `sandbox-${name}`,
      );
      assert.doesNotMatch(mounts, /sandbox-proxy/);
      // A later process, which would mount the directory: the container is current (the mount is
      // no part of its configuration), so it is kept, and the relay finds no socket.
      const provider = new DockerSandboxProvider(profile);
      await provider.ensureRunning();
      assert.ok(provider.wasRunning, "the container without the mount was replaced");
      await using session = await openSession(profile, relayTransportFor(provider), {
        accessLogPath: `${dir.path}/access.ndjson`,
      });
      assert.equal(session.relay.transport, "stream");
      const result = await provider.exec(["sh", "-c", REQUEST], {
        env: session.env,
        timeoutMs: 60_000,
      });
      assert.equal(result.stdout, "200 0", result.stderr);
      assert.equal(upstream.requests.length, 1);
    } finally {
      Deno.env.delete(KEY_ENV);
      await removeProfile(name);
    }
  },
});
