/**
 * The strict extractor for what a sandbox sends out (lib/tar_extract.ts): real GNU tar archives
 * come out whole in chunks of any size, and hand-built hostile ones — devices, FIFOs, absolute and
 * `..` names, writes through a link, hard links out of the copy, setuid bits, broken or truncated
 * headers — are refused naming the member, with nothing of it created.
 */
import assert from "node:assert/strict";
import { extractTar, type TarExtractOptions } from "../../lib/tar_extract.ts";
import { SandboxError } from "../../lib/errors.ts";
import { tempDir } from "../_helpers.ts";
import {
  archive,
  base256,
  chunked,
  concat,
  dir,
  file,
  hardlink,
  longName,
  member,
  octal,
  pax,
  symlink,
} from "../_tar_fixture.ts";

async function extract(
  bytes: Uint8Array,
  root: string,
  options: TarExtractOptions & { chunk?: number } = {},
) {
  return await extractTar(chunked(bytes, options.chunk ?? 4096), root, options);
}

/** Extraction of `bytes` fails with an `exec_failed` SandboxError whose message matches `pattern`. */
async function refused(
  bytes: Uint8Array,
  root: string,
  pattern: RegExp,
  options: TarExtractOptions = {},
): Promise<void> {
  await assert.rejects(extract(bytes, root, options), (error: unknown) => {
    assert.ok(error instanceof SandboxError, String(error));
    assert.equal(error.code, "exec_failed");
    assert.match(error.message, pattern);
    return true;
  });
}

/** Every path under `root`, with its kind, mode and size (and link target), sorted. */
async function listing(root: string, at = ""): Promise<string[]> {
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
      : "other";
    out.push(
      `${path} ${kind} ${(info.mode! & 0o7777).toString(8)} ${info.isFile ? info.size : ""}`,
    );
    if (info.isDirectory) out.push(...await listing(root, path));
  }
  return out.sort();
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

/** A tree of every kind GNU tar writes: files, directories, a symlink, a hard link, a long name, a sparse file. */
async function realTree(root: string): Promise<void> {
  await Deno.mkdir(`${root}/t/sub`, { recursive: true });
  await Deno.writeTextFile(`${root}/t/a.txt`, "alpha\n");
  await Deno.writeFile(`${root}/t/sub/bin`, new Uint8Array(70_000).map((_, i) => (i * 7919) % 251));
  await Deno.chmod(`${root}/t/sub/bin`, 0o750);
  await Deno.symlink("../a.txt", `${root}/t/sub/link`);
  await Deno.link(`${root}/t/a.txt`, `${root}/t/hard`);
  await Deno.writeTextFile(`${root}/t/sub/${"n".repeat(150)}`, "long\n");
  const sparse = await Deno.open(`${root}/t/holes`, { write: true, create: true });
  await sparse.seek(9 * 1024 ** 3, Deno.SeekMode.Start);
  await sparse.write(new TextEncoder().encode("END"));
  sparse.close();
  await Deno.utime(`${root}/t/a.txt`, 1_600_000_000, 1_600_000_000);
}

