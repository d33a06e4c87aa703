/**
 * The last touch on every bundle the tool makes (the worker, the relay, the bundled CLI, which
 * alone is minified): `deno bundle`, then this. Used by `scripts/bundle.sh` and by a checkout that
 * bundles the worker on first use, so that both put the same bytes in the image.
 *
 * Two things, both found by measuring starts:
 * - The bundler gives the CommonJS packages it inlines a `require` for Node's built-in modules.
 *   Minified, it is one that throws ("Dynamic require of … is not supported"); unminified, it is
 *   a static import of `node:module` that every start pays for (~15 ms). Either is replaced by the
 *   same `require`, resolved on first use through `process.getBuiltinModule()`.
 * - One character outside ASCII anywhere in a file makes Deno hand V8 the whole source as
 *   two-byte text: ~13 ms more for the CLI's start, ~17 ms for the worker's. Each is written as a
 *   `\u` escape instead, where that cannot change what the code reads.
 *
 * The bundler's exact shapes are required: a Deno release that emits anything else fails the
 * build here instead of shipping a bundle that breaks.
 */

/**
 * The unminified bundler's shim: a static import of node:module. Joined at run time, so that the
 * bundled CLI (which holds this module) does not contain the very text it looks for.
 */
const IMPORT_SHIM = [
  'import { createRequire as __deno_internal_createRequire } from "node:module";',
  "var __require = __deno_internal_createRequire(import.meta.url);",
].join("\n");
const IMPORT_SHIM_LAZY = "var __require = (id) => globalThis.process.getBuiltinModule(id);";

/** The minified bundler's shim (esbuild's `__require`), whatever its names were minified to. */
const MINIFIED_SHIM = new RegExp(
  String.raw`([A-Za-z_$][\w$]*)=\((\w+)=>typeof require<"u"\?require:typeof Proxy<"u"\?new Proxy\(\2,` +
    String.raw`\{get:\((\w+),(\w+)\)=>\(typeof require<"u"\?require:\3\)\[\4\]\}\):\2\)` +
    String.raw`\(function\((\w+)\)\{if\(typeof require<"u"\)return require\.apply\(this,arguments\);` +
    String.raw`throw Error\('Dynamic require of "'\+\5\+'" is not supported'\)\}\)`,
  "g",
);

/** Thrown when a bundle is not in a shape this step knows. */
export class BundleShapeError extends Error {}

/** The bundle's text, finished: its `require` lazy and working, its source ASCII where that is safe. */
export function finishBundle(text: string): string {
  return asciiWhereSafe(lazyRequire(text));
}

function lazyRequire(text: string): string {
  const imports = text.split(IMPORT_SHIM).length - 1;
  const minified = [...text.matchAll(MINIFIED_SHIM)];
  if (imports + minified.length > 1) {
    throw new BundleShapeError(`expected the bundler's require shim at most once, found it ${imports + minified.length} times`);
  }
  let name = "__require";
  if (imports === 1) text = text.replace(IMPORT_SHIM, IMPORT_SHIM_LAZY);
  else if (minified.length === 1) {
    name = minified[0][1];
    text = text.replace(MINIFIED_SHIM, `${name}=(id)=>globalThis.process.getBuiltinModule(id)`);
  }
  // process.getBuiltinModule knows only Node's built-ins: a bundle that requires anything else
  // at run time would break on that path, so it must not build.
  const calls = new RegExp(String.raw`(?<![\w$.])${name.replaceAll("$", "\\$")}\(([^)]*)\)`, "g");
  const notBuiltin = [...text.matchAll(calls)].map((m) => m[1]).filter((arg) => !/^"node:[a-z_/]+"$/.test(arg));
  if (notBuiltin.length > 0) {
    throw new BundleShapeError(`the bundle requires modules that are not Node built-ins: ${notBuiltin.join(", ")}`);
  }
  return text;
}

/** Whether a backtick after this text may open a tagged template: it follows a name or a bracket, not a keyword. */
function mayBeTag(before: string): boolean {
  return /[\w$)\]]$/.test(before) && !/(?:^|[^\w$])(?:return|typeof|case|in|of|yield|await|void|delete|throw|else|do)$/.test(before);
}

/**
 * Each character outside ASCII as a `\u` escape. That reads the same in string and template
 * literals, regular expressions and comments, but not in a tagged template's raw text
 * (deepagents' prompts go through a `dedent` that reads `strings.raw`): if any such character may
 * be in a tagged template (its backtick follows a name or a bracket), the text is left as it is —
 * one character is enough to lose the gain, and changing what a tag reads is not worth it.
 */
function asciiWhereSafe(text: string): string {
  const outside = [...text.matchAll(/[^\x00-\x7f]/g)].map((match) => match.index!);
  for (const at of outside) {
    const tick = text.lastIndexOf("`", at);
    if (tick > 0 && mayBeTag(text.slice(Math.max(0, tick - 12), tick))) return text;
  }
  let out = "";
  let last = 0;
  for (const at of outside) {
    out += text.slice(last, at) + `\\u${text.charCodeAt(at).toString(16).padStart(4, "0")}`;
    last = at + 1;
  }
  return out + text.slice(last);
}

/** Whether the text is ASCII only: the bundled CLI must be (scripts/bundle_post.ts checks it). */
export function isAscii(text: string): boolean {
  return !/[^\x00-\x7f]/.test(text);
}
