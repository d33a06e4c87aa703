import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
/** The folders whose every file the tree of docs/architecture.md names. */
const SOURCE_DIRS = ["cli", "lib", "worker", "relay", "scripts"];

interface TreeEntry {
  path: string;
  line: number;
}

/**
 * The entries of the tree under "## Files": two spaces of indent per level, a folder as `NAME/`
 * alone on its line, a file as its name then at least two spaces and what it is for.
 */
function parseTree(markdown: string): { entries: TreeEntry[]; problems: string[] } {
  const lines = markdown.split("\n");
  const heading = lines.indexOf("## Files");
  assert.notEqual(heading, -1, 'docs/architecture.md has no "## Files" section');
  const open = lines.indexOf("```", heading);
  const close = lines.indexOf("```", open + 1);
  assert.ok(open !== -1 && close !== -1, 'the "## Files" section has no fenced tree');
  const entries: TreeEntry[] = [];
  const problems: string[] = [];
  const folders: string[] = [];
  for (let i = open + 1; i < close; i++) {
    const match = /^( *)(\S+)(?: {2,}(\S.*))?$/.exec(lines[i]);
    const where = `docs/architecture.md:${i + 1}`;
    if (!match || match[1].length % 2 !== 0) {
      problems.push(`${where}: not an entry of the tree: ${JSON.stringify(lines[i])}`);
      continue;
    }
    const level = match[1].length / 2;
    if (level > folders.length) {
      problems.push(`${where}: ${match[2]} is indented deeper than the folder above it`);
      continue;
    }
    folders.length = level;
    if (match[2].endsWith("/")) {
      folders.push(match[2].slice(0, -1));
    } else if (match[3] === undefined) {
      problems.push(`${where}: ${match[2]} has no line saying what it is for`);
    } else {
      entries.push({ path: [...folders, match[2]].join("/"), line: i + 1 });
    }
  }
  return { entries, problems };
}

async function filesUnder(dir: string): Promise<string[]> {
  const found: string[] = [];
  for await (const entry of Deno.readDir(join(ROOT, dir))) {
    if (entry.name.startsWith(".")) continue;
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) found.push(...await filesUnder(path));
    else found.push(path);
  }
  return found;
}

Deno.test("docs/architecture.md's tree names every file of the source folders, and each only once", async () => {
  const { entries, problems } = parseTree(
    await Deno.readTextFile(join(ROOT, "docs/architecture.md")),
  );
  assert.deepEqual(problems, []);
  const named = new Set(entries.map((entry) => entry.path));
  assert.equal(named.size, entries.length, "an entry is named twice");
  const files = (await Promise.all(SOURCE_DIRS.map(filesUnder))).flat().sort();
  assert.ok(files.includes("lib/run/run.ts"), `the walk found no sources: ${files.join(", ")}`);
  const missing = files.filter((file) => !named.has(file));
  assert.deepEqual(missing, [], "files missing from the tree of docs/architecture.md");
});

Deno.test("every file docs/architecture.md's tree names exists", async () => {
  const { entries } = parseTree(await Deno.readTextFile(join(ROOT, "docs/architecture.md")));
  assert.ok(entries.length > 100, `the tree has only ${entries.length} entries`);
  const absent: string[] = [];
  for (const entry of entries) {
    const info = await Deno.stat(join(ROOT, entry.path)).catch(() => undefined);
    if (!info?.isFile) absent.push(`docs/architecture.md:${entry.line}: ${entry.path}`);
  }
  assert.deepEqual(absent, [], "entries of the tree that are not files");
});
