/**
 * The host side of the socket path: where a container's socket directory is, who may enter it,
 * and what a session leaves there. No Docker.
 */
import assert from "node:assert/strict";
import {
  makeSessionSocketDir,
  prepareProxyMountSource,
  PROXY_MOUNT_PATH,
  proxyMountSource,
  removeProxyMountSource,
  sweepStaleSessionDirs,
} from "../../lib/sandbox/proxy_mount.ts";
import { tempDir, withEnv } from "../_helpers.ts";

const mode = async (path: string) => (await Deno.stat(path)).mode! & 0o777;

/** The parent of a mount source (in /tmp), removed with what is in it when the test ends. */
function parentOf(source: string): AsyncDisposable & { path: string } {
  const path = source.slice(0, source.lastIndexOf("/"));
  return {
    path,
    [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }).catch(() => {}),
  };
}

Deno.test("each container of each engine has a directory of its own, under a 0700 directory this user owns, at a path that says nothing of the user", async () => {
  await using dir = await tempDir();
  const clean = {
    XDG_STATE_HOME: dir.path,
    DOCKER_CONFIG: dir.path,
    DOCKER_HOST: undefined,
    DOCKER_CONTEXT: undefined,
  };
  await withEnv(clean, async () => {
    const a = await proxyMountSource("sandbox-a");
    await using parent = parentOf(a);
    assert.match(a, /^\/tmp\/sandbox-proxy-[0-9a-f]{16}\/[0-9a-f]{12}$/);
    const home = Deno.env.get("HOME");
    for (const revealing of [dir.path, ...(home && home !== "/" ? [home] : [])]) {
      assert.ok(!a.includes(revealing), `${a} shows ${revealing}`);
    }
    // Another state directory (another user, or this one elsewhere) has another parent.
    assert.notEqual(
      await withEnv({ XDG_STATE_HOME: `${dir.path}/other` }, () => proxyMountSource("sandbox-a")),
      a,
    );
    assert.notEqual(await proxyMountSource("sandbox-b"), a);
    assert.notEqual(
      await withEnv({ DOCKER_HOST: "unix:///other.sock" }, () => proxyMountSource("sandbox-a")),
      a,
    );
    assert.notEqual(
      await withEnv({ DOCKER_CONTEXT: "rootless" }, () => proxyMountSource("sandbox-a")),
      a,
    );
    // The default context named as such is the default engine.
    assert.equal(
      await withEnv({ DOCKER_CONTEXT: "default" }, () => proxyMountSource("sandbox-a")),
      a,
    );

    // A parent some earlier umask made open is closed again.
    await Deno.mkdir(parent.path);
    await Deno.chmod(parent.path, 0o755);
    assert.equal(await prepareProxyMountSource("sandbox-a"), a);
    assert.equal(await mode(parent.path), 0o700);
    assert.equal(await mode(a), 0o711);
    const session = await makeSessionSocketDir(a);
    assert.equal(await mode(session.host), 0o711);
    assert.equal(session.sandbox, `${PROXY_MOUNT_PATH}/${session.host.split("/").pop()}`);
    assert.match(session.sandbox, /\/[0-9a-f]{8}$/);
  });
});

