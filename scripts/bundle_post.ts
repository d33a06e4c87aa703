/**
 * `scripts/bundle.sh`, after each `deno bundle`: finishes the bundle in place (see
 * lib/sandbox/bundle_text.ts — its `require` made lazy and working, its source made ASCII).
 *
 *   deno run --allow-read --allow-write scripts/bundle_post.ts dist/sandbox.js [--require-ascii]
 */
import { BundleShapeError, finishBundle, isAscii } from "../lib/sandbox/bundle_text.ts";

const [file, option] = Deno.args;
if (!file || (option !== undefined && option !== "--require-ascii")) {
  console.error("usage: bundle_post.ts BUNDLE.js [--require-ascii]");
  Deno.exit(2);
}
try {
  const text = finishBundle(await Deno.readTextFile(file));
  // The CLI's own start pays for a two-byte source on every command: keep it ASCII.
  if (option === "--require-ascii" && !isAscii(text)) {
    throw new BundleShapeError(
      "a character outside ASCII is left where escaping it could change the code (see lib/sandbox/bundle_text.ts)",
    );
  }
  await Deno.writeTextFile(file, text);
} catch (error) {
  if (!(error instanceof BundleShapeError)) throw error;
  console.error(`bundle_post: ${file}: ${error.message}`);
  Deno.exit(1);
}
