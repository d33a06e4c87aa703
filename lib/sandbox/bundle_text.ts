/**
 * The last touch on every bundle the tool makes (the worker, the relay, the bundled CLI, which
 * alone is minified): `deno bundle`, then this. Used by `scripts/bundle.sh` and by a checkout that
 * bundles the worker on first use, so that both put the same bytes in the image.
 *
 * Three things. The first keeps the bytes the same wherever they are built: an unminified bundle
 * names each npm module it inlines by its path relative to where `deno bundle` ran, which names
 * the Deno cache's location (`../../root/.cache/deno/npm/…` from one checkout, `../../../root/…`
 * from a deeper one, another path under another DENO_DIR), so that two checkouts of the same
 * sources would bundle, and build images, differently (a checkout's worker would differ from the
 * one the bundled CLI carries). Each such name is made to start at the cache's `npm/`.
 * The other two make every start cheaper:
 * - The bundler gives the CommonJS packages it inlines a `require` for Node's built-in modules.
 *   Minified, it is one that throws ("Dynamic require of … is not supported"); unminified, it is
 *   a static import of `node:module` that every start pays for (~15 ms). Either is replaced by the
 *   same `require`, resolved on first use through `process.getBuiltinModule()`.
 * - One character outside ASCII anywhere in a file makes Deno hand V8 the whole source as
 *   two-byte text: ~13 ms more for the CLI's start, ~12 ms for the worker's (137 → 126 ms, `--help`
 *   on the host). Each is written in ASCII instead, in a way that reads the same where it stands:
 *   a `\u` escape, or in a tagged template's text a substitution of itself.
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
const IMPORT_SHIM_LAZY = "var __require = (id) => globalThis.process.getBuiltinModule(id) ?? " +
  '(() => { throw new Error(`Cannot find module "${id}"`); })();';
/**
 * Modules a bundle may require although they are not built-ins: `ws`'s optional native helpers
 * and `debug`'s `supports-color`, each required inside `try` and done without (the shims above
 * throw for them, as Node does for a missing module).
 */
const OPTIONAL_MODULES = new Set(['"bufferutil"', '"utf-8-validate"', '"supports-color"']);

/** The minified bundler's shim (esbuild's `__require`), whatever its names were minified to. */
const MINIFIED_SHIM = new RegExp(
  String
    .raw`([A-Za-z_$][\w$]*)=\((\w+)=>typeof require<"u"\?require:typeof Proxy<"u"\?new Proxy\(\2,` +
    String.raw`\{get:\((\w+),(\w+)\)=>\(typeof require<"u"\?require:\3\)\[\4\]\}\):\2\)` +
    String
      .raw`\(function\((\w+)\)\{if\(typeof require<"u"\)return require\.apply\(this,arguments\);` +
    String.raw`throw Error\('Dynamic require of "'\+\5\+'" is not supported'\)\}\)`,
  "g",
);

/** Thrown when a bundle is not in a shape this step knows. */
export class BundleShapeError extends Error {}

/** The bundle's text, finished: its `require` lazy and working, its source ASCII where that is safe. */
export function finishBundle(text: string): string {
  return asciiWhereSafe(lazyRequire(namedFromCache(text)));
}

/**
 * The path up to the Deno cache's npm directory (`npm/<registry>/<package>/<version>/`) in the two
 * places the unminified bundler names a module: the comment that opens its code, and the key of
 * its CommonJS or lazy-ESM wrapper (`  "<path>"(…) {`, a name the wrapper only looks itself up by).
 */
const NPM_MODULE_NAME = new RegExp(
  String.raw`^(// |  ")(?:[^"\n]*?/)?(npm/[^/"\n]+/(?:@[^/"\n]+/)?[^/"\n]+/\d+\.\d+\.\d+[^/"\n]*/)`,
  "gm",
);

/** The bundle with its npm modules named from the cache's `npm/` on, not from where it was built. */
function namedFromCache(text: string): string {
  return text.replace(NPM_MODULE_NAME, "$1<DENO_DIR>/$2");
}

