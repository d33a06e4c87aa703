/**
 * Where the bundled CLI keeps the worker and relay bundles it carries: in block comments at the
 * very end of its own file (dist/sandbox.js), brotli-compressed and in base64, read back from that
 * file only when an image is built.
 *
 * Measured: the same bytes as a string literal (even inside a function that is never called) cost
 * every start of the CLI more than as a comment, since Deno copies and V8 keeps a literal's text
 * where a comment is only skipped. Base64 holds neither `*` nor a line break, so it cannot end the
 * comment early, and the file stays ASCII (see bundle_text.ts).
 *
 * Written by scripts/embed_bundles.ts (`scripts/bundle.sh`), read by dist/embedded.ts.
 */

/** The comment that carries one bundle: its name, the length of its base64, the base64. */
export function trailerComment(name: string, base64: string): string {
  if (!/^[a-z]+$/.test(name)) throw new TypeError(`Invalid embedded bundle name: ${name}`);
  if (!/^[A-Za-z0-9+/=]*$/.test(base64)) {
    throw new TypeError(`The ${name} bundle's text is not base64`);
  }
  return `\n/* sandbox-embedded ${name} ${base64.length}\n${base64}\n*/\n`;
}

/**
 * The base64 of the bundle `name` carried at the end of the file at `url` (the bundled CLI's own
 * `import.meta.url`). Throws when it is missing or cut short: the caller reports a damaged CLI.
 */
export function readTrailer(url: string | URL, name: string): string {
  const text = Deno.readTextFileSync(new URL(url));
  const header = new RegExp(`\\n/\\* sandbox-embedded ${name} (\\d+)\\n`, "g");
  const matches = [...text.matchAll(header)];
  // The last one: the trailer follows all the code, so an earlier match is text inside the code.
  const match = matches.at(-1);
  if (!match) throw new Error(`no embedded ${name} bundle at the end of ${url}`);
  const start = match.index + match[0].length;
  const base64 = text.slice(start, start + Number(match[1]));
  if (base64.length !== Number(match[1]) || !text.startsWith("\n*/\n", start + base64.length)) {
    throw new Error(`the embedded ${name} bundle at the end of ${url} is cut short`);
  }
  return base64;
}
