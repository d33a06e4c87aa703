/**
 * An isolated sandbox (network modes none and allowlist) has no network: only `lo`, on which only
 * the relay listens. Attacks from inside, each beside its positive control: the same probe, from
 * the same image, run in an ordinary container on a network this test creates, reaches the same
 * host server and resolver — so the sandbox's failure proves the defence, not a broken setup.
 *
 * Every target is on this machine: a server and a resolver the test starts on the host.
 */
import assert from "node:assert/strict";
import dgram from "node:dgram";
import { run } from "../../lib/process.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";

console.error("security: network tests starting");

/**
 * Runs inside a container (`deno eval PROBE MODE ARGS`) and prints one JSON line:
 * - `scan`: the network interfaces, and which loopback ports (IPv4 and IPv6, 1-65535) accept;
 * - `connect HOST:PORT...`: for each target, "ok <status> <body>" or the error's name and message;
 * - `resolve NAME HOST:PORT...`: for each resolver, the A records for NAME or the error, and how long it took.
 */
const PROBE = `
const [mode, ...args] = Deno.args;
const errorText = (e) => e.name + ": " + e.message;
const out = {};
if (mode === "scan") {
  out.interfaces = [...Deno.readDirSync("/sys/class/net")].map((e) => e.name).sort();
  for (const host of ["127.0.0.1", "::1"]) {
    const open = [];
    const ports = Array.from({ length: 65535 }, (_, i) => i + 1);
    const worker = async () => {
      for (let port = ports.pop(); port !== undefined; port = ports.pop()) {
        try {
          const conn = await Deno.connect({ hostname: host, port });
          // A connect to a free port in the ephemeral range can pick that very port as its source
          // and connect to itself (TCP simultaneous open): that is no listener.
          if (conn.localAddr.port !== port) open.push(port);
          conn.close();
        } catch { /* closed */ }
      }
    };
    await Promise.all(Array.from({ length: 256 }, worker));
    out[host] = open.sort((a, b) => a - b);
  }
} else if (mode === "connect") {
  for (const target of args) {
    const at = target.lastIndexOf(":");
    const hostname = target.slice(0, at).replace(/^\\[|\\]$/g, "");
    try {
      const conn = await Deno.connect({ hostname, port: Number(target.slice(at + 1)) });
      conn.close();
      const response = await fetch("http://" + target + "/", { signal: AbortSignal.timeout(5000) });
      out[target] = "ok " + response.status + " " + (await response.text()).trim();
    } catch (e) { out[target] = errorText(e); }
  }
} else if (mode === "resolve") {
  const [name, ...servers] = args;
  for (const server of servers) {
    const at = server.lastIndexOf(":");
    const started = performance.now();
    try {
      const records = await Deno.resolveDns(name, "A", { nameServer: { ipAddr: server.slice(0, at), port: Number(server.slice(at + 1)) } });
      out[server] = { answer: records, ms: Math.round(performance.now() - started) };
    } catch (e) { out[server] = { error: errorText(e), ms: Math.round(performance.now() - started) }; }
  }
}
console.log(JSON.stringify(out));
`;

/** A server on the host, on all interfaces, that says who it is. */
function hostServer(): Deno.HttpServer<Deno.NetAddr> & AsyncDisposable {
  const server = Deno.serve(
    { hostname: "0.0.0.0", port: 0, onListen: () => {} },
    () => new Response("hello from the host\n"),
  );
  return Object.assign(server, { [Symbol.asyncDispose]: () => server.shutdown() });
}

