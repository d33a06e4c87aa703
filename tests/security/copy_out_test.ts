/**
 * `sandbox cp` out of a sandbox must not let the sandbox fill the host's disk. `resources.disk`
 * counts the blocks a workspace uses, so a file of holes (`truncate -s 8G`) fits in any limit;
 * copied out as plain bytes, it became 8 GiB of real data on the host. Refused: files are archived
 * sparse, so the holes stay holes on the host, and a stream longer than twice `resources.disk`
 * (more than the workspace can hold) is cut off and the copy refused, naming the limit. The twins:
 * the file's content and size arrive intact, and a file within the limit is copied.
 */
import assert from "node:assert/strict";
import { assertDocker, dockerTest, removeProfile, runCli, tempDir, uniqueProfile, writeConfig } from "../_helpers.ts";

console.error("security: copy-out tests starting");

Deno.test({
  name: "sandbox cp out writes a sandbox's sparse file as holes and refuses a stream past twice resources.disk",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using dir = await tempDir("sandbox-sec-cp-");
    const profile = uniqueProfile("sec-cp");
    const configFor = (disk: string) => writeConfig(dir.path, `profiles:\n  ${profile}:\n    sandbox: {resources: {memory: 512m, disk: ${disk}}}\n`);
    const cli = async (args: string[], disk: string) => await runCli(args, { config: await configFor(disk), timeoutMs: 300_000 });
    try {
      await t.step("a file of holes comes out as holes: the host's disk use stays small", async () => {
        const made = await cli(["exec", "-p", profile, "--", "sh", "-c", "truncate -s 8G /workspace/holes.bin && printf END >> /workspace/holes.bin"], "64m");
        assert.equal(made.exitCode, 0, made.stderr);
        const copied = await cli(["cp", "-p", profile, ":holes.bin", `${dir.path}/holes.bin`], "64m");
        assert.equal(copied.exitCode, 0, copied.stderr);
        const info = await Deno.stat(`${dir.path}/holes.bin`);
        assert.equal(info.size, 8 * 1024 ** 3 + 3, "the file's apparent size is kept");
        assert.ok((info.blocks ?? 0) * 512 < 16 * 1024 ** 2, `the holes became ${(info.blocks ?? 0) * 512} bytes on the host's disk`);
        // Its data is there (twin): the end of the file reads back.
        using file = await Deno.open(`${dir.path}/holes.bin`);
        await file.seek(-3, Deno.SeekMode.End);
        const end = new Uint8Array(3);
        assert.equal(await file.read(end), 3);
        assert.equal(new TextDecoder().decode(end), "END");
      });

      await t.step("more than twice resources.disk is cut off and refused, while a file within it is copied", async () => {
        const made = await cli(["exec", "-p", profile, "--", "sh", "-c", "head -c 48m /dev/urandom > /workspace/big.bin && head -c 4m /dev/urandom > /workspace/small.bin"], "1g");
        assert.equal(made.exitCode, 0, made.stderr);
        // The same workspace under a limit of 16m: 48 MiB is more than it can hold (32 MiB cap).
        const refused = await cli(["cp", "-p", profile, ":big.bin", `${dir.path}/big.bin`], "16m");
        assert.equal(refused.exitCode, 125, `${refused.stdout}\n${refused.stderr}`);
        assert.match(refused.stderr, /larger than 32 MiB, twice resources\.disk/);
        await assert.rejects(Deno.stat(`${dir.path}/big.bin`), Deno.errors.NotFound);
        assert.deepEqual([...Deno.readDirSync(dir.path)].filter((e) => e.name.startsWith(".sandbox-copy-")), [], "a partial copy was left");
        const allowed = await cli(["cp", "-p", profile, ":small.bin", `${dir.path}/small.bin`], "16m");
        assert.equal(allowed.exitCode, 0, allowed.stderr);
        assert.equal((await Deno.stat(`${dir.path}/small.bin`)).size, 4 * 1024 ** 2);
      });
    } finally {
      await removeProfile(profile);
    }
  },
});
