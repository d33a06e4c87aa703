/**
 * The relay is untrusted: it runs in the agent's container (as a uid of its own, so that the agent
 * cannot read or ptrace it: tests/security/relay_uid_test.ts). These tests do what whoever could
 * write into the relay's stream to the host could do — write their own frames into it — and what
 * the agent can do — replace the relay with one of its own — and show that it gains nothing: every
 * connection still needs the session token on the host, and a relay of its own reaches nothing at
 * all. Each beside its positive twin.
 */
import { relayTransportFor } from "../../lib/sandbox/providers.ts";
import assert from "node:assert/strict";
import { openSession } from "../../lib/proxy/session.ts";
import { DockerSandboxProvider, RELAY_USER } from "../../lib/sandbox/docker_provider.ts";
import { run } from "../../lib/process.ts";
import {
  assertDocker,
  DOCKER_AVAILABLE,
  dockerTest,
  explain,
  IN_CI,
  profileFrom,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  upstreamProfile,
  writeConfig,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("security: relay tests starting");

const KEY_ENV = "SANDBOX_TEST_RELAY_KEY";

/**
 * Runs inside the sandbox: finds the session's relay, and writes into its stdout (the stream to
 * the host) an OPEN of the credential proxy and one HTTP request with the token in
 * `$INJECT_TOKEN`, as one write (atomic: under the pipe's 4 KiB). The host's answer then arrives on
 * a stream that relay never opened, so it quits and the host starts another.
 * Frames: [type u8][stream id u32][length u32][payload] (lib/proxy/mux.ts).
 */
const INJECT = `
const token = Deno.env.get("INJECT_TOKEN");
const [pid] = [...Deno.readDirSync("/proc")].map((e) => e.name).filter((pid) => {
  try {
    const cmdline = Deno.readTextFileSync("/proc/" + pid + "/cmdline");
    return cmdline.startsWith("deno\\0run\\0") && cmdline.includes("/opt/sandbox/relay.js");
  } catch { return false; }
});
const frame = (type, id, payload) => {
  const bytes = new Uint8Array(9 + payload.length);
  const view = new DataView(bytes.buffer);
  view.setUint8(0, type); view.setUint32(1, id); view.setUint32(5, payload.length);
  bytes.set(payload, 9);
  return bytes;
};
const text = (s) => new TextEncoder().encode(s);
const id = 0x7fff0000;
const request = "GET /proxy/v1/models HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer " + token + "\\r\\nConnection: close\\r\\n\\r\\n";
// No FIN: like curl, the client keeps its side open until the answer came.
const parts = [frame(2, id, text("llm")), frame(3, id, text(request))];
const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
let at = 0; for (const p of parts) { all.set(p, at); at += p.length; }
const out = Deno.openSync("/proc/" + pid + "/fd/1", { write: true });
out.writeSync(all);
out.close();
console.log("injected into " + pid);
`;

function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  const late = new Promise<never>((
    _,
    reject,
  ) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

async function accessLog(path: string): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(path).catch(() => "");
  return text.split("\n").filter(Boolean).map((line) => JSON.parse(line));
}

Deno.test({
  name:
    "the agent cannot open the relay's stream to the host, and frames written into it (by the relay's own uid) reach the credential proxy only as any request does: without the session token, 401",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream({ key: "sk-test-inject" });
    await using dir = await tempDir();
    const name = uniqueProfile("sec-inject");
    const profile = upstreamProfile(name, upstream.baseUrl, KEY_ENV);
    const provider = new DockerSandboxProvider(profile);
    const logPath = `${dir.path}/access.ndjson`;
    const events: string[] = [];
    Deno.env.set(KEY_ENV, "sk-test-inject");
    try {
      await provider.ensureRunning();
      await using session = await openSession(profile, relayTransportFor(provider), {
        accessLogPath: logPath,
        onProgress: (line) => events.push(line),
      });
      await provider.writeFile("/tmp/inject.js", INJECT, { mode: 0o644 });
      // The agent itself cannot even open the relay's stream: the relay is another uid's.
      const refused = await provider.exec(["deno", "run", "-A", "/tmp/inject.js"], {
        env: { ...session.env, INJECT_TOKEN: session.token },
      });
      assert.notEqual(refused.exitCode, 0, refused.stdout);
      assert.match(
        refused.stderr,
        /PermissionDenied: Permission denied \(os error 13\): open '\/proc\/\d+\/fd\/1'/,
      );
      assert.equal(session.relay.starts, 1, "the relay carries on");
      // Whoever can (the relay's own uid; the token is passed by name, off the command line):
      const inject = async (token: string) => {
        const replaced = session.relay.nextReady();
        const result = await run([
          "docker",
          "exec",
          "--user",
          RELAY_USER,
          "--env",
          "INJECT_TOKEN",
          "--env",
          "DENO_DIR=/opt/sandbox/deno-dir",
          provider.containerName,
          "deno",
          "run",
          "-A",
          "/tmp/inject.js",
        ], { env: { INJECT_TOKEN: token } });
        assert.equal(result.exitCode, 0, result.stderr);
        assert.match(result.stdout, /^injected into \d+/);
        await within(replaced, 10_000, "the host replacing the relay");
      };
      // The attack: a made-up token. Then its twin: the same frames with the session's token.
      await inject("sbx_not_the_token");
      await inject(session.token);
      assert.equal(
        events.filter((line) => /relay ended.*restarting it/.test(line)).length,
        2,
        events.join("\n"),
      );

      const llm = (await accessLog(logPath)).filter((e) => e.kind === "llm");
      assert.deepEqual(llm.map((e) => e.decision), ["deny", "allow"], JSON.stringify(llm));
      assert.equal(llm[0].status, 401);
      // The twin was forwarded; whether its answer got back before the relay it went through
      // quit (on a stream it never opened) is a race: 200, or 499 for a client gone mid-answer.
      assert.ok([200, 499].includes(llm[1].status as number), JSON.stringify(llm[1]));
      assert.equal(
        upstream.requests.length,
        1,
        "only the request with the session token reaches the upstream",
      );
      assert.equal(upstream.requests[0].headers.get("authorization"), "Bearer sk-test-inject");
      // And the session works on after both.
      const after = await provider.exec(
        [
          "sh",
          "-c",
          `curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`,
        ],
        { env: session.env },
      );
      assert.equal(after.stdout, "200", after.stderr);
    } finally {
      Deno.env.delete(KEY_ENV);
      await removeProfile(name);
    }
  },
});

