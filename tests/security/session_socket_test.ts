/**
 * A session's viewers' socket takes keystrokes into the session's terminal: only the user who
 * started it may connect. Its directory is 0700 and the socket 0600; another uid's connect is
 * refused (attack), the owner's on the same path succeeds (twin).
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { listenForViewers } from "../../lib/session/supervisor.ts";
import { sessionDir, viewersSocket } from "../../lib/session/protocol.ts";
import { tempDir, withEnv } from "../_helpers.ts";

/** A connect to `path` by perl (in perl-base, runnable by any uid), as `uid` when given. */
function connectAs(path: string, uid?: number): Promise<{ exitCode: number; stderr: string }> {
  const connect = [
    "perl",
    "-MIO::Socket::UNIX",
    "-e",
    'IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "refused: $!\\n"; print "connected\\n"',
    path,
  ];
  const argv = uid === undefined
    ? connect
    : ["setpriv", `--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", ...connect];
  return run(argv);
}

Deno.test({
  name: "another uid cannot connect to a session's viewers' socket; its owner can",
  ignore: Deno.uid() !== 0, // switching to another uid needs root
}, async () => {
  await using dir = await tempDir();
  // Everyone may pass through the state directory: only the session's own modes keep others out.
  await Deno.chmod(dir.path, 0o755);
  await withEnv({ XDG_STATE_HOME: dir.path }, async () => {
    await Deno.mkdir(`${dir.path}/sandbox`, { mode: 0o755 });
    await Deno.chmod(`${dir.path}/sandbox`, 0o755);
    const id = "20990101-000000-sec001";
    const listener = listenForViewers(id);
    const accepting = (async () => {
      for await (const conn of listener) conn.close();
    })().catch(() => {}); // closed below
    try {
      assert.equal((await Deno.stat(sessionDir(id))).mode! & 0o777, 0o700);
      assert.equal((await Deno.stat(viewersSocket(id))).mode! & 0o777, 0o600);
      const attack = await connectAs(viewersSocket(id), 65534);
      assert.notEqual(attack.exitCode, 0, "uid 65534 connected to the session's socket");
      assert.match(attack.stderr, /refused: Permission denied/);
      const twin = await connectAs(viewersSocket(id));
      assert.equal(twin.exitCode, 0, `the owner could not connect: ${twin.stderr}`);
    } finally {
      listener.close();
      await accepting;
    }
  });
});
