/**
 * The relay's host end with the real relay program (relay/main.ts) run as a local process: its
 * loopback ports stand in for the sandbox's, Unix socket servers for the proxies. No Docker.
 */
import assert from "node:assert/strict";
import { encodeFrame, FRAME, PROTOCOL } from "../../lib/proxy/mux.ts";
import {
  type RelayLauncher,
  relayPermissions,
  type RelayProcess,
  startRelay,
} from "../../lib/proxy/relay_host.ts";
import { SandboxError } from "../../lib/errors.ts";
import { localRelayArgv } from "../../lib/sandbox/local/relay.ts";
import { tempDir } from "../_helpers.ts";

const RELAY_MAIN = new URL("../../relay/main.ts", import.meta.url).pathname;
const encoder = new TextEncoder();

/**
 * The relay as a local process; each launch is recorded so that a test can kill it by pid. It gets
 * the permissions the docker launcher gives it (`relayPermissions`).
 */
function localRelay(launched: Deno.ChildProcess[] = []): RelayLauncher {
  return launcher(
    (
      args,
    ) => [
      Deno.execPath(),
      "run",
      "--quiet",
      "--no-config",
      ...relayPermissions(args),
      RELAY_MAIN,
      ...args,
    ],
    launched,
  );
}

/** Mode local's relay (lib/sandbox/local/relay.ts) as a local process: the socket path only. */
function perlRelay(launched: Deno.ChildProcess[] = []): RelayLauncher {
  return launcher(localRelayArgv, launched);
}