Deno.test("a GNU tar archive of files, directories, links, a long name and a sparse file comes out whole, in chunks of any size", async (t) => {
  await using src = await tempDir();
  await realTree(src.path);
  const raw = await new Deno.Command("tar", {
    args: ["-C", src.path, "--sparse", "-c", "--", "t"],
    stdout: "piped",
  }).output();
  assert.equal(raw.code, 0);
  const expected = await listing(src.path);
  for (const chunk of [1, 511, 512, 513, 10240, raw.stdout.byteLength]) {
    await t.step(`chunks of ${chunk} bytes`, async () => {
      await using out = await tempDir();
      const report = await extract(raw.stdout, out.path, { chunk, top: "t" });
      assert.equal(report.entries, 8);
      assert.equal(report.bytes, raw.stdout.byteLength);
      assert.deepEqual(await listing(out.path), expected);
      assert.equal(await Deno.readTextFile(`${out.path}/t/sub/link`), "alpha\n");
      assert.equal(
        (await Deno.stat(`${out.path}/t/hard`)).ino,
        (await Deno.stat(`${out.path}/t/a.txt`)).ino,
        "the hard link is one file",
      );
      assert.equal(
        (await Deno.stat(`${out.path}/t/a.txt`)).mtime?.getTime(),
        1_600_000_000_000,
        "the modification time is kept",
      );
      assert.deepEqual(
        await Deno.readFile(`${out.path}/t/sub/bin`),
        await Deno.readFile(`${src.path}/t/sub/bin`),
      );
      const holes = await Deno.stat(`${out.path}/t/holes`);
      assert.equal(holes.size, 9 * 1024 ** 3 + 3);
      assert.ok(
        (holes.blocks ?? 0) * 512 < 1024 ** 2,
        `the holes took ${(holes.blocks ?? 0) * 512} bytes`,
      );
      using opened = await Deno.open(`${out.path}/t/holes`);
      await opened.seek(-3, Deno.SeekMode.End);
      const tail = new Uint8Array(3);
      await opened.read(tail);
      assert.equal(new TextDecoder().decode(tail), "END");
    });
  }
});

Deno.test("devices, FIFOs and unknown member types are refused by name, and none of them is created", async (t) => {
  const kinds: [string, RegExp][] = [
    ["4", /"d\/disk" is a block device: refused/],
    ["3", /"d\/disk" is a character device: refused/],
    ["6", /"d\/disk" is a FIFO: refused/],
    ["7", /"d\/disk" is a contiguous file: refused/],
    ["Z", /"d\/disk" is of tar type "Z": refused/],
    ["g", /"d\/disk" is a global pax header: refused/],
  ];
  for (const [type, pattern] of kinds) {
    await t.step(`type ${type}`, async () => {
      await using out = await tempDir();
      const device = member("d/disk", {
        type,
        mode: 0o644,
        edit: (b) => {
          octal(b, 329, 8, 8);
          octal(b, 337, 8, 0);
        },
      });
      await refused(archive(dir("d"), device, file("d/after", "x")), out.path, pattern);
      assert.equal(await exists(`${out.path}/d/disk`), false);
      assert.equal(
        await exists(`${out.path}/d/after`),
        false,
        "extraction stops at the refused member",
      );
    });
  }
  await t.step("the same archive with a regular file in its place extracts (twin)", async () => {
    await using out = await tempDir();
    await extract(archive(dir("d"), file("d/disk", "data"), file("d/after", "x")), out.path);
    assert.equal(await Deno.readTextFile(`${out.path}/d/disk`), "data");
  });
});

Deno.test("absolute names and '..' components are refused, in member names and hard link targets", async (t) => {
  await using out = await tempDir();
  const root = `${out.path}/root`;
  await Deno.mkdir(root);
  await t.step(
    "an absolute name",
    () => refused(archive(file(`${out.path}/abs`, "x")), root, /has an absolute name: refused/),
  );
  await t.step(
    "a '..' name",
    () => refused(archive(file("../up", "x")), root, /"\.\.\/up" has a "\.\." component: refused/),
  );
  await t.step(
    "'..' inside a name",
    () => refused(archive(dir("d"), file("d/../../up", "x")), root, /has a "\.\." component/),
  );
  await t.step(
    "'..' through a pax path",
    () =>
      refused(
        archive(pax({ path: "../pax-up" }), file("innocent", "x")),
        root,
        /"\.\.\/pax-up" has a "\.\." component/,
      ),
  );
  await t.step(
    "'..' through a GNU long name",
    () =>
      refused(
        archive(longName(`../${"l".repeat(120)}`), file("innocent", "x")),
        root,
        /has a "\.\." component/,
      ),
  );
  await t.step(
    "a hard link to an absolute path",
    () =>
      refused(archive(hardlink("h", "/etc/passwd")), root, /"\/etc\/passwd" has an absolute name/),
  );
  await t.step(
    "a name for the destination itself",
    () => refused(archive(dir("./")), root, /names the destination itself/),
  );
  assert.deepEqual(
    [...Deno.readDirSync(out.path)].map((e) => e.name),
    ["root"],
    "nothing was written beside the root",
  );
  assert.equal(await exists(`${out.path}/abs`), false);
});

