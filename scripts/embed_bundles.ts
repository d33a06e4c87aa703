/**
 * `scripts/bundle.sh`: the worker and relay bundles as the bundled CLI carries them, each
 * brotli-compressed and in base64. Writes two files:
 * - dist/embedded.ts: the SHA-256 of each bundle's bytes (the image hash needs it on every start)
 *   and a function that reads the bundle back when an image is built;
 * - dist/embedded.trailer: the bundles themselves, as the comments bundle.sh appends to
 *   dist/sandbox.js (lib/sandbox/bundle_trailer.ts: a comment costs every start less than a string
 *   literal, whose text V8 keeps even in a function never called).
 * Brotli makes the worker a third smaller than `gzip -9` does (1.18 against 1.73 MB of base64).
 *
 *   deno run --allow-read --allow-write scripts/embed_bundles.ts dist
 */
import { brotliCompressSync, constants } from "node:zlib";
import { sha256HexOf } from "../lib/hash.ts";
import { trailerComment } from "../lib/sandbox/bundle_trailer.ts";

const [dir] = Deno.args;
if (!dir) {
  console.error("usage: embed_bundles.ts DIST_DIR (holding worker.js and relay.js)");
  Deno.exit(2);
}

const trailer: string[] = [];

async function entry(name: string): Promise<string> {
  const bytes = await Deno.readFile(`${dir}/${name}.js`);
  const compressed = brotliCompressSync(bytes, {
    params: {
      [constants.BROTLI_PARAM_QUALITY]: constants.BROTLI_MAX_QUALITY,
      [constants.BROTLI_PARAM_LGWIN]: constants.BROTLI_MAX_WINDOW_BITS,
      [constants.BROTLI_PARAM_SIZE_HINT]: bytes.length,
    },
  });
  trailer.push(trailerComment(name, compressed.toBase64()));
  return `export const ${name}: EmbeddedBundle = {\n  brotliBase64: () => readTrailer(import.meta.url, "${name}"),\n` +
    `  sha256: "${await sha256HexOf(bytes)}",\n};\n`;
}

await Deno.writeTextFile(
  `${dir}/embedded.ts`,
  "// Written by scripts/embed_bundles.ts (scripts/bundle.sh): do not edit.\n" +
    'import type { EmbeddedBundle } from "../lib/sandbox/worker_bundle.ts";\n' +
    'import { readTrailer } from "../lib/sandbox/bundle_trailer.ts";\n\n' +
    (await entry("worker")) + (await entry("relay")),
);
await Deno.writeTextFile(`${dir}/embedded.trailer`, trailer.join(""));
