/**
 * The host's side of a claimed spare relay (lib/proxy/spare_relay.ts `awaitSpareRelay`), with
 * plain Unix sockets standing in for the relay and for an agent: only a connection that says the
 * key is taken for the relay, whatever came first; a spare that never says it is stopped; the
 * relay's end is seen at once.
 */
import assert from "node:assert/strict";
import { awaitSpareRelay, type ClaimedSpare } from "../../lib/proxy/spare_relay.ts";
import { tempDir } from "../_helpers.ts";

const KEY = "ab".repeat(32);

function claimedIn(dir: string): ClaimedSpare {
  return {
    record: { id: "relay-spare-test", dir: "s0000000", ports: { llm: 19080 }, key: KEY },
    hostDir: dir,
    sandboxDir: "/run/sandbox-proxy/s0000000",
  };
}

/** A stand-in provider that records which execs it was asked to stop. */
function provider() {
  const stopped: string[] = [];
  return { stopped, stopRelay: (id: string) => Promise.resolve(void stopped.push(id)) };
}

/** Connect to the control socket once it is there, and say `line` (or nothing). */
async function connectAndSay(path: string, line: string | undefined): Promise<Deno.UnixConn> {
  for (let attempt = 0;; attempt++) {
    try {
      const conn = await Deno.connect({ transport: "unix", path });
      if (line !== undefined) await conn.write(new TextEncoder().encode(line));
      return conn;
    } catch (error) {
      if (attempt > 500) throw error;
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
  }
}

Deno.test("a claimed spare: connections that say a wrong key, garbage or nothing (first, and held open) are not taken for it; the one that says the key is", async () => {
  await using dir = await tempDir();
  const stand = provider();
  const waiting = awaitSpareRelay(stand, claimedIn(dir.path), 5_000);
  const path = `${dir.path}/control.sock`;
  const agent = [
    await connectAndSay(path, undefined),
    await connectAndSay(path, `${"00".repeat(32)}\n`),
    await connectAndSay(path, "garbage\n"),
    await connectAndSay(path, KEY),
  ];
  const relay = await connectAndSay(path, `${KEY}\n`);
  const running = await waiting;
  assert.ok(running, "the relay that said its key was not taken");
  assert.deepEqual(stand.stopped, []);
  // The control socket is gone once the relay is known: nothing else may connect.
  await assert.rejects(() => Deno.connect({ transport: "unix", path }));
  // The agent's connections were dropped (each reads its end).
  for (const conn of agent) assert.equal(await conn.read(new Uint8Array(8)), null);
  // The relay's end is the running relay's end.
  let ended = false;
  running.ended.then(() => ended = true);
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(ended, false);
  relay.close();
  await running.ended;
  for (const conn of agent) conn.close();
});

Deno.test("a claimed spare that never says its key (only an agent's connections come) is stopped and passed over", async () => {
  await using dir = await tempDir();
  const stand = provider();
  const waiting = awaitSpareRelay(stand, claimedIn(dir.path), 300);
  const path = `${dir.path}/control.sock`;
  const agent = [
    await connectAndSay(path, `${"00".repeat(32)}\n`),
    await connectAndSay(path, undefined),
  ];
  assert.equal(await waiting, undefined);
  assert.deepEqual(stand.stopped, ["relay-spare-test"]);
  for (const conn of agent) conn.close();
});

Deno.test("closing a running spare's control ends it, without an exec to stop it", async () => {
  await using dir = await tempDir();
  const stand = provider();
  const waiting = awaitSpareRelay(stand, claimedIn(dir.path), 5_000);
  const relay = await connectAndSay(`${dir.path}/control.sock`, `${KEY}\n`);
  const running = (await waiting)!;
  await running.stop();
  assert.equal(await relay.read(new Uint8Array(8)), null);
  assert.deepEqual(stand.stopped, []);
  relay.close();
});

/** A loopback port nothing listens on just now. */
function freePort(): number {
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = probe.addr as Deno.NetAddr;
  probe.close();
  return port;
}

/** A service socket at `path` that echoes what each connection says and never closes one itself. */
function echoService(path: string): { close(): void } {
  const listener = Deno.listen({ transport: "unix", path });
  const conns: Deno.Conn[] = [];
  (async () => {
    for await (const conn of listener) {
      conns.push(conn);
      (async () => {
        const buffer = new Uint8Array(1024);
        for (let n; (n = await conn.read(buffer)) !== null;) {
          await conn.write(buffer.subarray(0, n));
        }
      })().catch(() => {});
    }
  })().catch(() => {});
  return {
    close() {
      listener.close();
      for (const conn of conns) {
        try {
          conn.close();
        } catch {
          // Already closed.
        }
      }
    },
  };
}

/** Accept the relay's control connection on `path` and read its key line. */
async function acceptControl(path: string): Promise<{ conn: Deno.Conn; said: string }> {
  const listener = Deno.listen({ transport: "unix", path });
  const conn = await listener.accept();
  listener.close();
  await Deno.remove(path).catch(() => {}); // (closing the listener may have removed it)
  const buffer = new Uint8Array(256);
  let said = "";
  while (!said.endsWith("\n")) {
    const n = await conn.read(buffer);
    if (n === null) break;
    said += new TextDecoder().decode(buffer.subarray(0, n));
  }
  return { conn, said };
}

/** Whether `conn` ends (reads its end) within 5 s. */
async function endsSoon(conn: Deno.Conn): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<false>((resolve) => timer = setTimeout(() => resolve(false), 5_000));
  const ended = conn.read(new Uint8Array(16)).then((n) => n === null, () => true);
  const result = await Promise.race([ended, late]);
  clearTimeout(timer);
  conn.close();
  await ended;
  return result;
}

