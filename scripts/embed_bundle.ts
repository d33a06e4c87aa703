/**
 * `scripts/bundle.sh`: readies a bundle to be embedded in the bundled CLI. Writes beside it its
 * SHA-256 (the image hash needs it on every start) and its bytes brotli-compressed, in base64:
 * every start of the CLI reads the embedded text (~8 ms per MB here), and brotli makes the
 * minified worker a quarter smaller than gzip does.
 *
 *   deno run --allow-read --allow-write scripts/embed_bundle.ts dist/worker.js
 */
import { brotliCompressSync, constants } from "node:zlib";
import { sha256HexOf } from "../lib/hash.ts";

const [file] = Deno.args;
if (!file) {
  console.error("usage: embed_bundle.ts BUNDLE.js");
  Deno.exit(2);
}
const bytes = await Deno.readFile(file);
const compressed = brotliCompressSync(bytes, {
  params: {
    [constants.BROTLI_PARAM_QUALITY]: constants.BROTLI_MAX_QUALITY,
    [constants.BROTLI_PARAM_LGWIN]: constants.BROTLI_MAX_WINDOW_BITS,
    [constants.BROTLI_PARAM_SIZE_HINT]: bytes.length,
  },
});
await Deno.writeTextFile(`${file}.sha256`, `${await sha256HexOf(bytes)}\n`);
await Deno.writeTextFile(`${file}.br.b64`, compressed.toBase64());
