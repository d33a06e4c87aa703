/**
 * lib/hash.ts `cachedByIdentity`: a digest of files is computed once while they stay as they
 * are, and again as soon as one of them changes, is replaced, or is gone.
 */
import assert from "node:assert/strict";
import { cachedByIdentity, fileSha256, sha256Hex } from "../../lib/hash.ts";
import { tempDir } from "../_helpers.ts";

Deno.test("a digest of files is computed once while they are unchanged, and again when one changes, is replaced or is missing", async () => {
  await using dir = await tempDir();
  const cache = `${dir.path}/cache`;
  const [a, b] = [`${dir.path}/a.ts`, `${dir.path}/b.ts`];
  await Deno.writeTextFile(a, "one");
  await Deno.writeTextFile(b, "two");
  let computed = 0;
  const digest = (paths: string[]) =>
    cachedByIdentity(paths, cache, async () => {
      computed++;
      return await sha256Hex(
        (await Promise.all(paths.map((p) => Deno.readTextFile(p)))).join("\0"),
      );
    });
  const first = await digest([a, b]);
  assert.equal(await digest([a, b]), first);
  assert.equal(computed, 1, "an unchanged set was read again");
  // Another set of the same files is another entry.
  await digest([a]);
  assert.equal(computed, 2);
  // Changed content (its size and time change with it): computed again, and the new digest.
  await Deno.writeTextFile(b, "three");
  const changed = await digest([a, b]);
  assert.equal(computed, 3);
  assert.notEqual(changed, first);
  // Replaced by another file of the same size and time (a new inode): computed again.
  const info = await Deno.stat(b);
  await Deno.writeTextFile(`${b}.new`, "thr33");
  await Deno.utime(`${b}.new`, info.atime!, info.mtime!);
  await Deno.rename(`${b}.new`, b);
  const replaced = await digest([a, b]);
  assert.equal(computed, 4);
  assert.notEqual(replaced, changed);
  // One gone: no identity, so computed (and its failure is the caller's).
  await Deno.remove(b);
  await assert.rejects(() => digest([a, b]), Deno.errors.NotFound);
  assert.equal(computed, 5);
});

Deno.test("a file's SHA-256 is its bytes' whether or not it was remembered", async () => {
  await using dir = await tempDir();
  const path = `${dir.path}/f`;
  await Deno.writeTextFile(path, "content");
  const expected = await sha256Hex("content");
  assert.equal(await fileSha256(path), expected);
  assert.equal(await fileSha256(path, `${dir.path}/cache`), expected);
  assert.equal(await fileSha256(path, `${dir.path}/cache`), expected);
});