/** A DNS resolver on the host (UDP, all interfaces) that answers `probe.test A` with 10.9.8.7. */
async function hostResolver(): Promise<{ port: number } & AsyncDisposable> {
  const socket = dgram.createSocket("udp4");
  socket.on("message", (query: Uint8Array, peer: { address: string; port: number }) => {
    // Header (12 bytes), then the question: labels up to a zero byte, type and class.
    let end = 12;
    while (end < query.length && query[end] !== 0) end += query[end] + 1;
    const question = query.subarray(12, end + 5);
    const answer = new Uint8Array([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 9, 8, 7]);
    const reply = new Uint8Array(12 + question.length + answer.length);
    reply.set(query.subarray(0, 2)); // id
    reply.set([0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0], 2);
    reply.set(question, 12);
    reply.set(answer, 12 + question.length);
    socket.send(reply, peer.port, peer.address);
  });
  await new Promise<void>((resolve) => socket.bind(0, "0.0.0.0", resolve));
  return {
    port: socket.address().port,
    [Symbol.asyncDispose]: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

/** Every address of this host, IPv4 and global IPv6 (link-local ones need a scope to be named). */
function hostAddresses(): string[] {
  return [
    ...new Set(
      Deno.networkInterfaces().filter((i) => i.family === "IPv4" || !i.address.startsWith("fe80:"))
        .map((i) => i.address),
    ),
  ];
}

function target(address: string, port: number): string {
  return address.includes(":") ? `[${address}]:${port}` : `${address}:${port}`;
}

/** A network of the test's own, for the ordinary container of the positive controls. */
async function ordinaryNetwork(): Promise<{ name: string; gateway: string } & AsyncDisposable> {
  const name = `sandbox-test-ordinary-${crypto.randomUUID().slice(0, 8)}`;
  await docker("network", "create", name);
  const gateway = await docker(
    "network",
    "inspect",
    name,
    "--format",
    "{{(index .IPAM.Config 0).Gateway}}",
  );
  return {
    name,
    gateway,
    [Symbol.asyncDispose]: async () => void await run(["docker", "network", "rm", name]),
  };
}

/** The probe in an ordinary container: same image as the sandbox, same user, an ordinary network. */
async function probeOrdinary(
  image: string,
  network: string,
  args: string[],
): Promise<Record<string, unknown>> {
  const result = await run([
    "docker",
    "run",
    "--rm",
    "--network",
    network,
    "--user",
    "10001:10001",
    image,
    "deno",
    "eval",
    PROBE,
    ...args,
  ], {
    timeoutMs: 120_000,
  });
  assert.equal(result.exitCode, 0, explain(result));
  return JSON.parse(result.stdout);
}

async function probeSandbox(
  profile: string,
  config: string,
  env: Record<string, string>,
  args: string[],
) {
  const result = await runCli(
    ["exec", "--profile", profile, "--", "deno", "eval", PROBE, ...args],
    { config, env },
  );
  assert.equal(result.exitCode, 0, explain(result));
  return JSON.parse(result.stdout);
}

Deno.test({
  name:
    "an isolated sandbox has network mode none, only lo inside, and on loopback only the relay's ports answer",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const profile = uniqueProfile("sec-net");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
    try {
      const found = await probeSandbox(profile, config, { XDG_STATE_HOME: `${dir.path}/state` }, [
        "scan",
      ]);
      assert.deepEqual(found.interfaces, ["lo"]);
      // The default (allowlist) session: the credential proxy and the egress proxy; besides them
      // only, once the command runs, the next session's spare relay on the other range (which
      // carries nothing until a session claims it: tests/security/spare_relay_test.ts).
      assert.deepEqual(found["127.0.0.1"].filter((port: number) => port < 19100), [19080, 19081]);
      assert.deepEqual(
        found["127.0.0.1"].filter((port: number) => ![19080, 19081, 19180, 19181].includes(port)),
        [],
      );
      assert.deepEqual(found["::1"], []);
      const inspect = JSON.parse(await docker("container", "inspect", `sandbox-${profile}`))[0];
      assert.equal(inspect.HostConfig.NetworkMode, "none");
      assert.deepEqual(Object.keys(inspect.NetworkSettings.Networks), ["none"]);
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "a server on the host is unreachable from an isolated sandbox at every host address, and reachable from an ordinary container",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using server = hostServer();
    await using dir = await tempDir();
    await using network = await ordinaryNetwork();
    const port = server.addr.port;
    const profile = uniqueProfile("sec-host");
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${profile}: {sandbox: {network: {mode: none}}}\n`,
    );
    try {
      const addresses = [...hostAddresses(), network.gateway];
      const targets = addresses.map((a) => target(a, port));
      const found = await probeSandbox(profile, config, { XDG_STATE_HOME: `${dir.path}/state` }, [
        "connect",
        ...targets,
      ]);
      for (const address of addresses) {
        const outcome = found[target(address, port)];
        if (address === "127.0.0.1") {
          // The sandbox's own loopback: nothing of the host is there.
          assert.match(outcome, /^ConnectionRefused/, `${address}: ${outcome}`);
        } else if (address === "::1") {
          // The same, or no IPv6 loopback at all where the engine disables IPv6 in containers.
          assert.match(outcome, /^(ConnectionRefused|AddrNotAvailable)/, `${address}: ${outcome}`);
        } else if (address.includes(":")) {
          // No IPv6 at all inside (the engine disables it in containers), or no route.
          assert.match(
            outcome,
            /Network is unreachable|os error 101|AddrNotAvailable/,
            `${address}: ${outcome}`,
          );
        } else {
          // No route to anything: the kernel refuses before a packet leaves.
          assert.match(outcome, /Network is unreachable|os error 101/, `${address}: ${outcome}`);
        }
      }
      // Positive control: the same probe from the same image reaches the server on an ordinary network.
      const image = await docker(
        "container",
        "inspect",
        `sandbox-${profile}`,
        "--format",
        "{{.Config.Image}}",
      );
      const control = await probeOrdinary(image, network.name, [
        "connect",
        target(network.gateway, port),
      ]);
      assert.equal(control[target(network.gateway, port)], "ok 200 hello from the host");
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "names do not resolve in an isolated sandbox and fail fast, and a resolver on the host answers an ordinary container but not the sandbox",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using resolver = await hostResolver();
    await using dir = await tempDir();
    await using network = await ordinaryNetwork();
    const profile = uniqueProfile("sec-dns");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
    try {
      // Every host address but loopback (inside, 127.0.0.1 is the sandbox's own, not the host's).
      const servers = [
        ...hostAddresses().filter((a) => !a.includes(":") && a !== "127.0.0.1"),
        network.gateway,
      ]
        .map((a) => `${a}:${resolver.port}`);
      const found = await probeSandbox(profile, config, { XDG_STATE_HOME: `${dir.path}/state` }, [
        "resolve",
        "probe.test",
        ...servers,
      ]);
      for (const server of servers) {
        const outcome = found[server];
        assert.match(
          outcome.error ?? `answered ${JSON.stringify(outcome)}`,
          /Network is unreachable|os error 101/,
          server,
        );
        assert.ok(outcome.ms < 2_000, `${server}: the lookup took ${outcome.ms} ms`);
      }
      // The sandbox's own resolver configuration leads nowhere either, and says so at once.
      const started = performance.now();
      const getent = await runCli([
        "exec",
        "--profile",
        profile,
        "--",
        "sh",
        "-c",
        "getent hosts allowed.test || echo no-resolution",
      ], {
        config,
        env: { XDG_STATE_HOME: `${dir.path}/state` },
      });
      assert.equal(getent.stdout.trim(), "no-resolution", explain(getent));
      assert.ok(performance.now() - started < 10_000);

      const image = await docker(
        "container",
        "inspect",
        `sandbox-${profile}`,
        "--format",
        "{{.Config.Image}}",
      );
      const control = await probeOrdinary(image, network.name, [
        "resolve",
        "probe.test",
        `${network.gateway}:${resolver.port}`,
      ]);
      assert.deepEqual(
        (control[`${network.gateway}:${resolver.port}`] as { answer: string[] }).answer,
        ["10.9.8.7"],
      );
    } finally {
      await removeProfile(profile);
    }
  },
});
