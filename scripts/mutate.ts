/**
 * `deno task mutate`: deliberate breaks of the security defences, one at a time, each of which the
 * tests must catch.
 *
 * A test suite is evidence for a defence only if it fails when the defence is gone. For every
 * mutation in tests/mutations.ts this script copies the tracked tree to a scratch directory, applies
 * the one change there (the checkout is never touched), runs the mutation's tests, and requires them
 * to FAIL. It also requires the same tests to PASS on the unmutated copy first, so that a failure
 * means "caught", not "already broken". A mutation whose text no longer matches exactly once is an
 * error too: the list must follow the code, or it silently proves nothing.
 *
 *   usage: deno task mutate [--baseline-passed] [NAME_SUBSTRING...]
 * `--baseline-passed`: the caller has just run the whole suite green on this same tree (scripts/test.sh
 * does, before calling this), which is the baseline; running it again would only double the time.
 * Exit 0 when every mutation was caught; 1 otherwise, naming each one that survived.
 */
import { type Mutation, MUTATIONS } from "../tests/mutations.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const encoder = new TextEncoder();

function say(text: string): void {
  Deno.stderr.writeSync(encoder.encode(`mutate: ${text}\n`));
}

async function output(argv: string[], cwd: string): Promise<{ code: number; text: string }> {
  const child = new Deno.Command(argv[0], {
    args: argv.slice(1),
    cwd,
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).spawn();
  const [status, out, err] = await Promise.all([
    child.status,
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
  ]);
  return { code: status.code, text: out + err };
}

/** A scratch copy of every tracked file (and the lock file), so mutations never touch the checkout. */
async function scratchCopy(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "sandbox-mutate-" });
  const listed = await output(["git", "ls-files", "-z"], ROOT);
  if (listed.code !== 0) throw new Error(`git ls-files failed: ${listed.text}`);
  for (const file of listed.text.split("\0").filter(Boolean)) {
    const target = `${dir}/${file}`;
    await Deno.mkdir(target.replace(/\/[^/]*$/, ""), { recursive: true });
    await Deno.copyFile(`${ROOT}/${file}`, target).catch((error) => {
      // A tracked file deleted in the working tree is simply absent from the copy.
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    });
  }
  return dir;
}

/** Unit tests by default; `--no-check`: a mutation is a text change, and type errors are not "caught". */
function testArgv(tests: readonly string[], filter?: string): string[] {
  const only = filter === undefined ? [] : ["--filter", filter];
  return ["deno", "test", "--allow-all", "--no-check", "--quiet", "--fail-fast", ...only, ...tests];
}

function occurrences(text: string, find: string): number {
  let count = 0;
  for (let at = text.indexOf(find); at !== -1; at = text.indexOf(find, at + 1)) count++;
  return count;
}

async function check(dir: string, mutation: Mutation): Promise<string | undefined> {
  const path = `${dir}/${mutation.file}`;
  const original = await Deno.readTextFile(path);
  const count = occurrences(original, mutation.find);
  if (count !== 1) {
    return `its text occurs ${count} times in ${mutation.file} (expected exactly once): update tests/mutations.ts`;
  }
  await Deno.writeTextFile(path, original.replace(mutation.find, () => mutation.replace));
  try {
    const result = await output(testArgv(mutation.tests, mutation.filter), dir);
    if (result.code === 0) {
      return `the tests still pass with the defence removed (${mutation.tests.join(", ")})`;
    }
    return undefined;
  } finally {
    await Deno.writeTextFile(path, original);
  }
}

async function main(args: string[]): Promise<number> {
  const baselinePassed = args.includes("--baseline-passed");
  const filters = args.filter((arg) => arg !== "--baseline-passed");
  const selected = MUTATIONS.filter((m) =>
    filters.length === 0 || filters.some((f) => m.name.includes(f))
  );
  if (selected.length === 0) {
    say(`no mutation matches ${filters.map((f) => `"${f}"`).join(", ")}`);
    return 2;
  }
  const dir = await scratchCopy();
  try {
    const allTests = [...new Set(selected.flatMap((m) => m.tests))];
    say(
      baselinePassed
        ? `baseline: the suite just passed on this tree (${allTests.length} test file(s) among it)`
        : `baseline: ${allTests.length} test file(s) must pass unmutated`,
    );
    const baseline = baselinePassed ? { code: 0, text: "" } : await output(testArgv(allTests), dir);
    if (baseline.code !== 0) {
      say(
        "baseline failed: the tests fail without any mutation, so no mutation can prove anything",
      );
      Deno.stderr.writeSync(encoder.encode(baseline.text.slice(-4000) + "\n"));
      return 1;
    }
    const survivors: string[] = [];
    for (const [index, mutation] of selected.entries()) {
      const started = performance.now();
      const problem = await check(dir, mutation);
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      const label = `[${index + 1}/${selected.length}] ${mutation.name}`;
      if (problem) {
        survivors.push(`${mutation.name}: ${problem}`);
        say(`${label}: NOT CAUGHT (${seconds}s): ${problem}`);
      } else {
        say(`${label}: caught (${seconds}s)`);
      }
    }
    console.log(
      `mutations: ${selected.length - survivors.length} caught, ${survivors.length} not caught`,
    );
    for (const survivor of survivors) console.log(`  not caught: ${survivor}`);
    return survivors.length === 0 ? 0 : 1;
  } finally {
    await Deno.remove(dir, { recursive: true }).catch((error) =>
      say(`cannot remove the scratch copy ${dir}: ${error.message}`)
    );
  }
}

Deno.exit(await main(Deno.args));