function launcher(
  argvOf: (args: string[]) => string[],
  launched: Deno.ChildProcess[],
): RelayLauncher {
  return (args) => {
    const [program, ...rest] = argvOf(args);
    const child = new Deno.Command(program, {
      args: rest,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    launched.push(child);
    return processOf(child);
  };
}

/** The relays that carry connections to the mounted sockets: the tests of that path run on each. */
const SOCKET_RELAYS = [["relay/main.ts", localRelay], [
  "mode local's Perl relay",
  perlRelay,
]] as const;

function processOf(child: Deno.ChildProcess): RelayProcess {
  const writer = child.stdin.getWriter();
  const stderr = new Response(child.stderr).text();
  return {
    input: child.stdout,
    output: (bytes) => writer.write(bytes),
    closeInput: () => writer.close(),
    finished: child.status.then(async (status) => ({
      exitCode: status.code,
      stderrTail: await stderr,
    })),
    kill: () => {
      try {
        child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
      return Promise.resolve();
    },
  };
}

/** A base port whose next two ports are free too (the relay takes base, base+1, base+2). */
function freeBase(): number {
  while (true) {
    const probes: Deno.TcpListener[] = [];
    try {
      const first = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      probes.push(first);
      if (first.addr.port > 65_000) continue;
      probes.push(Deno.listen({ hostname: "127.0.0.1", port: first.addr.port + 1 }));
      probes.push(Deno.listen({ hostname: "127.0.0.1", port: first.addr.port + 2 }));
      return first.addr.port;
    } catch {
      // Taken: try another.
    } finally {
      for (const probe of probes) probe.close();
    }
  }
}

/** An HTTP server on a Unix socket: the stand-in for a proxy. */
function unixServer(path: string, handler: (req: Request) => Response | Promise<Response>) {
  const server = Deno.serve({ path, onListen: () => {} }, handler);
  return Object.assign(server, { [Symbol.asyncDispose]: () => server.shutdown() });
}

function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  const late = new Promise<never>((
    _,
    reject,
  ) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

Deno.test("startRelay() returns once the relay listens, and each port reaches only its own service's socket", async () => {
  await using dir = await tempDir();
  await using _llm = unixServer(
    `${dir.path}/llm.sock`,
    (req) => new Response(`llm ${new URL(req.url).pathname}`),
  );
  await using _egress = unixServer(`${dir.path}/egress.sock`, () => new Response("egress"));
  const base = freeBase();
  await using relay = await startRelay({
    sockets: { llm: `${dir.path}/llm.sock`, egress: `${dir.path}/egress.sock` },
    launch: localRelay(),
    basePort: base,
  });
  assert.deepEqual(relay.ports, { llm: base, egress: base + 1 });
  // No race with the relay: the first request right after start is served.
  const llm = await fetch(`http://127.0.0.1:${base}/proxy/v1/models`);
  assert.equal(await llm.text(), "llm /proxy/v1/models");
  assert.equal(await (await fetch(`http://127.0.0.1:${base + 1}/`)).text(), "egress");
  // The git service was not asked for: nothing listens on its port.
  await assert.rejects(
    () => Deno.connect({ hostname: "127.0.0.1", port: base + 2 }),
    Deno.errors.ConnectionRefused,
  );
});

Deno.test("a stalled download does not stall another request, and half-closed requests still get their answer", async () => {
  await using dir = await tempDir();
  const chunk = new Uint8Array(64 * 1024).fill(120);
  await using _server = unixServer(`${dir.path}/llm.sock`, async (req) => {
    if (new URL(req.url).pathname === "/endless") {
      // Writes for as long as anyone reads: the client below never does.
      return new Response(new ReadableStream({ pull: (controller) => controller.enqueue(chunk) }));
    }
    return new Response(`got ${(await req.text()).length} bytes`);
  });
  await using relay = await startRelay({
    sockets: { llm: `${dir.path}/llm.sock` },
    launch: localRelay(),
    basePort: freeBase(),
  });
  const port = relay.ports.llm!;

  const stalled = await Deno.connect({ hostname: "127.0.0.1", port });
  await stalled.write(encoder.encode("GET /endless HTTP/1.1\r\nHost: x\r\n\r\n"));
  const first = new Uint8Array(1024);
  assert.ok(await within(stalled.read(first), 5_000, "first bytes of the download"));
  // The download has filled every buffer on its way by now; requests on other streams go on.
  for (let i = 0; i < 20; i++) {
    const answer = await fetch(`http://127.0.0.1:${port}/small`, {
      method: "POST",
      body: "x".repeat(i * 100),
    });
    assert.equal(
      await within(answer.text(), 2_000, `request ${i} beside the stalled download`),
      `got ${i * 100} bytes`,
    );
  }

  // Half-close: the request ends with the client's FIN, and the answer still comes back.
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  await conn.write(
    encoder.encode(
      "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    ),
  );
  await conn.closeWrite();
  const answer = await within(new Response(conn.readable).text(), 5_000, "answer after half-close");
  assert.match(answer, /^HTTP\/1\.1 200 OK\r\n/);
  assert.match(answer, /got 5 bytes$/);
  stalled.close();
});

Deno.test("killing the relay mid-request fails the request at once, and a new relay on the same port serves the next one within a second", async () => {
  await using dir = await tempDir();
  let arrived!: () => void;
  const requestArrived = new Promise<void>((resolve) => (arrived = resolve));
  const neverAnswered = Promise.withResolvers<Response>();
  await using _server = unixServer(`${dir.path}/llm.sock`, (req) => {
    if (new URL(req.url).pathname === "/slow") {
      arrived();
      return neverAnswered.promise;
    }
    return new Response("fresh");
  });
  const launched: Deno.ChildProcess[] = [];
  const events: string[] = [];
  await using relay = await startRelay({
    sockets: { llm: `${dir.path}/llm.sock` },
    launch: localRelay(launched),
    basePort: freeBase(),
    onEvent: (message) => events.push(message),
  });
  const port = relay.ports.llm!;
  const inFlight = fetch(`http://127.0.0.1:${port}/slow`).then((r) => r.text());
  await within(requestArrived, 5_000, "the slow request reaching the server");
  const restarted = relay.nextReady();
  const killedAt = performance.now();
  launched[0].kill("SIGKILL");
  await assert.rejects(() => within(inFlight, 2_000, "the in-flight request failing"), TypeError);
  await within(restarted, 1_000, "a new relay");
  const answer = await fetch(`http://127.0.0.1:${port}/fresh`);
  assert.equal(await answer.text(), "fresh");
  assert.ok(
    performance.now() - killedAt < 1_500,
    "the next request took more than a second after the kill",
  );
  assert.equal(relay.starts, 2);
  assert.equal(launched.length, 2);
  assert.match(events.join("\n"), /relay ended.*restarting it/);
  neverAnswered.resolve(new Response("too late"));
});

Deno.test("a relay that sends garbage is cut off and replaced; the host process carries on", async () => {
  await using dir = await tempDir();
  await using _server = unixServer(`${dir.path}/llm.sock`, () => new Response("ok"));
  const events: string[] = [];
  let launches = 0;
  const real = localRelay();
  let hostileEnded!: (code: number) => void;
  const hostileFinished = new Promise<{ exitCode: number; stderrTail: string }>((resolve) =>
    hostileEnded = (exitCode) => resolve({ exitCode, stderrTail: "" })
  );
  const garbage = Promise.withResolvers<void>();
  const hostile: RelayProcess = {
    // READY, then garbage when the test says so; ends only when the host closes its input.
    input: (async function* () {
      yield encodeFrame(FRAME.READY, 0, encoder.encode(PROTOCOL));
      await garbage.promise;
      yield encoder.encode("GET / HTTP/1.1\r\n\r\n not a frame at all");
      await hostileFinished;
    })(),
    output: () => Promise.resolve(),
    closeInput: () => {
      hostileEnded(0);
      return Promise.resolve();
    },
    finished: hostileFinished,
    kill: () => Promise.resolve(hostileEnded(137)),
  };
  await using relay = await startRelay({
    sockets: { llm: `${dir.path}/llm.sock` },
    launch: (args) => launches++ === 0 ? hostile : real(args),
    basePort: freeBase(),
    onEvent: (message) => events.push(message),
  });
  const restarted = relay.nextReady();
  garbage.resolve();
  await within(restarted, 5_000, "a replacement relay");
  assert.match(events[0], /relay ended \(unknown frame type 71\)/);
  assert.equal(await (await fetch(`http://127.0.0.1:${relay.ports.llm}/`)).text(), "ok");
});

Deno.test("a base port in use moves the relay to the next range; a relay that cannot start is an error with its stderr", async (t) => {
  await using dir = await tempDir();
  await using _server = unixServer(`${dir.path}/llm.sock`, () => new Response("ok"));
  await t.step("port in use", async () => {
    const base = freeBase();
    using _taken = Deno.listen({ hostname: "127.0.0.1", port: base });
    await using relay = await startRelay({
      sockets: { llm: `${dir.path}/llm.sock` },
      launch: localRelay(),
      basePort: base,
    });
    assert.equal(relay.ports.llm, base + 100);
    assert.equal(await (await fetch(`http://127.0.0.1:${base + 100}/`)).text(), "ok");
  });
  await t.step("exits before listening", async () => {
    const failing: RelayLauncher = () => {
      const child = new Deno.Command(Deno.execPath(), {
        args: ["eval", "console.error('relay.js: module not found'); Deno.exit(1)"],
        stdin: "piped",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      return processOf(child);
    };
    const error = await startRelay({
      sockets: { llm: `${dir.path}/llm.sock` },
      launch: failing,
      sandboxName: "sandbox-x",
    })
      .then(() => undefined, (e) => e);
    assert.ok(error instanceof SandboxError, String(error));
    assert.equal(error.code, "exec_failed");
    assert.match(
      error.message,
      /^Cannot start the relay in sandbox "sandbox-x": it exited with code 1 before listening$/,
    );
    assert.match(error.detail ?? "", /module not found/);
  });
  await t.step(
    "is not the relay at all: the engine's words on its stdout are the reason, not frames",
    async () => {
      // As Docker's API answers an exec into a container that stopped meanwhile: text on the stream.
      const engine: RelayLauncher = () => {
        const child = new Deno.Command(Deno.execPath(), {
          args: [
            "eval",
            "await Deno.stdout.write(new TextEncoder().encode('cannot exec in a stopped state: unknown\\n')); Deno.exit(126)",
          ],
          stdin: "piped",
          stdout: "piped",
          stderr: "piped",
        }).spawn();
        return processOf(child);
      };
      const error = await startRelay({
        sockets: { llm: `${dir.path}/llm.sock` },
        launch: engine,
        sandboxName: "sandbox-x",
      })
        .then(() => undefined, (e) => e);
      assert.ok(error instanceof SandboxError, String(error));
      assert.equal(
        error.message,
        'Cannot start the relay in sandbox "sandbox-x": it did not start: cannot exec in a stopped state: unknown',
      );
    },
  );
});

Deno.test("close() ends the relay process and frees its ports", async () => {
  await using dir = await tempDir();
  await using _server = unixServer(`${dir.path}/llm.sock`, () => new Response("ok"));
  const launched: Deno.ChildProcess[] = [];
  const relay = await startRelay({
    sockets: { llm: `${dir.path}/llm.sock` },
    launch: localRelay(launched),
    basePort: freeBase(),
  });
  const port = relay.ports.llm!;
  assert.equal(await (await fetch(`http://127.0.0.1:${port}/`)).text(), "ok");
  await within(relay.close(), 5_000, "close");
  const status = await within(launched[0].status, 2_000, "relay exit");
  assert.equal(status.code, 0, "the relay should exit on its own when its stdin ends");
  await assert.rejects(
    () => Deno.connect({ hostname: "127.0.0.1", port }),
    Deno.errors.ConnectionRefused,
  );
  assert.equal(launched.length, 1, "a closed relay must not be restarted");
});

for (const [relayName, relayOf] of SOCKET_RELAYS) {
  Deno.test(`${relayName}: with the sockets reachable where the sandbox sees them, the relay connects to them itself and says so; each port reaches only its own service`, async () => {
    // Two directories: where the host end would carry streams (answers "stream …"), and the one
    // mounted into the sandbox (answers "socket …"): which one answers shows the path taken.
    await using host = await tempDir();
    await using mounted = await tempDir();
    const servers = [];
    for (const [dir, word] of [[host.path, "stream"], [mounted.path, "socket"]]) {
      for (const service of ["llm", "egress"]) {
        servers.push(
          unixServer(
            `${dir}/${service}.sock`,
            (req) => new Response(`${word} ${service} ${new URL(req.url).pathname}`),
          ),
        );
      }
    }
    try {
      await using relay = await startRelay({
        sockets: { llm: `${host.path}/llm.sock`, egress: `${host.path}/egress.sock` },
        sandboxSocketDir: mounted.path,
        launch: relayOf(),
        basePort: freeBase(),
      });
      assert.equal(relay.transport, "socket");
      assert.equal(
        await (await fetch(`http://127.0.0.1:${relay.ports.llm}/proxy/v1/models`)).text(),
        "socket llm /proxy/v1/models",
      );
      assert.equal(
        await (await fetch(`http://127.0.0.1:${relay.ports.egress}/x`)).text(),
        "socket egress /x",
      );
    } finally {
      for (const server of servers) await server.shutdown();
    }
  });
}

Deno.test("when any service's socket does not answer where the sandbox would see it, the relay carries everything over the stream", async (t) => {
  await using host = await tempDir();
  await using mounted = await tempDir();
  await using _llm = unixServer(`${host.path}/llm.sock`, () => new Response("stream llm"));
  await using _egress = unixServer(`${host.path}/egress.sock`, () => new Response("stream egress"));
  const cases: [string, string][] = [
    ["only one of the two sockets is there", mounted.path],
    ["the directory does not exist (no mount)", `${mounted.path}/absent`],
  ];
  await using _mountedLlm = unixServer(
    `${mounted.path}/llm.sock`,
    () => new Response("socket llm"),
  );
  for (const [name, dir] of cases) {
    await t.step(name, async () => {
      await using relay = await startRelay({
        sockets: { llm: `${host.path}/llm.sock`, egress: `${host.path}/egress.sock` },
        sandboxSocketDir: dir,
        launch: localRelay(),
        basePort: freeBase(),
      });
      assert.equal(relay.transport, "stream");
      assert.equal(
        await (await fetch(`http://127.0.0.1:${relay.ports.llm}/`)).text(),
        "stream llm",
      );
      assert.equal(
        await (await fetch(`http://127.0.0.1:${relay.ports.egress}/`)).text(),
        "stream egress",
      );
    });
  }
});

for (const [relayName, relayOf] of SOCKET_RELAYS) {
  Deno.test(`${relayName}: on the socket path, bytes arrive intact and in order both ways, and a half-close is passed on while the answer still comes back`, async () => {
    await using dir = await tempDir();
    const size = 48 * 1024 * 1024;
    const body = pattern(size);
    // A raw server: it answers what it received only once it has read to the end, which it sees
    // only if the relay passes the client's half-close on.
    const listener = Deno.listen({ transport: "unix", path: `${dir.path}/llm.sock` });
    const serving = (async () => {
      for await (const conn of listener) {
        (async () => {
          const first = new Uint8Array(1);
          if (await conn.read(first) === null) return conn.close();
          if (first[0] === "D".charCodeAt(0)) {
            await writeAll(conn, body);
          } else {
            let got = 1, sum = checksum(0, first);
            const buffer = new Uint8Array(256 * 1024);
            for (let n = await conn.read(buffer); n !== null; n = await conn.read(buffer)) {
              got += n;
              sum = checksum(sum, buffer.subarray(0, n));
            }
            await writeAll(conn, encoder.encode(`got ${got} bytes, sum ${sum}`));
          }
          conn.close();
        })().catch(() => {});
      }
    })();
    try {
      await using relay = await startRelay({
        sockets: { llm: `${dir.path}/llm.sock` },
        sandboxSocketDir: dir.path,
        launch: relayOf(),
        basePort: freeBase(),
      });
      assert.equal(relay.transport, "socket");
      const exchange = async (request: Uint8Array) => {
        const conn = await Deno.connect({ hostname: "127.0.0.1", port: relay.ports.llm! });
        const writing = writeAll(conn, request).then(() => conn.closeWrite());
        const answer = new Uint8Array(
          await within(new Response(conn.readable).arrayBuffer(), 20_000, "answer"),
        );
        await writing;
        return answer;
      };
      const downloaded = await exchange(encoder.encode("D"));
      assert.equal(downloaded.length, size);
      assert.ok(downloaded.every((byte, i) => byte === body[i]), "the download arrived changed");
      const upload = pattern(8 * 1024 * 1024, 3);
      upload[0] = "U".charCodeAt(0);
      const answer = new TextDecoder().decode(await exchange(upload));
      assert.equal(answer, `got ${upload.length} bytes, sum ${checksum(0, upload)}`);
    } finally {
      listener.close();
      await serving;
    }
  });
}

function pattern(size: number, seed = 7): Uint8Array {
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 31 + seed) & 0xff;
  return bytes;
}

function checksum(sum: number, bytes: Uint8Array): number {
  for (let i = 0; i < bytes.length; i++) sum = (sum * 33 + bytes[i]) >>> 0;
  return sum;
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let rest = bytes;
  while (rest.length > 0) rest = rest.subarray(await conn.write(rest));
}

for (const [relayName, relayOf] of SOCKET_RELAYS) {
  Deno.test(`${relayName}: on the socket path, killing the relay mid-request fails the request at once, and a new relay serves the next one within a second, on the sockets again`, async () => {
    await using dir = await tempDir();
    const arrived = Promise.withResolvers<void>();
    const neverAnswered = Promise.withResolvers<Response>();
    await using _server = unixServer(`${dir.path}/llm.sock`, (req) => {
      if (new URL(req.url).pathname === "/slow") {
        arrived.resolve();
        return neverAnswered.promise;
      }
      return new Response("fresh");
    });
    // Answered at the end, whatever failed: the server's shutdown waits for every request.
    using _answered = { [Symbol.dispose]: () => neverAnswered.resolve(new Response("too late")) };
    const launched: Deno.ChildProcess[] = [];
    await using relay = await startRelay({
      sockets: { llm: `${dir.path}/llm.sock` },
      sandboxSocketDir: dir.path,
      launch: relayOf(launched),
      basePort: freeBase(),
    });
    assert.equal(relay.transport, "socket");
    const port = relay.ports.llm!;
    const inFlight = fetch(`http://127.0.0.1:${port}/slow`).then((r) => r.text());
    await within(arrived.promise, 5_000, "the slow request reaching the server");
    const restarted = relay.nextReady();
    const killedAt = performance.now();
    launched[0].kill("SIGKILL");
    await assert.rejects(() => within(inFlight, 2_000, "the in-flight request failing"), TypeError);
    await within(restarted, 1_000, "a new relay");
    assert.equal(await (await fetch(`http://127.0.0.1:${port}/fresh`)).text(), "fresh");
    assert.ok(
      performance.now() - killedAt < 1_500,
      "the next request took more than a second after the kill",
    );
    assert.equal(relay.transport, "socket");
    assert.equal(relay.starts, 2);
  });
}

for (const [relayName, relayOf] of SOCKET_RELAYS) {
  Deno.test(`${relayName}: on the socket path, closing the relay's stdin (the session closing) ends the relay and every connection it carried`, async () => {
    await using dir = await tempDir();
    const arrived = Promise.withResolvers<void>();
    const neverAnswered = Promise.withResolvers<Response>();
    await using _server = unixServer(`${dir.path}/llm.sock`, () => {
      arrived.resolve();
      return neverAnswered.promise;
    });
    // Answered at the end, whatever failed: the server's shutdown waits for every request.
    using _answered = { [Symbol.dispose]: () => neverAnswered.resolve(new Response("too late")) };
    const launched: Deno.ChildProcess[] = [];
    const relay = await startRelay({
      sockets: { llm: `${dir.path}/llm.sock` },
      sandboxSocketDir: dir.path,
      launch: relayOf(launched),
      basePort: freeBase(),
    });
    assert.equal(relay.transport, "socket");
    const inFlight = fetch(`http://127.0.0.1:${relay.ports.llm}/slow`).then((r) => r.text());
    // Its failure is awaited below, after close(): seen now so that it is never unhandled.
    const failed = inFlight.then(() => undefined, (error) => error);
    await within(arrived.promise, 5_000, "the request reaching the server");
    await within(relay.close(), 5_000, "close");
    assert.equal((await within(launched[0].status, 2_000, "relay exit")).code, 0);
    assert.ok((await within(failed, 2_000, "the in-flight request failing")) instanceof TypeError);
  });
}

for (const [relayName, relayOf] of SOCKET_RELAYS) {
  Deno.test(`${relayName}: on the socket path, a stalled download stalls no other connection, and a base port in use moves the relay to the next range`, async () => {
    await using dir = await tempDir();
    const chunk = new Uint8Array(64 * 1024).fill(120);
    await using _server = unixServer(`${dir.path}/llm.sock`, async (req) => {
      if (new URL(req.url).pathname === "/endless") {
        // Writes for as long as anyone reads: the client below never does.
        return new Response(
          new ReadableStream({ pull: (controller) => controller.enqueue(chunk) }),
        );
      }
      return new Response(`got ${(await req.text()).length} bytes`);
    });
    const base = freeBase();
    using _taken = Deno.listen({ hostname: "127.0.0.1", port: base });
    await using relay = await startRelay({
      sockets: { llm: `${dir.path}/llm.sock` },
      sandboxSocketDir: dir.path,
      launch: relayOf(),
      basePort: base,
    });
    assert.equal(relay.transport, "socket");
    assert.equal(relay.ports.llm, base + 100);
    const port = relay.ports.llm!;
    const stalled = await Deno.connect({ hostname: "127.0.0.1", port });
    await stalled.write(encoder.encode("GET /endless HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert.ok(
      await within(stalled.read(new Uint8Array(1024)), 5_000, "first bytes of the download"),
    );
    // Long enough for the download to fill every buffer on its way.
    await new Promise((resolve) => setTimeout(resolve, 300));
    const answers = await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const answer = await fetch(`http://127.0.0.1:${port}/small`, {
          method: "POST",
          body: "x".repeat(i * 1000),
        });
        return await within(answer.text(), 5_000, `request ${i} beside the stalled download`);
      }),
    );
    assert.deepEqual(answers, Array.from({ length: 20 }, (_, i) => `got ${i * 1000} bytes`));
    stalled.close();
  });
}

Deno.test("mode local's Perl relay: its program compiles under strict and warnings, and it refuses what it cannot carry", async (t) => {
  await t.step("perl -Mstrict -Mwarnings -c: no error, no warning", async () => {
    const [perl, , program] = localRelayArgv([]);
    const checked = await new Deno.Command(perl, {
      args: ["-Mstrict", "-Mwarnings", "-c", "-e", program],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(new TextDecoder().decode(checked.stderr), "-e syntax OK\n");
    assert.equal(checked.code, 0);
  });
  await using dir = await tempDir();
  const cases: [string, string[], number, RegExp][] = [
    [
      "no --sockets (it has no stream path)",
      ["llm=19080"],
      2,
      /--sockets DIR and a SERVICE=PORT are needed/,
    ],
    [
      "an unknown argument",
      ["--sockets", dir.path, "--spare", "llm=19080"],
      2,
      /unexpected argument "--spare"/,
    ],
    [
      "a socket directory it would not name",
      ["--sockets", "../x", "llm=19080"],
      2,
      /invalid socket directory/,
    ],
    [
      "a proxy socket that does not answer",
      ["--sockets", dir.path, "llm=19080"],
      1,
      /llm\.sock does not answer/,
    ],
  ];
  for (const [name, args, code, said] of cases) {
    await t.step(name, async () => {
      const [perl, ...rest] = localRelayArgv(args);
      const ended = await new Deno.Command(perl, {
        args: rest,
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(ended.code, code);
      assert.equal(ended.stdout.length, 0, "it said READY");
      assert.match(new TextDecoder().decode(ended.stderr), said);
    });
  }
});

Deno.test("mode local's Perl relay: with no descriptor left it waits instead of spinning on its listener, and every connection it could not carry yet is carried once others end (twin)", async (t) => {
  // Each connection takes two descriptors: the last one free is either taken by a connection that
  // then waits for its proxy's socket, or by none (accept fails). Two limits, one of each.
  for (const limit of [12, 13]) {
    await t.step(`${limit} descriptors`, async () => {
      await using dir = await tempDir();
      await using _server = unixServer(`${dir.path}/llm.sock`, () => new Response("answered"));
      const launched: Deno.ChildProcess[] = [];
      const limited = (args: string[]) => ["prlimit", `--nofile=${limit}`, ...localRelayArgv(args)];
      await using relay = await startRelay({
        sockets: { llm: `${dir.path}/llm.sock` },
        sandboxSocketDir: dir.path,
        launch: launcher(limited, launched),
        basePort: freeBase(),
      });
      const port = relay.ports.llm!;
      /** The relay's CPU time so far, in clock ticks (/proc/PID/stat's utime and stime). */
      const cpuTicks = async () => {
        const stat = await Deno.readTextFile(`/proc/${launched[0].pid}/stat`);
        const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        return Number(fields[11]) + Number(fields[12]);
      };
      const held = await Promise.all(
        Array.from({ length: 12 }, () => Deno.connect({ hostname: "127.0.0.1", port })),
      );
      try {
        await new Promise((resolve) => setTimeout(resolve, 300));
        const before = await cpuTicks();
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        const spent = await cpuTicks() - before;
        assert.ok(spent < 20, `${spent} ticks of CPU in a second with no descriptor left`);
        // The twin: each connection asks once and is closed by the server after its answer, which
        // gives descriptors back: every one is answered, those the relay could not carry at first
        // included.
        const request = encoder.encode("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        const answers = await Promise.all(held.map(async (conn, i) => {
          await conn.write(request);
          const text = await within(new Response(conn.readable).text(), 5_000, `connection ${i}`);
          return text.split("\r\n\r\n").at(-1);
        }));
        assert.deepEqual(answers, held.map(() => "answered"));
      } finally {
        for (const conn of held) {
          try {
            conn.close();
          } catch {
            // Closed with its readable stream's end.
          }
        }
      }
    });
  }
});