Deno.test("nothing is written through a symbolic link, whichever way the archive tries", async (t) => {
  await using out = await tempDir();
  const outside = `${out.path}/outside`;
  await Deno.mkdir(outside);
  const root = `${out.path}/root`;
  const fresh = async () => {
    await Deno.remove(root, { recursive: true }).catch(() => {});
    await Deno.mkdir(root);
  };
  await t.step("a member inside a link to a directory outside", async () => {
    await fresh();
    await refused(
      archive(dir("d"), symlink("d/l", outside), file("d/l/planted", "x")),
      root,
      /"d\/l\/planted" is inside "d\/l", a symbolic link/,
    );
  });
  await t.step("a file of the same name as the link", async () => {
    await fresh();
    await refused(
      archive(dir("d"), symlink("d/l", `${outside}/planted`), file("d/l", "x")),
      root,
      /"d\/l" is named twice/,
    );
  });
  await t.step("a directory of the same name as the link", async () => {
    await fresh();
    await refused(
      archive(dir("d"), symlink("d/l", outside), dir("d/l"), file("d/l/x", "x")),
      root,
      /"d\/l" is named twice/,
    );
  });
  await t.step("a hard link to the link", async () => {
    await fresh();
    await refused(
      archive(dir("d"), symlink("d/l", "/etc/passwd"), hardlink("d/h", "d/l")),
      root,
      /is a hard link to "d\/l", which is not a file extracted before it/,
    );
  });
  assert.deepEqual([...Deno.readDirSync(outside)], [], "nothing arrived outside");
  await t.step("a link alone arrives as a link, as written (twin)", async () => {
    await fresh();
    await extract(archive(dir("d"), symlink("d/l", outside), file("d/f", "x")), root);
    assert.equal(await Deno.readLink(`${root}/d/l`), outside);
    assert.equal(await Deno.readTextFile(`${root}/d/f`), "x");
  });
});

Deno.test("a hard link arrives only to a file extracted before it in the same copy", async (t) => {
  await using out = await tempDir();
  await t.step(
    "to a file not in the archive",
    () =>
      refused(
        archive(hardlink("h", "elsewhere")),
        out.path,
        /"h" is a hard link to "elsewhere", which is not a file extracted before it: refused/,
      ),
  );
  await t.step(
    "to a directory",
    () =>
      refused(archive(dir("d"), hardlink("h", "d")), out.path, /not a file extracted before it/),
  );
  await t.step("to a file before it (twin)", async () => {
    await using ok = await tempDir();
    await extract(archive(dir("d"), file("d/f", "shared"), hardlink("d/h", "d/f")), ok.path);
    assert.equal((await Deno.stat(`${ok.path}/d/h`)).ino, (await Deno.stat(`${ok.path}/d/f`)).ino);
  });
});

Deno.test("modes keep only their permission bits, less the umask: no setuid, setgid or sticky bit", async () => {
  await using out = await tempDir();
  await extract(
    archive(
      dir("d", { mode: 0o3775 }),
      file("d/suid", "x", { mode: 0o4755 }),
      file("d/sgid", "x", { mode: 0o2750 }),
      file("d/ro", "x", { mode: 0o444 }),
      dir("d/ro-dir", { mode: 0o555 }),
      file("d/open", "x", { mode: 0o777 }),
    ),
    out.path,
  );
  const umask = parseInt(
    /^Umask:\s*([0-7]+)$/m.exec(await Deno.readTextFile("/proc/self/status"))?.[1] ?? "22",
    8,
  );
  const mode = async (path: string) => (await Deno.lstat(`${out.path}/${path}`)).mode! & 0o7777;
  assert.equal(await mode("d"), 0o775 & ~umask);
  assert.equal(await mode("d/suid"), 0o755 & ~umask);
  assert.equal(await mode("d/sgid"), 0o750 & ~umask);
  assert.equal(await mode("d/ro"), 0o444 & ~umask);
  assert.equal(await mode("d/ro-dir"), 0o555 & ~umask);
  assert.equal(await mode("d/open"), 0o777 & ~umask);
  const owner = Deno.uid();
  for await (const entry of Deno.readDir(`${out.path}/d`)) {
    assert.equal(
      (await Deno.lstat(`${out.path}/d/${entry.name}`)).uid,
      owner,
      "the invoking user owns every member",
    );
  }
  await Deno.chmod(`${out.path}/d/ro-dir`, 0o755);
});

