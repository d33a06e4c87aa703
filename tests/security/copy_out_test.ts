/**
 * `sandbox cp` out of a sandbox must not let the sandbox fill the host's disk. `resources.disk`
 * counts the blocks a workspace uses, so a file of holes (`truncate -s 8G`) fits in any limit;
 * copied out as plain bytes, it became 8 GiB of real data on the host. Refused: files are archived
 * sparse, so the holes stay holes on the host, and a stream longer than twice `resources.disk`
 * (more than the workspace can hold) is cut off and the copy refused, naming the limit. The twins:
 * the file's content and size arrive intact, and a file within the limit is copied.
 *
 * Nor may it create on the host what its archive names. The archive is the sandbox's to write
 * (the agent can stop our `tar -c` and write its own headers into its stdout), and the host's
 * `tar -x`, run as root, created the block and character devices it named, root-owned and
 * readable by every local user. Refused: the host reads the archive with its own strict
 * extractor. Tested with what the sandbox user can make for real (a FIFO, setuid and setgid files,
 * links) through `sandbox cp`, and with crafted archives that a command inside the sandbox writes
 * to its stdout (devices, absolute and `..` names, a link and then a file through it), read by the
 * host as `copyOut` reads its stream. The twin: files, directories and links come out as before,
 * owned by the invoking user.
 */
import assert from "node:assert/strict";
import { DockerSandboxProvider } from "../../lib/sandbox/docker_provider.ts";
import { extractTar } from "../../lib/tar_extract.ts";
import { SandboxError } from "../../lib/errors.ts";
import type { RunResult } from "../../lib/process.ts";
import {
  assertDocker,
  dockerTest,
  profileFrom,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { archive, dir, file, member, octal, symlink } from "../_tar_fixture.ts";

console.error("security: copy-out tests starting");

Deno.test({
  name:
    "sandbox cp out writes a sandbox's sparse file as holes and refuses a stream past twice resources.disk",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using dir = await tempDir("sandbox-sec-cp-");
    const profile = uniqueProfile("sec-cp");
    const configFor = (disk: string) =>
      writeConfig(
        dir.path,
        `profiles:\n  ${profile}:\n    sandbox: {resources: {memory: 512m, disk: ${disk}}}\n`,
      );
    const cli = async (args: string[], disk: string) =>
      await runCli(args, { config: await configFor(disk), timeoutMs: 300_000 });
    try {
      await t.step(
        "a file of holes comes out as holes: the host's disk use stays small",
        async () => {
          const made = await cli([
            "exec",
            "-p",
            profile,
            "--",
            "sh",
            "-c",
            "truncate -s 8G /workspace/holes.bin && printf END >> /workspace/holes.bin",
          ], "64m");
          assert.equal(made.exitCode, 0, made.stderr);
          const copied = await cli(
            ["cp", "-p", profile, ":holes.bin", `${dir.path}/holes.bin`],
            "64m",
          );
          assert.equal(copied.exitCode, 0, copied.stderr);
          const info = await Deno.stat(`${dir.path}/holes.bin`);
          assert.equal(info.size, 8 * 1024 ** 3 + 3, "the file's apparent size is kept");
          assert.ok(
            (info.blocks ?? 0) * 512 < 16 * 1024 ** 2,
            `the holes became ${(info.blocks ?? 0) * 512} bytes on the host's disk`,
          );
          // Its data is there (twin): the end of the file reads back.
          using file = await Deno.open(`${dir.path}/holes.bin`);
          await file.seek(-3, Deno.SeekMode.End);
          const end = new Uint8Array(3);
          assert.equal(await file.read(end), 3);
          assert.equal(new TextDecoder().decode(end), "END");
        },
      );

      await t.step(
        "more than twice resources.disk is cut off and refused, while a file within it is copied",
        async () => {
          const made = await cli([
            "exec",
            "-p",
            profile,
            "--",
            "sh",
            "-c",
            "head -c 48m /dev/urandom > /workspace/big.bin && head -c 4m /dev/urandom > /workspace/small.bin",
          ], "1g");
          assert.equal(made.exitCode, 0, made.stderr);
          // The same workspace under a limit of 16m: 48 MiB is more than it can hold (32 MiB cap).
          const refused = await cli(
            ["cp", "-p", profile, ":big.bin", `${dir.path}/big.bin`],
            "16m",
          );
          assert.equal(refused.exitCode, 125, `${refused.stdout}\n${refused.stderr}`);
          assert.match(refused.stderr, /larger than 32 MiB, twice resources\.disk/);
          await assert.rejects(Deno.stat(`${dir.path}/big.bin`), Deno.errors.NotFound);
          assert.deepEqual(
            [...Deno.readDirSync(dir.path)].filter((e) => e.name.startsWith(".sandbox-copy-")),
            [],
            "a partial copy was left",
          );
          const allowed = await cli(
            ["cp", "-p", profile, ":small.bin", `${dir.path}/small.bin`],
            "16m",
          );
          assert.equal(allowed.exitCode, 0, allowed.stderr);
          assert.equal((await Deno.stat(`${dir.path}/small.bin`)).size, 4 * 1024 ** 2);
        },
      );
    } finally {
      await removeProfile(profile);
    }
  },
});

