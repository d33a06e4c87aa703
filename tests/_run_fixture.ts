/**
 * A throwaway profile for end-to-end runs: a temp directory with its config (LLM pointed at a
 * fake), a private state directory, and the environment the CLI runs with. Removed on dispose.
 */
import type { RunMeta } from "../lib/run/run_log.ts";
import type { RunResult } from "../lib/process.ts";
import { isRemoteUrl, resolveRemoteRepo } from "../lib/repo/remote.ts";
import { localRepoKey } from "../lib/repo/local.ts";
import { run } from "../lib/process.ts";
import { sandboxNames, sandboxRepo } from "../lib/sandbox/docker_provider.ts";
import { removeProfile, runCli, tempDir, uniqueProfile, writeConfig } from "./_helpers.ts";
import { FAKE_LLM_KEY } from "./_fake_llm.ts";

/**
 * The shared container of `profile`'s runs on repository `repo` (a path or URL; no commit needed),
 * or of its agent CLI `agent`'s runs there.
 */
export async function repoContainerOf(
  profile: string,
  repo: string,
  agent?: string,
): Promise<string> {
  const top = async () =>
    (await run(["git", "-C", repo, "rev-parse", "--show-toplevel"])).stdout.trim();
  const key = isRemoteUrl(repo)
    ? (await resolveRemoteRepo(repo)).key
    : await localRepoKey(await top());
  return sandboxNames(
    profile,
    [agent, `repo-${(await sandboxRepo(key)).id}`].filter(Boolean).join("-"),
  ).container;
}

/** Kills a CLI that hangs, so that a broken build fails the test instead of stalling it. */
export const CLI_TIMEOUT_MS = 240_000;

export class RunFixture implements AsyncDisposable {
  readonly profile: string;
  readonly dir: { path: string } & AsyncDisposable;
  readonly stateDir: string;
  readonly env: Record<string, string>;
  config = "";
  promptFile = "";
  /** Ends the CLIs still running when the fixture is disposed (a test that failed mid-run). */
  readonly #stop = new AbortController();
  readonly #running = new Set<Promise<RunResult>>();

  constructor(dir: { path: string } & AsyncDisposable, prefix: string, keyEnv: string) {
    this.dir = dir;
    this.profile = uniqueProfile(prefix);
    this.stateDir = `${dir.path}/state`;
    this.env = {
      // The key the fake LLM accepts: it answers 401 to anything else, the proxy's token included.
      [keyEnv]: FAKE_LLM_KEY,
      XDG_STATE_HOME: this.stateDir,
      NO_PROXY: "127.0.0.1,localhost",
      no_proxy: "127.0.0.1,localhost",
    };
  }

  /**
   * A fixture whose profile talks to the fake LLM at `llmUrl` (key in `keyEnv`), with extra YAML
   * under the profile's `sandbox:` if given, and a prompt file holding `prompt`.
   */
  static async make<T extends RunFixture>(
    this: new (dir: { path: string } & AsyncDisposable, prefix: string, keyEnv: string) => T,
    options: {
      prefix: string;
      llmUrl: string;
      keyEnv: string;
      prompt: string;
      sandboxYaml?: string;
    },
  ): Promise<T> {
    const fixture = new this(
      await tempDir(`sandbox-e2e-${options.prefix}-`),
      options.prefix,
      options.keyEnv,
    );
    fixture.config = await writeConfig(
      fixture.dir.path,
      `profiles:\n  ${fixture.profile}:\n` +
        `    llm: {provider: custom, base_url: "${options.llmUrl}", key: {env: ${options.keyEnv}}}\n` +
        (options.sandboxYaml ? `    sandbox: ${options.sandboxYaml}\n` : ""),
    );
    fixture.promptFile = `${fixture.dir.path}/prompt.txt`;
    await Deno.writeTextFile(fixture.promptFile, options.prompt);
    return fixture;
  }

  /** The profile's development sandbox (`sandbox exec`; runs never use it). */
  get container(): string {
    return `sandbox-${this.profile}`;
  }

  /** The profile's development sandbox for repository `repo` (a path or URL). */
  repoContainer(repo: string): Promise<string> {
    return repoContainerOf(this.profile, repo);
  }

  /**
   * The container of this fixture's live run (the only one running), as its metadata records it
   * once the run has one; waits up to a minute for it.
   */
  async liveContainer(): Promise<string> {
    const runs = `${this.stateDir}/sandbox/runs`;
    for (let i = 0; i < 600; i++) {
      const ids = await Array.fromAsync(Deno.readDir(runs)).catch(() => []);
      for (const entry of ids) {
        const meta = await this.meta(entry.name).catch(() => undefined);
        const container = meta?.status === "running" ? meta.extra?.container : undefined;
        // Named in the record before the engine makes it (so that a leftover is found): live once
        // the engine says it runs.
        if (typeof container === "string" && await runningContainer(container)) return container;
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    throw new Error(`no live run of ${this.profile} has a container`);
  }

  /**
   * SIGKILL the supervisor of this profile's live run (the process that runs it: killing the CLI
   * does not end a run); its record, as it was then.
   */
  async killSupervisor(): Promise<RunMeta> {
    await this.liveContainer();
    for await (const entry of Deno.readDir(`${this.stateDir}/sandbox/runs`)) {
      const meta = await this.meta(entry.name).catch(() => undefined);
      if (meta?.status === "running") {
        Deno.kill(meta.pid, "SIGKILL");
        return meta;
      }
    }
    throw new Error(`no live run of ${this.profile}`);
  }

  /** `sandbox ARGS` to completion, with this fixture's config and environment (plus `env`). */
  cli(args: string[], env: Record<string, string> = {}): Promise<RunResult> {
    const running = runCli(args, {
      config: this.config,
      env: { ...this.env, ...env },
      timeoutMs: CLI_TIMEOUT_MS,
      signal: this.#stop.signal,
    });
    this.#running.add(running);
    running.finally(() => this.#running.delete(running)).catch(() => {}); // only bookkeeping
    return running;
  }

  async meta(id: string): Promise<RunMeta> {
    return JSON.parse(await Deno.readTextFile(`${this.stateDir}/sandbox/runs/${id}/meta.json`));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    // A CLI still running belongs to a test that failed before its run ended: left running, it
    // would go on (its disk watch, its sandbox) into the tests after it.
    this.#stop.abort();
    await Promise.allSettled(this.#running);
    try {
      await removeProfile(this.profile);
    } finally {
      await this.dir[Symbol.asyncDispose]();
    }
  }
}

/** Whether the engine has `name` running. */
async function runningContainer(name: string): Promise<boolean> {
  const inspected = await run(["docker", "container", "inspect", "-f", "{{.State.Running}}", name]);
  return inspected.exitCode === 0 && inspected.stdout.trim() === "true";
}
