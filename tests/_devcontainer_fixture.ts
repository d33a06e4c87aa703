/**
 * Devcontainer end-to-end fixtures: a git repository made by the test (with its devcontainer
 * configuration committed), a profile in mode devcontainer talking to the fake LLM, and cleanup of
 * everything built for that repository (its images carry the repository's path as a label).
 */
export { git } from "./_git.ts";
import { git } from "./_git.ts";
import assert from "node:assert/strict";
import { run, type RunResult } from "../lib/process.ts";
import { SOURCE_LABEL } from "../lib/sandbox/devcontainer/image.ts";
import { repoContainerOf, RunFixture } from "./_run_fixture.ts";

export const KEY_ENV = "SANDBOX_E2E_DEVCONTAINER_KEY";
const USER_GIT = [
  "-c",
  "user.name=Repo Owner",
  "-c",
  "user.email=owner@example.test",
  "-c",
  "commit.gpgsign=false",
];

// deno-lint-ignore no-explicit-any
export type Wire = Record<string, any>;

/** `git ARGS` in `cwd`; stdout, or a failure with stderr. */

/** Write `files` (executable when the name ends in .sh) and commit them all; returns the commit. */
export async function commitFiles(
  repo: string,
  files: Record<string, string>,
  message: string,
): Promise<string> {
  for (const [name, content] of Object.entries(files)) {
    const file = `${repo}/${name}`;
    await Deno.mkdir(file.slice(0, file.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(file, content, { mode: name.endsWith(".sh") ? 0o755 : 0o644 });
  }
  await git(repo, "add", "-A");
  await git(repo, ...USER_GIT, "commit", "-q", "-m", message);
  return await git(repo, "rev-parse", "HEAD");
}

export class DevcontainerFixture extends RunFixture {
  repo = "";
  #container = "";

  /** The repository's own sandbox: devcontainer runs, `up --repo` and `exec --repo` use it. */
  override get container(): string {
    return this.#container;
  }

  /** A profile in mode devcontainer (extra YAML under `sandbox:` may follow), and a repository with `files`. */
  static async create(
    prefix: string,
    llmUrl: string,
    files: Record<string, string>,
    sandboxYaml = "{mode: devcontainer}",
  ): Promise<DevcontainerFixture> {
    const fixture = await DevcontainerFixture.make({
      prefix,
      llmUrl,
      keyEnv: KEY_ENV,
      prompt: "Work on the repository.\n",
      sandboxYaml,
    });
    const path = `${fixture.dir.path}/${prefix}-repo`;
    await Deno.mkdir(path, { recursive: true });
    await git(path, "init", "-q", "-b", "main");
    await commitFiles(path, files, "initial commit");
    fixture.repo = await Deno.realPath(path);
    fixture.#container = await repoContainerOf(fixture.profile, fixture.repo);
    return fixture;
  }

  /** `sandbox run agentic --repo REPO` for this profile, NDJSON on stdout. */
  runAgent(env: Record<string, string> = {}, args: string[] = []): Promise<RunResult> {
    return this.cli(
      [
        "run",
        "agentic",
        "--prompt-file",
        this.promptFile,
        "--profile",
        this.profile,
        "--format",
        "ndjson",
        "--repo",
        this.repo,
        ...args,
      ],
      env,
    );
  }

  /** Ids of the images built for this fixture's repository, newest first. */
  async images(): Promise<string[]> {
    const listed = await run([
      "docker",
      "images",
      "--no-trunc",
      "--filter",
      `label=${SOURCE_LABEL}=${this.repo}`,
      "--format",
      "{{.ID}} {{.CreatedAt}}",
    ]);
    return listed.stdout.split("\n").filter(Boolean).map((l) => l.split(" ")[0]);
  }

  override async [Symbol.asyncDispose](): Promise<void> {
    try {
      await super[Symbol.asyncDispose]();
    } finally {
      // The sandbox image layered on a devcontainer image first, then the devcontainer images.
      for (const id of await this.images()) await run(["docker", "image", "rm", "--force", id]);
    }
  }
}

/** The NDJSON lines of a run's stdout. */
export function parseLines(stdout: string, context: string): Wire[] {
  return stdout.trim().split("\n").filter(Boolean).map((line, i) => {
    try {
      return JSON.parse(line);
    } catch {
      assert.fail(`stdout line ${i + 1} is not JSON: ${line}\n${context}`);
    }
  });
}

/** The output of the execute tool calls, in order. */
export function executeOutputs(messages: Wire[]): string[] {
  return messages.filter((m) => m.type === "tool_result" && m.tool_name === "execute").map((m) =>
    m.tool_output
  );
}

/** `KEY=value` lines of an output, as a record. */
export function keyValues(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split("\n")) {
    const eq = line.indexOf("=");
    if (eq > 0) out[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
  }
  return out;
}
