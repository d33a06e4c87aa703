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
  sweepStaleSessionDirs,
} from "../../lib/sandbox/proxy_mount.ts";
import { tempDir, withEnv } from "../_helpers.ts";

const mode = async (path: string) => (await Deno.stat(path)).mode! & 0o777;

Deno.test("each container of each engine has a directory of its own, under a 0700 directory this user owns", async () => {
  await using dir = await tempDir();
  const clean = {
    XDG_STATE_HOME: dir.path,
    DOCKER_CONFIG: dir.path,
    DOCKER_HOST: undefined,
    DOCKER_CONTEXT: undefined,
  };
  await withEnv(clean, async () => {
    const a = await proxyMountSource("sandbox-a");
    assert.match(a, new RegExp(`^${dir.path}/sandbox/proxy/[0-9a-f]{12}$`));
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
    await Deno.mkdir(`${dir.path}/sandbox/proxy`, { recursive: true });
    await Deno.chmod(`${dir.path}/sandbox/proxy`, 0o755);
    assert.equal(await prepareProxyMountSource("sandbox-a"), a);
    assert.equal(await mode(`${dir.path}/sandbox/proxy`), 0o700);
    assert.equal(await mode(a), 0o711);
    const session = await makeSessionSocketDir(a);
    assert.equal(await mode(session.host), 0o711);
    assert.equal(session.sandbox, `${PROXY_MOUNT_PATH}/${session.host.split("/").pop()}`);
    assert.match(session.sandbox, /\/[0-9a-f]{8}$/);
  });
});

Deno.test("no directory where it would be unsafe or unusable: a parent that is a link, a path too long for a socket or unfit for --mount", async (t) => {
  await t.step("the 0700 parent is a symbolic link to someone else's directory", async () => {
    await using dir = await tempDir();
    await using elsewhere = await tempDir();
    await Deno.mkdir(`${dir.path}/sandbox`);
    await Deno.symlink(elsewhere.path, `${dir.path}/sandbox/proxy`);
    await withEnv(
      { XDG_STATE_HOME: dir.path, DOCKER_HOST: undefined, DOCKER_CONTEXT: undefined },
      async () => {
        await assert.rejects(
          () => prepareProxyMountSource("sandbox-a"),
          Deno.errors.PermissionDenied,
        );
      },
    );
    assert.deepEqual(
      [...Deno.readDirSync(elsewhere.path)],
      [],
      "something was made through the link",
    );
  });
  await t.step(
    "a state directory so long that a socket's path would not fit in sun_path",
    async () => {
      await using dir = await tempDir();
      await withEnv(
        { XDG_STATE_HOME: `${dir.path}/${"s".repeat(70)}`, DOCKER_HOST: undefined },
        async () => {
          assert.equal(await prepareProxyMountSource("sandbox-a"), undefined);
        },
      );
    },
  );
  await t.step("a path with a comma, which --mount would split", async () => {
    await using dir = await tempDir();
    await withEnv({ XDG_STATE_HOME: `${dir.path}/a,b`, DOCKER_HOST: undefined }, async () => {
      assert.equal(await prepareProxyMountSource("sandbox-a"), undefined);
    });
  });
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
