/**
 * The last touch on every bundle (lib/sandbox/bundle_text.ts): the bundler's `require` shims in
 * both shapes, refused shapes, and ASCII escapes that must not change what the code reads. The
 * real bundles are checked where they run: tests/unit/worker_test.ts runs the minified worker
 * from an empty directory, tests/e2e/bundle_test.ts the installed CLI.
 */
import assert from "node:assert/strict";
import { BundleShapeError, finishBundle, isAscii } from "../../lib/sandbox/bundle_text.ts";

/** Evaluates a finished bundle's text as a module and returns what it exported as `out`. */
async function evaluate(text: string): Promise<unknown> {
  const url = `data:text/javascript;base64,${new TextEncoder().encode(text).toBase64()}`;
  return (await import(url)).out;
}

const MINIFIED = `var Zr=(t=>typeof require<"u"?require:typeof Proxy<"u"?new Proxy(t,{get:(e,r)=>(typeof require<"u"?require:e)[r]}):t)` +
  `(function(t){if(typeof require<"u")return require.apply(this,arguments);throw Error('Dynamic require of "'+t+'" is not supported')});`;
const UNMINIFIED = 'import { createRequire as __deno_internal_createRequire } from "node:module";\n' +
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
  assert.throws(() => finishBundle(`${MINIFIED}Zr("left-pad");`), (e: Error) => e instanceof BundleShapeError && /left-pad/.test(e.message));
  assert.throws(() => finishBundle(`${MINIFIED}Zr(name);`), BundleShapeError);
  assert.throws(() => finishBundle(`${MINIFIED}${MINIFIED.replace("Zr", "Yq")}`), /at most once, found it 2 times/);
  // A name that merely ends like the shim's is not a call of it.
  assert.doesNotThrow(() => finishBundle(`${MINIFIED}aZr("left-pad");x.Zr("y");`));
});

Deno.test("characters outside ASCII become escapes that read the same in strings, templates, regular expressions and comments", async () => {
  // The template comes last: a character after a template's closing backtick is read
  // conservatively, as if it might be in a tagged one (the next test).
  const text = 'export const out = ["caf\u00e9 \u2014", /\u00e9+/.test("\u00e9\u00e9"), "\u{1F600}".length, `a\u2192${1}b`];\n';
  const finished = finishBundle(text);
  assert.ok(isAscii(finished), finished);
  assert.deepEqual(await evaluate(finished), await evaluate(text));
});

Deno.test("a character outside ASCII that may be in a tagged template's raw text leaves the text as it is", async () => {
  const text = 'const tag = (s) => s.raw[0]; export const out = [tag`\u2014`, "\u00e9"];';
  const finished = finishBundle(text);
  assert.equal(finished, text);
  assert.deepEqual(await evaluate(finished), ["\u2014", "\u00e9"]);
  // So does one after any template's closing backtick: the check errs on the side of leaving text.
  assert.equal(finishBundle('const s = `x`; const t = "\u00e9";'), 'const s = `x`; const t = "\u00e9";');
  // After a keyword, a backtick opens a plain template: escaped.
  assert.ok(isAscii(finishBundle("function f() { return`\u2014`; }")));
});