function lazyRequire(text: string): string {
  const imports = text.split(IMPORT_SHIM).length - 1;
  const minified = [...text.matchAll(MINIFIED_SHIM)];
  if (imports + minified.length > 1) {
    throw new BundleShapeError(
      `expected the bundler's require shim at most once, found it ${
        imports + minified.length
      } times`,
    );
  }
  let name = "__require";
  if (imports === 1) text = text.replace(IMPORT_SHIM, IMPORT_SHIM_LAZY);
  else if (minified.length === 1) {
    name = minified[0][1];
    text = text.replace(
      MINIFIED_SHIM,
      `${name}=(id)=>globalThis.process.getBuiltinModule(id)??(()=>{throw Error("Cannot find module "+id)})()`,
    );
  }
  // process.getBuiltinModule knows only Node's built-ins: a bundle that requires anything else
  // at run time would break on that path, so it must not build.
  const calls = new RegExp(String.raw`(?<![\w$.])${name.replaceAll("$", "\\$")}\(([^)]*)\)`, "g");
  const notBuiltin = [...text.matchAll(calls)].map((m) => m[1]).filter((arg) =>
    !/^"node:[a-z0-9_/]+"$/.test(arg) && !OPTIONAL_MODULES.has(arg)
  );
  if (notBuiltin.length > 0) {
    throw new BundleShapeError(
      `the bundle requires modules that are not Node built-ins: ${notBuiltin.join(", ")}`,
    );
  }
  return text;
}

/** Keywords after which a `/` starts a regular expression and a backtick a plain template. */
const KEYWORDS_BEFORE_EXPRESSION = new Set([
  "return",
  "typeof",
  "case",
  "do",
  "else",
  "in",
  "of",
  "new",
  "delete",
  "void",
  "throw",
  "yield",
  "await",
  "instanceof",
]);

type AsciiPlace = "tagged" | "space" | "escapable";

/**
 * Where each character outside ASCII sits, read as JavaScript's lexer reads the bundler's output:
 * comments, string and template literals (with their `${}` nesting), regular expressions (told
 * from a division by the token before the `/`). For each such character: `tagged` in a tagged
 * template's text, `space` where code expects a separator, `escapable` anywhere else. Undefined
 * when the scan ends inside a literal or comment: the text is then not what it assumed.
 */
function placesOutsideAscii(text: string): Map<number, AsciiPlace> | undefined {
  return new OutsideAsciiScan(text).run();
}

/**
 * One left-to-right scan for `placesOutsideAscii`. Each step starts at `i` on the first character
 * of a token and leaves `i` just past it; a step returns false when the text ends inside what it
 * reads (the whole scan then gives up). `previous` is the last token (a word, or a punctuator's
 * character), which tells a regular expression from a division and a tagged template from a plain
 * one; `depth` counts open braces, and `templates` the `${` substitutions open at which depth.
 */
class OutsideAsciiScan {
  readonly places = new Map<number, AsciiPlace>();
  readonly templates: { tagged: boolean; depth: number }[] = [];
  depth = 0;
  previous = "";
  i = 0;

  constructor(readonly text: string) {}

  run(): Map<number, AsciiPlace> | undefined {
    while (this.i < this.text.length) {
      if (!this.step()) return undefined;
    }
    return this.templates.length === 0 ? this.places : undefined;
  }