/** Every path under `root` with its kind, permission bits (all twelve) and owner, sorted. */
async function hostListing(root: string, at = ""): Promise<string[]> {
  const out: string[] = [];
  for await (const entry of Deno.readDir(`${root}/${at}`)) {
    const path = at ? `${at}/${entry.name}` : entry.name;
    const info = await Deno.lstat(`${root}/${path}`);
    const kind = info.isSymlink
      ? `-> ${await Deno.readLink(`${root}/${path}`)}`
      : info.isDirectory
      ? "dir"
      : info.isFile
      ? "file"
      : "OTHER";
    out.push(`${path} ${kind} ${(info.mode! & 0o7777).toString(8)} uid=${info.uid}`);
    if (info.isDirectory) out.push(...await hostListing(root, path));
  }
  return out.sort();
}

/** A device member: type "3" (character) or "4" (block), with its major and minor numbers. */
function device(name: string, type: "3" | "4", major: number, minor: number): Uint8Array {
  return member(name, {
    type,
    mode: 0o666,
    edit: (b) => {
      octal(b, 329, 8, major);
      octal(b, 337, 8, minor);
    },
  });
}

interface Context {
  t: Deno.TestContext;
  profile: string;
  host: string;
  umask: number;
  me: number;
}

/** Through `sandbox cp`, with what the sandbox user can make for real: links, a FIFO, mode bits. */
async function realCopies(
  { t, profile, host, umask, me }: Context,
  cli: (...args: string[]) => Promise<RunResult>,
): Promise<void> {
  const made = await cli(
    "exec",
    "-p",
    profile,
    "--",
    "sh",
    "-c",
    [
      "set -e; cd /workspace",
      "mkdir -p ok/sub pipe modes && echo alpha > ok/a.txt && echo beta > ok/sub/b.txt",
      "ln -s ../a.txt ok/sub/rel-link && ln -s /etc/hostname ok/abs-link && ln ok/a.txt ok/hard",
      "echo x > pipe/before && mkfifo pipe/fifo",
      "echo s > modes/suid && chmod 4755 modes/suid && echo g > modes/sgid && chmod 2750 modes/sgid",
      "mkdir modes/sticky && chmod 1777 modes/sticky && id -u",
    ].join("\n"),
  );
  assert.equal(made.exitCode, 0, made.stderr);
  assert.notEqual(
    made.stdout.trim(),
    String(me),
    "the sandbox user is not the host user, so ownership is a real test",
  );

  await t.step(
    "files, directories, symbolic and hard links come out as before, owned by the invoking user (twin)",
    async () => {
      const copied = await cli("cp", "-p", profile, ":ok", `${host}/ok`);
      assert.equal(copied.exitCode, 0, copied.stderr);
      const mode = (m: number) => (m & ~umask).toString(8);
      assert.deepEqual(await hostListing(`${host}/ok`), [
        `a.txt file ${mode(0o644)} uid=${me}`,
        `abs-link -> /etc/hostname 777 uid=${me}`,
        `hard file ${mode(0o644)} uid=${me}`,
        `sub dir ${mode(0o755)} uid=${me}`,
        `sub/b.txt file ${mode(0o644)} uid=${me}`,
        `sub/rel-link -> ../a.txt 777 uid=${me}`,
      ]);
      assert.equal(await Deno.readTextFile(`${host}/ok/sub/rel-link`), "alpha\n");
      assert.equal(
        (await Deno.stat(`${host}/ok/hard`)).ino,
        (await Deno.stat(`${host}/ok/a.txt`)).ino,
      );
    },
  );

  await t.step("a FIFO is refused by name: the copy fails and leaves nothing", async () => {
    const copied = await cli("cp", "-p", profile, ":pipe", `${host}/pipe`);
    assert.equal(copied.exitCode, 125, `${copied.stdout}\n${copied.stderr}`);
    assert.match(
      copied.stderr,
      /^sandbox: (error: )?Cannot copy "\/workspace\/pipe" out of sandbox "[^"]+": "pipe\/fifo" is a FIFO: refused/m,
    );
    await assert.rejects(Deno.lstat(`${host}/pipe`), Deno.errors.NotFound);
    assert.deepEqual(
      [...Deno.readDirSync(host)].filter((e) => e.name.startsWith(".sandbox-copy-")),
      [],
      "a partial copy was left",
    );
  });

  await t.step("setuid, setgid and sticky bits are dropped; the files come out", async () => {
    const copied = await cli("cp", "-p", profile, ":modes", `${host}/modes`);
    assert.equal(copied.exitCode, 0, copied.stderr);
    const bits = async (path: string) =>
      ((await Deno.lstat(`${host}/modes/${path}`)).mode! & 0o7777).toString(8);
    assert.equal(await bits("suid"), (0o755 & ~umask).toString(8));
    assert.equal(await bits("sgid"), (0o750 & ~umask).toString(8));
    assert.equal(await bits("sticky"), (0o777 & ~umask).toString(8));
    assert.equal(await Deno.readTextFile(`${host}/modes/suid`), "s\n");
  });
}

