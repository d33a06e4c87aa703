/**
 * The last touch on every bundle (lib/sandbox/bundle_text.ts): the bundler's `require` shims in
 * both shapes, refused shapes, and ASCII escapes that must not change what the code reads. The
 * real bundles are checked where they run: tests/unit/worker_test.ts runs the minified worker
 * from an empty directory, tests/e2e/bundle_test.ts the installed CLI.
 */
import assert from "node:assert/strict";
import { BundleShapeError, finishBundle, isAscii } from "../../lib/sandbox/bundle_text.ts";
import { run } from "../../lib/process.ts";
import { explain, ROOT, tempDir } from "../_helpers.ts";

/** Evaluates a finished bundle's text as a module and returns what it exported as `out`. */
async function evaluate(text: string): Promise<unknown> {
  const url = `data:text/javascript;base64,${new TextEncoder().encode(text).toBase64()}`;
  return (await import(url)).out;
}

const MINIFIED =
  `var Zr=(t=>typeof require<"u"?require:typeof Proxy<"u"?new Proxy(t,{get:(e,r)=>(typeof require<"u"?require:e)[r]}):t)` +
  `(function(t){if(typeof require<"u")return require.apply(this,arguments);throw Error('Dynamic require of "'+t+'" is not supported')});`;
const UNMINIFIED =
  'import { createRequire as __deno_internal_createRequire } from "node:module";\n' +
  "var __require = __deno_internal_createRequire(import.meta.url);";

Deno.test("the minified bundle's throwing require is replaced, under its minified name, by one that loads Node's built-ins", async () => {
  const text = `${MINIFIED}export const out = Zr("node:path").join("a", "b");`;
  await assert.rejects(evaluate(text), /Dynamic require of "node:path" is not supported/);
  const finished = finishBundle(text);
  assert.ok(!finished.includes("Dynamic require"), finished);
  assert.equal(await evaluate(finished), "a/b");
});

Deno.test("the unminified bundle's static import of node:module becomes the same lazy require", async () => {
  const finished = finishBundle(`${UNMINIFIED}\nexport const out = __require("node:os").EOL;`);
  assert.ok(!finished.includes("node:module"), finished);
  assert.equal(await evaluate(finished), "\n");
});

Deno.test("a bundle that requires anything but a Node built-in, or holds two shims, does not build", () => {
  assert.throws(
    () => finishBundle(`${MINIFIED}Zr("left-pad");`),
    (e: Error) => e instanceof BundleShapeError && /left-pad/.test(e.message),
  );
  assert.throws(() => finishBundle(`${MINIFIED}Zr(name);`), BundleShapeError);
  assert.throws(
    () => finishBundle(`${MINIFIED}${MINIFIED.replace("Zr", "Yq")}`),
    /at most once, found it 2 times/,
  );
  // A name that merely ends like the shim's is not a call of it.
  assert.doesNotThrow(() => finishBundle(`${MINIFIED}aZr("left-pad");x.Zr("y");`));
});

Deno.test("characters outside ASCII become escapes that read the same in strings, templates, regular expressions and comments", async () => {
  // The template comes last: a character after a template's closing backtick is read
  // conservatively, as if it might be in a tagged one (the next test).
  const text =
    'export const out = ["caf\u00e9 \u2014", /\u00e9+/.test("\u00e9\u00e9"), "\u{1F600}".length, `a\u2192${1}b`];\n';
  const finished = finishBundle(text);
  assert.ok(isAscii(finished), finished);
  assert.deepEqual(await evaluate(finished), await evaluate(text));
});

// deepagents' `context` tag, in substance: it reads the raw text and joins it with the values.
const CONTEXT_TAG = [
  "function context(strings, ...values) {",
  "  let result = '';",
  "  for (let i = 0; i < strings.raw.length; i++) {",
  "    result += strings.raw[i];",
  "    if (i < values.length) result += typeof values[i] === 'string' ? values[i] : JSON.stringify(values[i]);",
  "  }",
  "  return result.trim().replace(/\\\\n/g, '\\n');",
  "}",
].join("\n");

Deno.test("in a tagged template's text, a character outside ASCII becomes a substitution of itself: the tag's raw text and result are unchanged", async () => {
  const text = `${CONTEXT_TAG}\nconst name = "x";\n` +
    "export const out = [context`\n  Be brief \u2014 ${name} \u2192 done\\n \u{1F44B}`, String.raw`a\u2014\\n${1}b`, `plain \u00e9`];\n";
  const finished = finishBundle(text);
  assert.ok(isAscii(finished), finished);
  assert.match(finished, /Be brief \$\{"\\u2014"\} \$\{name\}/);
  assert.deepEqual(await evaluate(finished), await evaluate(text));
});