  step(): boolean {
    const { text, i } = this;
    const c = text[i];
    if (c === "/" && text[i + 1] === "/") return this.lineComment();
    if (c === "/" && text[i + 1] === "*") return this.blockComment();
    if (c === '"' || c === "'") return this.quoted(c);
    if (c === "`") {
      this.i++;
      const tagged = /^[\w$)\]]/.test(this.previous.slice(-1)) &&
        !KEYWORDS_BEFORE_EXPRESSION.has(this.previous);
      return this.openTemplate(tagged);
    }
    if (
      c === "/" &&
      (this.previous === "" || /^[(,=:[!&|?{};+\-*%<>~^]$/.test(this.previous) ||
        KEYWORDS_BEFORE_EXPRESSION.has(this.previous))
    ) return this.regularExpression();
    if (c === "{") {
      this.depth++;
      this.previous = c;
      this.i++;
      return true;
    }
    if (c === "}") return this.closeBrace();
    if (/[\w$]/.test(c) || c.charCodeAt(0) > 0x7f) return this.word();
    if (!/\s/.test(c)) this.previous = c;
    this.i++;
    return true;
  }

  mark(at: number, place: "tagged" | "escapable"): void {
    if (this.text.charCodeAt(at) > 0x7f) this.places.set(at, place);
  }

  lineComment(): boolean {
    const { text } = this;
    for (; this.i < text.length && text[this.i] !== "\n"; this.i++) this.mark(this.i, "escapable");
    return true;
  }

  blockComment(): boolean {
    const close = this.text.indexOf("*/", this.i + 2);
    if (close < 0) return false;
    for (; this.i < close; this.i++) this.mark(this.i, "escapable");
    this.i = close + 2;
    return true;
  }

  quoted(quote: string): boolean {
    const { text } = this;
    for (this.i++; this.i < text.length && text[this.i] !== quote; this.i++) {
      if (text[this.i] === "\\" && text.charCodeAt(++this.i) > 0x7f) return false;
      this.mark(this.i, "escapable");
    }
    if (this.i++ >= text.length) return false;
    this.previous = quote;
    return true;
  }

  regularExpression(): boolean {
    const { text } = this;
    let inClass = false;
    for (this.i++; this.i < text.length && (inClass || text[this.i] !== "/"); this.i++) {
      if (text[this.i] === "\\") {
        if (text.charCodeAt(++this.i) > 0x7f) return false;
      } else if (text[this.i] === "[") inClass = true;
      else if (text[this.i] === "]") inClass = false;
      else if (text[this.i] === "\n") return false;
      this.mark(this.i, "escapable");
    }
    if (this.i++ >= text.length) return false;
    this.previous = "/re/";
    return true;
  }

  /** A `}`: the end of a `${` substitution (its template's text goes on) or of a block. */
  closeBrace(): boolean {
    this.i++;
    const open = this.templates.at(-1);
    if (open && open.depth === this.depth - 1) {
      this.templates.pop();
      this.depth--;
      return this.openTemplate(open.tagged);
    }
    this.depth--;
    this.previous = "}";
    return true;
  }

  word(): boolean {
    const { text } = this;
    const start = this.i;
    while (
      this.i < text.length && (/[\w$]/.test(text[this.i]) || text.charCodeAt(this.i) > 0x7f)
    ) {
      // Outside ASCII in code: a letter of a name (an escape reads the same) or a separator.
      if (text.charCodeAt(this.i) > 0x7f) {
        this.places.set(this.i, /\s/.test(text[this.i]) ? "space" : "escapable");
      }
      this.i++;
    }
    this.previous = text.slice(start, this.i);
    return true;
  }

  /** Template text from `i` (just past a backtick or a substitution's `}`). */
  openTemplate(tagged: boolean): boolean {
    const closed = this.templateText(tagged);
    if (closed === undefined) return false;
    if (closed) this.previous = "`";
    else this.templates.push({ tagged, depth: this.depth++ });
    return true;
  }

  /** Template text from `i` to its closing backtick (true) or a `${` (false). */
  templateText(tagged: boolean): boolean | undefined {
    const { text } = this;
    for (; this.i < text.length; this.i++) {
      const c = text[this.i];
      if (c === "\\") {
        // An escaped character outside ASCII (`\—`, a line continuation): not worth the cases.
        if (text.charCodeAt(++this.i) > 0x7f) return undefined;
      } else if (c === "`") {
        this.i++;
        return true;
      } else if (c === "$" && text[this.i + 1] === "{") {
        this.i += 2;
        return false;
      } else this.mark(this.i, tagged ? "tagged" : "escapable");
    }
    return undefined;
  }
}

/** A UTF-16 code unit as a `\u` escape. */
function escapeUnit(unit: number): string {
  return `\\u${unit.toString(16).padStart(4, "0")}`;
}

/**
 * Each character outside ASCII written in ASCII, so that it reads the same: a `\u` escape in
 * string and template literals, regular expressions, comments and names; in a tagged template's
 * text, where a tag may read the raw text (deepagents' prompts go through a `context` tag that
 * does), a substitution of the same character, `${"\u2014"}`: the raw text around it is unchanged,
 * and a tag that joins its texts and values gives the same string. A separator outside ASCII in
 * code becomes a space. When the scan cannot place every character, the text is left as it is.
 */
function asciiWhereSafe(text: string): string {
  const places = placesOutsideAscii(text);
  if (places === undefined) return text;
  let out = "";
  let last = 0;
  for (const [at, place] of places) {
    const unit = text.charCodeAt(at);
    out += text.slice(last, at) +
      (place === "tagged"
        ? `\${"${escapeUnit(unit)}"}`
        : place === "space"
        ? " "
        : escapeUnit(unit));
    last = at + 1;
  }
  return out + text.slice(last);
}

/** Whether the text is ASCII only: the bundled CLI must be (scripts/bundle_post.ts checks it). */
export function isAscii(text: string): boolean {
  // deno-lint-ignore no-control-regex -- the whole ASCII range, NUL included
  return !/[^\x00-\x7f]/.test(text);
}
