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
  return { stopped, stopExec: (id: string) => Promise.resolve(void stopped.push(id)) };
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
  const agent = [await connectAndSay(path, `${"00".repeat(32)}\n`), await connectAndSay(path, undefined)];
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