Deno.test("no directory where it would be unsafe: a parent in /tmp that is a link, or not this user's; a state directory's length or characters do not matter", async (t) => {
  const clean = { DOCKER_HOST: undefined, DOCKER_CONTEXT: undefined };
  await t.step("the 0700 parent is a symbolic link to someone else's directory", async () => {
    await using dir = await tempDir();
    await using elsewhere = await tempDir();
    await withEnv({ XDG_STATE_HOME: dir.path, ...clean }, async () => {
      await using parent = parentOf(await proxyMountSource("sandbox-a"));
      await Deno.symlink(elsewhere.path, parent.path);
      await assert.rejects(
        () => prepareProxyMountSource("sandbox-a"),
        Deno.errors.PermissionDenied,
      );
      assert.ok((await Deno.lstat(parent.path)).isSymlink, "the link was replaced");
    });
    assert.deepEqual(
      [...Deno.readDirSync(elsewhere.path)],
      [],
      "something was made through the link",
    );
  });
  await t.step(
    "the parent is a directory another user made first (when this test runs as root)",
    async () => {
      await using dir = await tempDir();
      await withEnv({ XDG_STATE_HOME: dir.path, ...clean }, async () => {
        await using parent = parentOf(await proxyMountSource("sandbox-a"));
        await Deno.mkdir(parent.path);
        await Deno.chmod(parent.path, 0o777);
        if (Deno.uid() === 0) {
          await Deno.chown(parent.path, 65534, 65534);
          await assert.rejects(
            () => prepareProxyMountSource("sandbox-a"),
            Deno.errors.PermissionDenied,
          );
          assert.equal(await mode(parent.path), 0o777, "the other user's directory was changed");
          assert.deepEqual(
            [...Deno.readDirSync(parent.path)],
            [],
            "something was made in the other user's directory",
          );
        } else {
          // Not root: no other user's directory can be made here; this user's own one is closed (twin).
          assert.ok(await prepareProxyMountSource("sandbox-a"));
          assert.equal(await mode(parent.path), 0o700);
        }
      });
    },
  );
  await t.step(
    "a long state directory, or one with a comma, changes nothing of the mounted path",
    async () => {
      await using dir = await tempDir();
      for (const state of [`${dir.path}/${"s".repeat(200)}`, `${dir.path}/a,b`]) {
        await withEnv({ XDG_STATE_HOME: state, ...clean }, async () => {
          const source = await prepareProxyMountSource("sandbox-a");
          assert.ok(source, "no directory");
          await using _parent = parentOf(source);
          assert.match(source, /^\/tmp\/sandbox-proxy-[0-9a-f]{16}\/[0-9a-f]{12}$/);
        });
      }
    },
  );
});

Deno.test("the sweep removes what crashed sessions left (old, nothing listening) and keeps live and new sessions' directories", async () => {
  await using dir = await tempDir();
  const old = new Date(Date.now() - 10 * 60_000);
  const make = async (name: string, socket: "dead" | "live" | "none", age: "old" | "new") => {
    const path = `${dir.path}/${name}`;
    await Deno.mkdir(path);
    let listener: Deno.Listener | undefined;
    if (socket !== "none") {
      listener = Deno.listen({ transport: "unix", path: `${path}/llm.sock` });
      // A socket file with no listener: what a killed process leaves.
      if (socket === "dead") listener.close();
    }
    if (age === "old") await Deno.utime(path, old, old);
    return socket === "live" ? listener : undefined;
  };
  await make("aaaa0001", "dead", "old");
  await make("aaaa0002", "none", "old");
  const live = await make("aaaa0003", "live", "old");
  await make("aaaa0004", "dead", "new");
  try {
    await sweepStaleSessionDirs(dir.path);
    assert.deepEqual([...Deno.readDirSync(dir.path)].map((e) => e.name).sort(), [
      "aaaa0003",
      "aaaa0004",
    ]);
  } finally {
    live?.close();
  }
});

Deno.test("removing a container's directory takes the user's directory with the last one, and a container made after it makes it again", async () => {
  await using dir = await tempDir();
  const clean = {
    XDG_STATE_HOME: dir.path,
    DOCKER_CONFIG: dir.path,
    DOCKER_HOST: undefined,
    DOCKER_CONTEXT: undefined,
  };
  await withEnv(clean, async () => {
    const a = (await prepareProxyMountSource("sandbox-a"))!;
    await using parent = parentOf(a);
    const b = (await prepareProxyMountSource("sandbox-b"))!;
    await removeProxyMountSource("sandbox-a");
    // Another container's is still there: the user's directory stays.
    assert.equal((await Deno.stat(b)).isDirectory, true);
    await assert.rejects(Deno.stat(a), Deno.errors.NotFound);
    await removeProxyMountSource("sandbox-b");
    await assert.rejects(Deno.stat(parent.path), Deno.errors.NotFound);
    // The next container's makes it again, closed as before.
    assert.equal(await prepareProxyMountSource("sandbox-c"), await proxyMountSource("sandbox-c"));
    assert.equal(await mode(parent.path), 0o700);
  });
});