Deno.test("the scan tells templates, strings, comments and regular expressions apart: each character reads the same after", async () => {
  const text = [
    "const tag = String.raw;",
    "const half = 4 / 2; // a division: caf\u00e9",
    "/* a comment with a backtick ` and \u00e9 */",
    "const re = /[\"\u00e9`]+/g; const quote = 'it\\'s \u00e9';",
    "export const out = [half, 'x\u00e9\"'.match(re)[0], quote, tag`a ${`in \u00e9 ${'\u00e8'}`} \u00ea`, typeof /\u00e9/, `${{ a: '\u00e9' }.a}`, '\u2014'];",
  ].join("\n");
  const finished = finishBundle(text);
  assert.ok(isAscii(finished), finished);
  assert.deepEqual(await evaluate(finished), await evaluate(text));
});

Deno.test("a text the scan cannot place whole (an escaped character outside ASCII, an unterminated literal) is left as it is", () => {
  for (
    const text of ['const s = "\\\u00e9";', "const s = `\u00e9", 'const s = "\u00e9', "/* \u00e9"]
  ) {
    assert.equal(finishBundle(text), text);
  }
});

Deno.test("an npm module is named from the Deno cache's npm directory on, wherever the cache is; nothing else is renamed", async () => {
  const module = (cache: string) =>
    // esbuild's wrapper, which calls the one function it holds by looking its key up.
    "var __commonJS = (cb, mod) => () => (mod || (0, cb[Object.getOwnPropertyNames(cb)[0]])((mod = { exports: {} }).exports, mod), mod.exports);\n" +
    `// ${cache}/npm/registry.npmjs.org/@scope/pkg/1.2.3-rc.1/dist/index.js\n` +
    `var require_index = __commonJS({\n  "${cache}/npm/registry.npmjs.org/@scope/pkg/1.2.3-rc.1/dist/index.js"(exports, module) {\n` +
    `    module.exports = "../../root/.cache/deno/npm/registry.npmjs.org/x/1.0.0/kept.js";\n  }\n});\n` +
    `// worker/main.ts\nexport const out = require_index();\n`;
  const here = finishBundle(module("../../root/.cache/deno"));
  assert.equal(finishBundle(module("../../../home/someone/.cache/deno")), here);
  assert.equal(finishBundle(module(".deno")), here);
  assert.match(
    here,
    /^\/\/ <DENO_DIR>\/npm\/registry\.npmjs\.org\/@scope\/pkg\/1\.2\.3-rc\.1\/dist\/index\.js$/m,
  );
  // A string in the code is the code's: it keeps what it said.
  assert.match(
    here,
    /module\.exports = "\.\.\/\.\.\/root\/\.cache\/deno\/npm\/registry\.npmjs\.org\/x\/1\.0\.0\/kept\.js"/,
  );
  assert.match(here, /^\/\/ worker\/main\.ts$/m);
  assert.equal(
    await evaluate(here),
    "../../root/.cache/deno/npm/registry.npmjs.org/x/1.0.0/kept.js",
  );
});

// The real bundler: the worker's sources bundled from a copy one directory deeper (so the Deno
// cache is one `../` further away) finish as the same bytes.
Deno.test("the worker bundled from a checkout at another depth finishes byte for byte the same", async () => {
  await using deeper = await tempDir("sandbox-bundle-depth-");
  const copy = `${deeper.path}/one/two/three/checkout`;
  for (const dir of ["worker", "relay", "lib"]) {
    await Deno.mkdir(`${copy}/${dir}`, { recursive: true });
    const copied = await run(["cp", "-R", `${ROOT}/${dir}/.`, `${copy}/${dir}`]);
    assert.equal(copied.exitCode, 0, explain(copied));
  }
  for (const file of ["deno.json", "deno.lock"]) {
    await Deno.copyFile(`${ROOT}/${file}`, `${copy}/${file}`);
  }
  const bundled: string[] = [];
  for (const cwd of [ROOT, copy]) {
    const out = `${deeper.path}/worker-${bundled.length}.js`;
    const result = await run([
      Deno.execPath(),
      "bundle",
      "--quiet",
      "--platform",
      "deno",
      "-o",
      out,
      "worker/main.ts",
    ], { cwd, timeoutMs: 120_000 });
    assert.equal(result.exitCode, 0, explain(result));
    bundled.push(await Deno.readTextFile(out));
  }
  assert.notEqual(
    bundled[0],
    bundled[1],
    "the bundler no longer names the cache's location: this step may be unneeded",
  );
  assert.ok(finishBundle(bundled[0]) === finishBundle(bundled[1]), "the finished bundles differ");
});