Deno.test({
  name: "a second relay the agent starts reaches nothing on the host",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream({ key: "sk-test-inject" });
    await using dir = await tempDir();
    const profile = uniqueProfile("sec-ownrelay");
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${profile}:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
    );
    const env = { [KEY_ENV]: upstream.key, XDG_STATE_HOME: `${dir.path}/state` };
    const request = (base: string) =>
      `curl -s -m 3 -o /dev/null -w '%{http_code} %{exitcode}\\n' -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "${base}/models"`;
    const script = [
      // Positive twin: through the session's relay, the request arrives.
      request("$SANDBOX_LLM_BASE_URL"),
      // The agent's own relay, the same program on ports of its own: its stream ends at the agent.
      // (Its stdin stays open, as a relay's does: it exits when its stdin ends.)
      `sleep 60 | deno run --quiet --no-config --allow-net=127.0.0.1 /opt/sandbox/relay.js llm=19380 >/tmp/own-relay.out 2>&1 &`,
      `for i in $(seq 100); do grep -q sandbox-relay /tmp/own-relay.out && break; sleep 0.1; done`,
      "grep -c sandbox-relay /tmp/own-relay.out",
      request("http://127.0.0.1:19380/proxy/v1"),
      "kill %1",
    ].join("\n");
    try {
      const result = await runCli(["exec", "--profile", profile, "--", "bash", "-c", script], {
        config,
        env,
      });
      assert.equal(result.exitCode, 0, explain(result));
      // 200 through the session's relay. The agent's relay listens (its READY went to the agent's
      // file) and takes the connection, but nothing carries it anywhere: curl times out (28), where
      // a port with no listener would have been refused (7).
      assert.deepEqual(result.stdout.trim().split("\n"), ["200 0", "1", "000 28"], result.stderr);
      assert.equal(
        upstream.requests.length,
        1,
        "a request through the agent's own relay reached the upstream",
      );
      const llm = (await accessLog(`${dir.path}/state/sandbox/access.ndjson`)).filter((e) =>
        e.kind === "llm"
      );
      assert.equal(llm.length, 1);
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "another user on the host cannot connect to a session's proxy sockets, in the container's mounted directory or kept to the stream; the session's own user can",
  // Acting as another user needs root: CI runs as root; elsewhere this runs only when it can.
  ignore: !IN_CI && (!DOCKER_AVAILABLE || Deno.uid() !== 0),
  async fn(t) {
    assertDocker();
    assert.equal(Deno.uid(), 0, "this test acts as another user: run it as root");
    await using dir = await tempDir();
    const name = uniqueProfile("sec-sockets");
    const profile = profileFrom(`profiles:\n  ${name}: {}\n`, name);
    const provider = new DockerSandboxProvider(profile);
    // The state and runtime directories go into a directory every user can enter, so that the
    // tool's own modes are the only thing between another user and the sockets.
    await Deno.chmod(dir.path, 0o755);
    const saved = {
      state: Deno.env.get("XDG_STATE_HOME"),
      runtime: Deno.env.get("XDG_RUNTIME_DIR"),
    };
    Deno.env.set("XDG_STATE_HOME", `${dir.path}/state`);
    Deno.env.set("XDG_RUNTIME_DIR", dir.path);
    const curl = (socket: string) => [
      "curl",
      "-s",
      "-m",
      "5",
      "-o",
      "/dev/null",
      "-w",
      "%{http_code} %{exitcode}",
      "--unix-socket",
      socket,
      "http://proxy/proxy/v1/models",
    ];
    const attack = async (session: { socketDir: string }) => {
      // The attack: another local user (nobody) dials the credential proxy's socket directly.
      const other = await run([
        "runuser",
        "-u",
        "nobody",
        "--",
        ...curl(`${session.socketDir}/llm.sock`),
      ]);
      assert.equal(
        other.stdout,
        "000 7",
        `another user reached the socket: ${other.stdout} ${other.stderr}`,
      );
      const listing = await run(["runuser", "-u", "nobody", "--", "ls", session.socketDir]);
      assert.match(listing.stderr, /Permission denied/);
      // Its twin: the session's own user, same request, reaches the proxy (401: no token).
      const own = await run(curl(`${session.socketDir}/llm.sock`));
      assert.equal(own.stdout, "401 0", own.stderr);
    };
    try {
      await provider.ensureRunning();
      await t.step("in the container's mounted directory (the socket path)", async () => {
        await using session = await openSession(profile, relayTransportFor(provider), {
          accessLogPath: `${dir.path}/access.ndjson`,
        });
        assert.equal(session.relay.transport, "socket");
        // The mounted directories are /tmp/sandbox-proxy-<hash>/<container's>/<session's>: the
        // sandbox user must reach the sockets, so below the 0700 top all may pass: it is what keeps
        // everyone else out. The other user can enter everything above it (/tmp).
        const top = session.socketDir.replace(/\/[^/]+\/[^/]+$/, "");
        assert.match(top, /^\/tmp\/sandbox-proxy-[^/]+$/, session.socketDir);
        assert.equal((await Deno.stat(top)).mode! & 0o777, 0o700);
        const parent = await run(["runuser", "-u", "nobody", "--", "ls", "/tmp"]);
        assert.equal(
          parent.exitCode,
          0,
          `the other user must be able to enter the parent: ${parent.stderr}`,
        );
        await attack(session);
      });
      await t.step("kept to the stream: a 0700 directory of the session's own", async () => {
        await using session = await openSession(profile, relayTransportFor(provider), {
          accessLogPath: `${dir.path}/access.ndjson`,
          relayTransport: "stream",
        });
        assert.equal(session.relay.transport, "stream");
        assert.ok(session.socketDir.startsWith(`${dir.path}/`), session.socketDir);
        assert.equal((await Deno.stat(session.socketDir)).mode! & 0o777, 0o700);
        const parent = await run(["runuser", "-u", "nobody", "--", "ls", dir.path]);
        assert.equal(
          parent.exitCode,
          0,
          `the other user must be able to enter the parent: ${parent.stderr}`,
        );
        await attack(session);
      });
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
