/**
 * The bundles the bundled CLI carries in comments at the end of its file
 * (lib/sandbox/bundle_trailer.ts): written and read back whole, ignored by the code around them,
 * refused when missing or cut short, and not fooled by the same header earlier in the code. The
 * real bundle is read back by tests/e2e/bundle_test.ts (a run of mode none from an empty
 * directory, whose worker is the one the bundle carries).
 */
import assert from "node:assert/strict";
import { readTrailer, trailerComment } from "../../lib/sandbox/bundle_trailer.ts";
import { tempDir } from "../_helpers.ts";

const WORKER = new Uint8Array(4096).map((_, i) => (i * 7919) % 256).toBase64();

async function bundleFile(dir: string, text: string): Promise<URL> {
  const path = `${dir}/sandbox.js`;
  await Deno.writeTextFile(path, text);
  return new URL(`file://${path}`);
}

Deno.test("a bundle carried in a trailing comment reads back byte for byte, and the code around it still runs", async () => {
  await using dir = await tempDir();
  const code = "export const out = 6 * 7;\n";
  const url = await bundleFile(
    dir.path,
    code + trailerComment("worker", WORKER) + trailerComment("relay", "cmVsYXk="),
  );
  assert.equal(readTrailer(url, "worker"), WORKER);
  assert.equal(readTrailer(url, "relay"), "cmVsYXk=");
  assert.equal((await import(url.href)).out, 42);
});

Deno.test("a missing or cut-short trailer is refused, naming the bundle", async () => {
  await using dir = await tempDir();
  const missing = await bundleFile(dir.path, "export {};\n" + trailerComment("relay", "cmVsYXk="));
  assert.throws(() => readTrailer(missing, "worker"), /no embedded worker bundle/);
  const whole = "export {};\n" + trailerComment("worker", WORKER);
  const cut = await bundleFile(dir.path, whole.slice(0, whole.length - 100) + "\n*/\n");
  assert.throws(() => readTrailer(cut, "worker"), /worker bundle .* is cut short/);
});

Deno.test("the trailer after the code wins over the same header inside the code", async () => {
  await using dir = await tempDir();
  const decoy = `const s = \`${trailerComment("worker", "ZGVjb3k=").replaceAll("*/", "* /")}\`;\n`;
  const url = await bundleFile(dir.path, decoy + trailerComment("worker", WORKER));
  assert.equal(readTrailer(url, "worker"), WORKER);
});

Deno.test("only base64 and plain names are written: nothing that could end the comment early", () => {
  assert.throws(() => trailerComment("worker", "abc*/def"), /not base64/);
  assert.throws(() => trailerComment("wor ker", "abc"), /Invalid embedded bundle name/);
});
