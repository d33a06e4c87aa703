/**
 * The host's side of a granted lease (lib/sandbox/lease_channel.ts): the lease's lines go each to
 * its reader, and the disk watcher it carries ends as the watch needs — cleanly when the host
 * stops it or releases the lease, as a failure (the watch fails closed) when the lease's watcher
 * or the lease itself ends first.
 */
import assert from "node:assert/strict";
import { LeaseChannel } from "../../lib/sandbox/lease_channel.ts";
import { startDiskWatch } from "../../lib/sandbox/disk_watch.ts";
import type { SandboxError } from "../../lib/errors.ts";

/** A lease's output the test writes line by line, and what the channel sent it. */
function fakeLease() {
  let output!: ReadableStreamDefaultController<string>;
  const lines = new ReadableStream<string>({ start: (controller) => void (output = controller) });
  const sent: string[][] = [];
  const channel = new LeaseChannel(lines.getReader(), (kind, argv) => void sent.push([kind, ...argv]));
  return { channel, sent, say: (line: string) => output.enqueue(line), end: () => output.close() };
}

/** An input the host closes when its watch closes. */
function input() {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  const stdin = new ReadableStream<Uint8Array>({ start: (c) => void (controller = c) });
  return { stdin, close: () => controller.close() };
}

async function collect(lines: AsyncGenerator<string>): Promise<string[]> {
  const seen: string[] = [];
  for await (const line of lines) seen.push(line);
  return seen;
}

Deno.test("the lease is asked for `du DIR` once; its sizes reach the watcher, and closing the input ends it cleanly", async () => {
  const { channel, sent, say } = fakeLease();
  const { stdin, close } = input();
  const watcher = channel.watchDisk("/workspace", stdin);
  assert.deepEqual(sent, [["du", "/workspace"]]);
  const seen = collect(watcher.lines());
  say("du 12");
  say("du 340");
  say("not a size");
  await new Promise((resolve) => setTimeout(resolve, 10));
  close();
  assert.deepEqual(await seen, ["12", "340"]);
  assert.equal((await watcher.finished).exitCode, 0);
  assert.throws(() => channel.watchDisk("/workspace", input().stdin), /one directory/);
});

Deno.test("`du-ended` from the lease ends the watcher as a failure", async () => {
  const { channel, say } = fakeLease();
  const watcher = channel.watchDisk("/workspace", input().stdin);
  say("du 1");
  say("du-ended");
  const outcome = await watcher.finished;
  assert.equal(outcome.exitCode, 1);
  assert.match(outcome.stderrTail, /disk watcher ended/);
});

Deno.test("a lease whose output ends (it was killed) ends its watcher as a failure, and was not released", async () => {
  const { channel, end } = fakeLease();
  const watcher = channel.watchDisk("/workspace", input().stdin);
  end();
  assert.equal((await watcher.finished).exitCode, 1);
  assert.match((await watcher.finished).stderrTail, /the lease ended/);
  assert.equal(await channel.released, false);
});

Deno.test("`released` ends the watcher cleanly: the host released the lease, done with the run", async () => {
  const { channel, say } = fakeLease();
  const watcher = channel.watchDisk("/workspace", input().stdin);
  say("released");
  assert.equal(await channel.released, true);
  assert.equal((await watcher.finished).exitCode, 0);
});

Deno.test("the disk watch on a lease's watcher: fires past the limit while growing, fails closed when the lease goes", async (t) => {
  const options = { limitBytes: 10 * 1024 * 1024, sandbox: "sandbox-l", profile: "l", delayMs: 0 };
  const aborted = (signal: AbortSignal) => new Promise<SandboxError>((resolve) => signal.addEventListener("abort", () => resolve(signal.reason)));

  await t.step("growing past the limit", async () => {
    const { channel, say } = fakeLease();
    await using watch = startDiskWatch((stdin) => Promise.resolve(channel.watchDisk("/workspace", stdin)), options);
    await new Promise((resolve) => setTimeout(resolve, 10));
    say("du 9000");
    say("du 12000");
    const reason = await aborted(watch.signal);
    assert.match(reason.message, /exceeded resources\.disk/);
  });

  await t.step("the lease killed under the run", async () => {
    const { channel, say, end } = fakeLease();
    await using watch = startDiskWatch((stdin) => Promise.resolve(channel.watchDisk("/workspace", stdin)), options);
    await new Promise((resolve) => setTimeout(resolve, 10));
    say("du 10");
    end();
    const reason = await aborted(watch.signal);
    assert.equal(reason.code, "disk_limit");
    assert.match(reason.message, /disk watch of sandbox "sandbox-l" stopped/);
  });

  await t.step("twin: closed by the host, it does not fire", async () => {
    const { channel, say } = fakeLease();
    const watch = startDiskWatch((stdin) => Promise.resolve(channel.watchDisk("/workspace", stdin)), options);
    await new Promise((resolve) => setTimeout(resolve, 10));
    say("du 10");
    await watch.close();
    assert.equal(watch.signal.aborted, false);
  });
});

Deno.test("a watcher whose reader stopped reading (the watch fired) ends cleanly; later lines and the lease's end are no error", async () => {
  const { channel, say, end } = fakeLease();
  const watcher = channel.watchDisk("/workspace", input().stdin);
  say("du 1");
  for await (const _line of watcher.lines()) break;
  assert.equal((await watcher.finished).exitCode, 0);
  say("du 2");
  say("du-ended");
  end();
  assert.equal(await channel.released, false);
});

Deno.test("a lease that does not say its watcher started (one that knows no `du`) fails the watch; one that did is watched on (twin)", async () => {
  const silent = fakeLease();
  const unanswered = silent.channel.watchDisk("/workspace", input().stdin, 20);
  const outcome = await unanswered.finished;
  assert.equal(outcome.exitCode, 1);
  assert.match(outcome.stderrTail, /did not start a disk watcher/);

  const answering = fakeLease();
  const { stdin, close } = input();
  const watcher = answering.channel.watchDisk("/workspace", stdin, 20);
  answering.say("du-watching");
  const ended = await Promise.race([watcher.finished, new Promise((resolve) => setTimeout(() => resolve("running"), 100))]);
  assert.equal(ended, "running");
  close();
  assert.equal((await watcher.finished).exitCode, 0);
});