Deno.test("broken headers are refused: checksum, magic, numbers, names that are not UTF-8", async (t) => {
  await using out = await tempDir();
  await t.step(
    "a bad checksum",
    () =>
      refused(
        archive(file("f", "x", { checksumOffset: 1 })),
        out.path,
        /the header at byte 0 has a bad checksum/,
      ),
  );
  await t.step(
    "no ustar magic (a v7 header)",
    () =>
      refused(
        archive(file("f", "x", { edit: (b) => b.fill(0, 257, 265) })),
        out.path,
        /is not a ustar or GNU tar header/,
      ),
  );
  await t.step(
    "a size that is not octal",
    () =>
      refused(
        archive(
          file("f", "x", { edit: (b) => b.set(new TextEncoder().encode("00000000009\0"), 124) }),
        ),
        out.path,
        /has a malformed number/,
      ),
  );
  await t.step("a negative base-256 size", () =>
    refused(
      archive(file("f", "x", {
        edit: (b) => {
          b.fill(0xff, 124, 136);
        },
      })),
      out.path,
      /has a malformed number/,
    ));
  await t.step(
    "a name that is not UTF-8",
    () =>
      refused(
        archive(file("f", "x", { edit: (b) => b.set([0x66, 0xff], 0) })),
        out.path,
        /has a name that is not UTF-8/,
      ),
  );
  await t.step(
    "a malformed pax record",
    () =>
      refused(
        archive(member("p", { type: "x", data: "8 path=x\n", format: "ustar" }), file("f", "x")),
        out.path,
        /pax header at byte 0 has a malformed record/,
      ),
  );
  await t.step(
    "a pax sparse file",
    () =>
      refused(
        archive(pax({ "GNU.sparse.major": "1" }), file("f", "x")),
        out.path,
        /pax sparse file, which is not supported/,
      ),
  );
  await t.step(
    "a pax key named twice",
    () =>
      refused(
        archive(
          member("p", { type: "x", data: "11 path=ab\n11 path=cd\n", format: "ustar" }),
          file("f", "x"),
        ),
        out.path,
        /names "path" twice/,
      ),
  );
  assert.deepEqual([...Deno.readDirSync(out.path)], []);
});

Deno.test("truncated archives and data after the end are refused", async (t) => {
  const whole = archive(dir("d"), file("d/f", "x".repeat(1000)));
  const cases: [string, Uint8Array, RegExp][] = [
    ["empty", new Uint8Array(0), /ends without its end marker/],
    ["inside a header", whole.slice(0, 700), /ends inside a header/],
    ["inside the data", whole.slice(0, 1024 + 600), /"d\/f" ends inside its data/],
    ["without the end marker", whole.slice(0, 1024 + 1024), /ends without its end marker/],
    ["after one zero block", whole.slice(0, 1024 + 1024 + 512), /ends after a single zero block/],
    [
      "with a long name and no member",
      archive(longName("x".repeat(200))),
      /ends after a long name or pax header, without its member/,
    ],
    ["with data after the end", concat(whole, file("late", "x")), /has data after its end marker/],
  ];
  for (const [name, bytes, pattern] of cases) {
    await t.step(name, async () => {
      await using root = await tempDir();
      await refused(bytes, root.path, pattern);
    });
  }
  await t.step("a whole archive with extra zero records extracts (twin)", async () => {
    await using root = await tempDir();
    await extract(concat(whole, new Uint8Array(20480)), root.path);
    assert.equal(await Deno.readTextFile(`${root.path}/d/f`), "x".repeat(1000));
  });
});

