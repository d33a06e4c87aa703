/** git for tests: a command that must succeed, and a repository with one commit. */
import assert from "node:assert/strict";
import { run } from "../lib/process.ts";

/** `git -C cwd ARGS`, which must succeed; its stdout, trimmed. */
export async function git(cwd: string, ...args: string[]): Promise<string> {
  const result = await run(["git", "-C", cwd, ...args]);
  assert.equal(result.exitCode, 0, `git ${args.join(" ")} failed in ${cwd}: ${result.stderr}`);
  return result.stdout.trim();
}

/**
 * A repository at `path` (made with its parents) whose `main` has one commit of a README.md
 * holding `readme`. Returns its real path (the CLI reports repositories by it).
 */
export async function createRepo(path: string, readme = "# demo\n"): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  await git(path, "init", "-q", "-b", "main");
  await Deno.writeTextFile(`${path}/README.md`, readme);
  await git(path, "add", "-A");
  await git(
    path,
    "-c",
    "user.name=Owner",
    "-c",
    "user.email=owner@example.test",
    "-c",
    "commit.gpgsign=false",
    "commit",
    "-qm",
    "initial",
  );
  return await Deno.realPath(path);
}
