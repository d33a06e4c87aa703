/**
 * The provider seam (docs/architecture.md, "The provider seam"): everything above lib/sandbox/
 * reaches sandboxes through provider.ts and providers.ts (and the mode-dispatching modules beside
 * them), never through Docker's own modules.
 */
import assert from "node:assert/strict";
import { dirname, join, normalize, relative } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = normalize(join(dirname(fileURLToPath(import.meta.url)), "..", ".."));

/** The Docker implementation's modules, which only lib/sandbox/ (and what is Docker by nature) uses. */
const DOCKER_MODULE = /^lib\/sandbox\/(docker[^/]*|engine[^/]*|pool|pool_records)\.ts$/;

/** Code above the sandbox layer: the CLI, the library outside lib/sandbox/, worker and relay. */
const ABOVE = ["cli.ts", "cli", "lib", "worker", "relay"];

/** Below or beside the seam by nature: the sandbox layer itself, and the Docker checks of doctor. */
const BENEATH = /^(lib\/sandbox\/|lib\/doctor\/)/;

/**
 * Files above the seam that may still import Docker's modules, each with its reason. An entry
 * whose file no longer needs it fails the test, so that the list only shrinks.
 */
const ALLOWED: Record<string, string> = {
  "lib/agents/agent_image.ts": "builds an agent CLI's layer on the sandbox image: a Docker image",
  "lib/repo/cache.ts":
    "the Docker lifecycle's repository object cache, a Docker volume (used by docker_lifecycle.ts)",
};

/** Every module specifier `source` imports or re-exports, statically or with `import()`. */
function specifiers(source: string): string[] {
  const found: string[] = [];
  const pattern = /(?:\bfrom|\bimport)\s*\(?\s*["']([^"']+)["']/g;
  for (const match of source.matchAll(pattern)) found.push(match[1]);
  return found;
}

/** The repository-relative paths of the modules `file` (repository-relative) imports. */
function importsOf(file: string): string[] {
  const source = Deno.readTextFileSync(join(ROOT, file));
  return specifiers(source)
    .filter((specifier) => specifier.startsWith("."))
    .map((specifier) => relative(ROOT, join(ROOT, dirname(file), specifier)));
}

function* sourceFiles(path: string): Generator<string> {
  const full = join(ROOT, path);
  if (Deno.statSync(full).isFile) {
    if (path.endsWith(".ts")) yield path;
    return;
  }
  for (const entry of Deno.readDirSync(full)) yield* sourceFiles(`${path}/${entry.name}`);
}

/** Each file above the seam that imports a Docker module, with the modules it imports. */
function dockerImporters(): Map<string, string[]> {
  const importers = new Map<string, string[]>();
  for (const file of ABOVE.flatMap((path) => [...sourceFiles(path)])) {
    if (BENEATH.test(file)) continue;
    const docker = importsOf(file).filter((module) => DOCKER_MODULE.test(module));
    if (docker.length > 0) importers.set(file, docker);
  }
  return importers;
}

Deno.test("nothing above lib/sandbox/ imports Docker's modules but the allowed files", () => {
  const importers = dockerImporters();
  const unexpected = [...importers].filter(([file]) => !(file in ALLOWED));
  assert.deepEqual(
    unexpected,
    [],
    `use lib/sandbox/provider.ts and providers.ts (or a function in lib/sandbox/ that dispatches by mode) instead:\n${
      unexpected.map(([file, modules]) => `${file}: ${modules.join(", ")}`).join("\n")
    }`,
  );
});

Deno.test("each allowed file still imports a Docker module (the allow-list only shrinks)", () => {
  const importers = dockerImporters();
  const stale = Object.keys(ALLOWED).filter((file) => !importers.has(file));
  assert.deepEqual(stale, [], `remove these entries from ALLOWED: ${stale.join(", ")}`);
});

Deno.test("the check sees the imports it looks for: static, dynamic and re-exports", () => {
  // The sandbox layer's own chooser imports the Docker provider: the scan must see it.
  assert.ok(
    importsOf("lib/sandbox/providers.ts").includes("lib/sandbox/docker_provider.ts"),
    "providers.ts's import of docker_provider.ts was not found",
  );
  assert.deepEqual(
    specifiers([
      'import { a } from "../lib/sandbox/pool.ts";',
      'import type { B } from "./docker.ts";',
      'const { c } = await import("../sandbox/engine_api.ts");',
      'export { d } from "./pool_records.ts";',
      "// a comment naming lib/sandbox/pool.ts is no import",
    ].join("\n")),
    ["../lib/sandbox/pool.ts", "./docker.ts", "../sandbox/engine_api.ts", "./pool_records.ts"],
  );
  assert.ok(DOCKER_MODULE.test("lib/sandbox/docker_tty.ts"));
  assert.ok(!DOCKER_MODULE.test("lib/sandbox/providers.ts"));
});