Deno.test("long names: GNU L and K, pax path and linkpath, the ustar prefix; over the caps refused", async (t) => {
  const deep = `d/${"a".repeat(120)}/${"b".repeat(120)}`;
  await t.step("each form arrives under its full name", async () => {
    await using out = await tempDir();
    await extract(
      archive(
        dir("d"),
        longName(`d/${"a".repeat(120)}`),
        dir("d/x"),
        pax({ path: deep, mtime: "1600000000.5" }),
        dir("d/y"),
        longName(`${deep}/f`),
        file("d/z", "gnu"),
        longName("t".repeat(130), "K"),
        symlink("d/long-link", "ignored"),
        pax({ linkpath: `d/${"a".repeat(120)}/${"b".repeat(120)}/f` }),
        hardlink("d/hard", "ignored"),
        file("pf", "prefixed", { format: "ustar", prefix: "d" }),
      ),
      out.path,
    );
    assert.equal(await Deno.readTextFile(`${out.path}/${deep}/f`), "gnu");
    assert.equal(await Deno.readLink(`${out.path}/d/long-link`), "t".repeat(130));
    assert.equal(await Deno.readTextFile(`${out.path}/d/hard`), "gnu");
    assert.equal(await Deno.readTextFile(`${out.path}/d/pf`), "prefixed");
  });
  await using out = await tempDir();
  await t.step(
    "a name over the cap",
    () =>
      refused(
        archive(pax({ path: "n/".repeat(40) + "f" }), file("f", "x")),
        out.path,
        /has a name longer than 64 bytes/,
        { maxNameBytes: 64 },
      ),
  );
  await t.step(
    "a component over 255 bytes",
    () =>
      refused(
        archive(longName("c".repeat(256)), file("f", "x")),
        out.path,
        /has a component longer than 255 bytes/,
      ),
  );
  await t.step(
    "a GNU long name over the cap",
    () =>
      refused(
        archive(longName("c".repeat(100)), file("f", "x")),
        out.path,
        /long name at byte 0 is longer than 65 bytes/,
        { maxNameBytes: 64 },
      ),
  );
  await t.step(
    "both a GNU long name and a pax path",
    () =>
      refused(
        archive(longName("a".repeat(110)), pax({ path: "b" }), file("f", "x")),
        out.path,
        /has both a GNU long name and a pax one/,
      ),
  );
  await t.step(
    "more members than the cap",
    () =>
      refused(
        archive(file("a", "x"), file("b", "x"), file("c", "x")),
        out.path,
        /"the archive" holds more than 2 members/,
        { maxEntries: 2 },
      ),
  );
});

Deno.test("members must come after their directory, inside the one thing asked for, each name once", async (t) => {
  const cases: [string, Uint8Array, RegExp, TarExtractOptions?][] = [
    [
      "a file before its directory",
      archive(file("d/f", "x")),
      /"d\/f" comes without its directory "d" before it/,
    ],
    [
      "a member inside a file",
      archive(file("f", "x"), file("f/g", "x")),
      /"f\/g" comes without its directory "f"/,
    ],
    [
      "a member outside top",
      archive(dir("d"), dir("other")),
      /"other" is outside "d", the one thing copied/,
      { top: "d" },
    ],
    ["a directory named twice", archive(dir("d"), dir("d/")), /"d\/" is named twice/],
    [
      "a directory that carries data",
      archive(member("d", { type: "5", data: "x" })),
      /is a directory that carries data/,
    ],
  ];
  for (const [name, bytes, pattern, options] of cases) {
    await t.step(name, async () => {
      await using out = await tempDir();
      await refused(bytes, out.path, pattern, options);
    });
  }
});