/** Say `text` on `conn` and read as many bytes back (null: the connection ended first). */
async function roundTrip(conn: Deno.Conn, text: string): Promise<string | null> {
  await conn.write(new TextEncoder().encode(text));
  const buffer = new Uint8Array(text.length);
  let filled = 0;
  while (filled < text.length) {
    const n = await conn.read(buffer.subarray(filled));
    if (n === null) return null;
    filled += n;
  }
  return new TextDecoder().decode(buffer);
}

Deno.test("the relay passed on (relay/main.ts --spare): `again` cuts what it carried for the session, even with the service still holding it, and it serves the next control socket with the same key; a plain close ends it", async () => {
  await using dir = await tempDir();
  const port = freePort();
  const relay = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--no-config",
      "-A",
      new URL("../../relay/main.ts", import.meta.url).pathname,
      "--spare",
      "--sockets",
      dir.path,
      `llm=${port}`,
    ],
    env: { SANDBOX_RELAY_KEY: KEY },
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const service = echoService(`${dir.path}/llm.sock`);
  try {
    const first = await acceptControl(`${dir.path}/control.sock`);
    assert.equal(first.said, `${KEY}\n`);
    const agent = await Deno.connect({ hostname: "127.0.0.1", port });
    assert.equal(await roundTrip(agent, "first session"), "first session");
    await first.conn.write(new TextEncoder().encode("again\n"));
    first.conn.close();
    // The service never closes its side: the relay itself cuts the agent's connection.
    assert.equal(await endsSoon(agent), true, "the agent's connection outlived its session");

    const second = await acceptControl(`${dir.path}/control.sock`);
    assert.equal(second.said, `${KEY}\n`);
    const next = await Deno.connect({ hostname: "127.0.0.1", port });
    assert.equal(await roundTrip(next, "second session"), "second session");
    // The twin: closed without `again`, the relay ends, and what it carried with it.
    second.conn.close();
    assert.equal(await endsSoon(next), true);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const status = await Promise.race([
      relay.status,
      new Promise<undefined>((resolve) => timer = setTimeout(() => resolve(undefined), 5_000)),
    ]);
    clearTimeout(timer);
    assert.equal(status?.code, 0, "the relay did not end with its control connection");
  } finally {
    service.close();
    try {
      relay.kill();
    } catch {
      // Already ended.
    }
    await relay.stderr.cancel().catch(() => {});
    await relay.status;
  }
});