/** Crafted archives a command in the sandbox writes to its stdout, read by the host as copyOut does. */
async function craftedArchives(
  { t, host, umask, me }: Context,
  provider: DockerSandboxProvider,
): Promise<void> {
  const outside = `${host}/outside`;
  await Deno.mkdir(outside);
  /** A command in the sandbox writes `bytes` to its stdout; the host reads it as copyOut does. */
  const fromSandbox = async (bytes: Uint8Array, top: string): Promise<unknown> => {
    const staging = await Deno.makeTempDir({ dir: host, prefix: ".sandbox-copy-" });
    const b64 = btoa(String.fromCharCode(...bytes));
    const emit = provider.execBytes(["sh", "-c", 'printf %s "$1" | base64 -d', "sh", b64], {
      timeoutMs: 60_000,
    });
    try {
      await extractTar(emit.stdout, staging, {
        what: `Cannot copy "/workspace/${top}" out of sandbox "${provider.containerName}"`,
        top,
      });
      return await hostListing(staging);
    } catch (error) {
      return error;
    } finally {
      await emit.stop();
      await emit.outcome.catch(() => {
        // Stopped after its stream was refused: how it ended is not what this test is about.
      });
      const left = await hostListing(staging).catch(() => ["unreadable"]);
      assert.ok(
        !left.some((line) => / OTHER /.test(line)),
        `a special file was created: ${left.join(", ")}`,
      );
      await Deno.remove(staging, { recursive: true });
    }
  };
  const attacks: [string, Uint8Array, RegExp][] = [
    [
      "a block device (the host's disk)",
      archive(dir("d"), device("d/sda", "4", 8, 0)),
      /"d\/sda" is a block device: refused/,
    ],
    [
      "a character device (/dev/mem)",
      archive(dir("d"), device("d/mem", "3", 1, 1)),
      /"d\/mem" is a character device: refused/,
    ],
    ["a FIFO", archive(dir("d"), member("d/fifo", { type: "6" })), /"d\/fifo" is a FIFO: refused/],
    [
      "an absolute name",
      archive(dir("d"), file(`${outside}/abs`, "planted")),
      /has an absolute name: refused/,
    ],
    [
      "a '..' name",
      archive(dir("d"), file("d/../../outside/up", "planted")),
      /"d\/\.\.\/\.\.\/outside\/up" has a "\.\." component: refused/,
    ],
    [
      "a link, then a file through it",
      archive(dir("d"), symlink("d/l", outside), file("d/l/through", "planted")),
      /"d\/l\/through" is inside "d\/l", a symbolic link/,
    ],
    [
      "a link, then a file of its name",
      archive(dir("d"), symlink("d/l", `${outside}/named`), file("d/l", "planted")),
      /"d\/l" is named twice/,
    ],
  ];
  for (const [name, bytes, pattern] of attacks) {
    await t.step(
      `${name} from a command in the sandbox is refused by name, and not created`,
      async () => {
        const outcome = await fromSandbox(bytes, "d");
        assert.ok(outcome instanceof SandboxError, `not refused: ${JSON.stringify(outcome)}`);
        assert.equal(outcome.code, "exec_failed");
        assert.match(outcome.message, /^Cannot copy "\/workspace\/d" out of sandbox "[^"]+": /);
        assert.match(outcome.message, pattern);
        assert.deepEqual([...Deno.readDirSync(outside)], [], "something arrived outside the copy");
      },
    );
  }
  await t.step(
    "the same stream from the sandbox with a plain file in place of each comes out (twin)",
    async () => {
      const outcome = await fromSandbox(
        archive(
          dir("d"),
          file("d/sda", "data", { mode: 0o4755 }),
          symlink("d/l", outside),
          file("d/f", "x"),
        ),
        "d",
      );
      assert.deepEqual(outcome, [
        `d dir ${(0o755 & ~umask).toString(8)} uid=${me}`,
        `d/f file ${(0o644 & ~umask).toString(8)} uid=${me}`,
        `d/l -> ${outside} 777 uid=${me}`,
        `d/sda file ${(0o755 & ~umask).toString(8)} uid=${me}`,
      ]);
    },
  );
}

Deno.test({
  name:
    "sandbox cp out creates no device, FIFO, setuid file, absolute or '..' path, nor writes through a link, whatever the sandbox's archive says",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using dir_ = await tempDir("sandbox-sec-cp-types-");
    const host = dir_.path;
    const profile = uniqueProfile("sec-cpt");
    const yaml = `profiles:\n  ${profile}:\n    sandbox: {resources: {memory: 512m, disk: 256m}}\n`;
    const config = await writeConfig(host, yaml);
    const cli = async (...args: string[]) => await runCli(args, { config, timeoutMs: 300_000 });
    const umask = parseInt(
      /^Umask:\s*([0-7]+)$/m.exec(await Deno.readTextFile("/proc/self/status"))?.[1] ?? "22",
      8,
    );
    const context = { t, profile, host, umask, me: Deno.uid()! };
    try {
      await realCopies(context, cli);
      const provider = new DockerSandboxProvider(profileFrom(yaml, profile));
      await provider.ensureRunning();
      await craftedArchives(context, provider);
    } finally {
      await removeProfile(profile);
    }
  },
});