Deno.test("GNU sparse members: holes kept, extension blocks read, maps that lie refused", async (t) => {
  /**
   * A sparse member: `segments` [offset, bytes] (four in the header, the rest in extension blocks
   * of 21), `realSize`, data "a", "b"… one letter a segment.
   */
  const sparse = (
    segments: [number, number][],
    realSize: number,
    extended = segments.length > 4,
  ) => {
    const data = segments.map(([_, n], i) => String.fromCharCode(97 + (i % 26)).repeat(n)).join("");
    const put = (b: Uint8Array, at: number, [offset, n]: [number, number]) => {
      base256(b, at, 12, offset);
      octal(b, at + 12, 12, n);
    };
    const whole = member("s", {
      type: "S",
      data,
      edit: (b) => {
        segments.slice(0, 4).forEach((segment, i) => put(b, 386 + 24 * i, segment));
        b[482] = extended ? 1 : 0;
        base256(b, 483, 12, realSize);
      },
    });
    const blocks: Uint8Array[] = [];
    for (let at = 4; at < segments.length; at += 21) {
      const block = new Uint8Array(512);
      segments.slice(at, at + 21).forEach((segment, i) => put(block, 24 * i, segment));
      block[504] = at + 21 < segments.length ? 1 : 0;
      blocks.push(block);
    }
    return concat(whole.slice(0, 512), ...blocks, whole.slice(512));
  };
  await t.step(
    "thirty segments: four in the header, the rest in two extension blocks",
    async () => {
      await using out = await tempDir();
      const segments = Array.from({ length: 30 }, (_, i): [number, number] => [i * 65536, i + 1]);
      await extract(archive(sparse(segments, 30 * 65536)), out.path, { chunk: 700 });
      const bytes = await Deno.readFile(`${out.path}/s`);
      assert.equal(bytes.byteLength, 30 * 65536);
      for (const [i, [offset, n]] of segments.entries()) {
        assert.equal(
          new TextDecoder().decode(bytes.subarray(offset, offset + n + 1)),
          String.fromCharCode(97 + (i % 26)).repeat(n) + "\0",
        );
      }
    },
  );
  await t.step("two segments and a trailing hole", async () => {
    await using out = await tempDir();
    await extract(
      archive(sparse([[0, 3], [1 << 20, 2], [(1 << 30) + 5, 0]], (1 << 30) + 5)),
      out.path,
    );
    const info = await Deno.stat(`${out.path}/s`);
    assert.equal(info.size, (1 << 30) + 5);
    assert.ok((info.blocks ?? 0) * 512 < 1 << 20);
    using f = await Deno.open(`${out.path}/s`);
    const head = new Uint8Array(3);
    await f.read(head);
    await f.seek(1 << 20, Deno.SeekMode.Start);
    const middle = new Uint8Array(2);
    await f.read(middle);
    assert.equal(new TextDecoder().decode(head) + new TextDecoder().decode(middle), "aaabb");
  });
  await using out = await tempDir();
  await t.step(
    "segments out of order",
    () =>
      refused(
        archive(sparse([[100, 3], [0, 2]], 200)),
        out.path,
        /"s" has a sparse map out of order or past its size/,
      ),
  );
  await t.step(
    "a segment past the real size",
    () => refused(archive(sparse([[0, 3]], 2)), out.path, /out of order or past its size/),
  );
  await t.step(
    "a map whose bytes do not match the data",
    () =>
      refused(
        archive(member("s", {
          type: "S",
          size: 10,
          data: "x".repeat(10),
          edit: (b) => {
            octal(b, 386, 12, 0);
            octal(b, 398, 12, 3);
            octal(b, 483, 12, 10);
          },
        })),
        out.path,
        /does not match its data/,
      ),
  );
  await t.step(
    "an extension block the archive never sends",
    () => refused(sparse([[0, 3]], 3, true).slice(0, 512), out.path, /ends inside its sparse map/),
  );
});

Deno.test("a refused member cancels the stream it came from", async () => {
  await using out = await tempDir();
  let cancelled = false;
  const bytes = archive(member("fifo", { type: "6" }));
  const stream = new ReadableStream<Uint8Array>({
    pull: (controller) => controller.enqueue(bytes.slice(0, 512)),
    cancel: () => void (cancelled = true),
  });
  await assert.rejects(extractTar(stream, out.path), /"fifo" is a FIFO/);
  assert.equal(cancelled, true);
});
