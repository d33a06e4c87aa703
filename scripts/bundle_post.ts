/**
 * `scripts/bundle.sh`, last step: the bundler gives the CommonJS packages it inlines (commander,
 * yaml) a `require` for Node's built-in modules by importing `node:module` at the top of the
 * bundle — a static import, so every start of the CLI pays for initialising Node's module system
 * (~15 ms), even the commands that never load those packages. This replaces it with the same
 * `require`, resolved on first use through `process.getBuiltinModule()`. The bundler's exact line
 * is required: a Deno release that emits anything else fails the build here instead of shipping
 * a bundle that breaks.
 *
 *   deno run --allow-read --allow-write scripts/bundle_post.ts dist/sandbox.js
 */
const SHIM = 'import { createRequire as __deno_internal_createRequire } from "node:module";\n' +
  "var __require = __deno_internal_createRequire(import.meta.url);";
const LAZY = "var __require = (id) => globalThis.process.getBuiltinModule(id);";

const [file] = Deno.args;
if (!file) {
  console.error("usage: bundle_post.ts BUNDLE.js");
  Deno.exit(2);
}
const text = await Deno.readTextFile(file);
const found = text.split(SHIM).length - 1;
if (found !== 1) {
  console.error(`bundle_post: expected the bundler's require shim once in ${file}, found it ${found} times`);
  Deno.exit(1);
}
const uses = [...text.matchAll(/__require\("([^"]*)"\)/g)].map((m) => m[1]);
const notBuiltin = uses.filter((id) => !id.startsWith("node:"));
if (notBuiltin.length > 0) {
  console.error(`bundle_post: the bundle requires modules that are not Node built-ins: ${notBuiltin.join(", ")}`);
  Deno.exit(1);
}
await Deno.writeTextFile(file, text.replace(SHIM, LAZY));
