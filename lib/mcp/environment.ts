/**
 * One MCP environment: a sandbox no run or other environment has touched, the repository checked
 * out in it on its own branch, a session (the proxies, the relay), and a run record — as a run
 * has, with an MCP client in the agent's place.
 *
 * How it works:
 * 1. `openEnvironment` resolves the repository and the branch the work becomes (refused before any
 *    sandbox when taken), creates the run record (`sandbox runs` lists it, mode `mcp`), acquires a
 *    sandbox from the profile's lifecycle as a run does (`sandboxLifecycle(profile).acquire`: from
 *    the warm pool or started now, in any isolated mode; mode devcontainer builds the repository's
 *    devcontainer first), and, at once, checks the base out from the repository's cache
 *    (lib/repo/local.ts) and opens the session on the sandbox's relay.
 * 2. Commands and file operations run in the sandbox as the sandbox user, with the session's
 *    variables; file paths are confined to the checkout inside the sandbox (confine.ts).
 * 3. `finish` brings the branch back exactly as a run's comes back (`collectResult`: leftovers
 *    committed, the pack through the quarantine and git's checks, one branch fetched), then
 *    releases the sandbox (nothing of it is left). `close` releases it and brings nothing back.
 */
import type { Profile } from "../config.ts";
import { SandboxError } from "../errors.ts";
import { KeyStore } from "../keys.ts";
import { Redactor } from "../redact.ts";
import type { AccessLogEntry } from "../proxy/access_log.ts";
import { openSession, type SandboxSession } from "../proxy/session.ts";
import {
  AGENT_GIT_IDENTITY,
  checkRunBranch,
  collectResult,
  type LocalRepo,
  prepareWorktree,
  type RepoResult,
  resolveLocalRepo,
  type RunWorktree,
  SAFE_GIT,
} from "../repo/local.ts";
import { type AgenticMessage, agenticMessage } from "../run/protocol.ts";
import { newRunId, RunLog, type RunStatus } from "../run/run_log.ts";
import type { RunSandbox, SandboxKind, SandboxProvider } from "../sandbox/provider.ts";
import { sandboxLifecycle } from "../sandbox/providers.ts";
import { confined } from "./confine.ts";
import { captureBytes, type Captured, CapturedLines } from "./capture.ts";

/** Egress log entries an environment keeps (the newest). */
const EGRESS_ENTRIES_KEPT = 1000;

export interface OpenEnvironmentOptions {
  profile: Profile;
  /** A directory inside the host repository. */
  repoPath: string;
  /** Commit-ish the checkout starts from (default HEAD). */
  base?: string;
  /** The branch the work becomes in the host repository (default `sandbox/<id>`). */
  branch?: string;
  keys?: KeyStore;
  redactor?: Redactor;
  /** Aborts the opening; once open, `close` ends the environment. */
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
}

export interface CommandOutcome {
  exitCode: number;
  timedOut: boolean;
  stdout: Captured;
  stderr: Captured;
  durationMs: number;
}

export class Environment {
  readonly id: string;
  readonly profile: Profile;
  readonly repo: LocalRepo;
  readonly worktree: RunWorktree;
  /** The sandbox the environment holds alone, from open until it ends. */
  readonly sandbox: RunSandbox;
  readonly session: SandboxSession;
  readonly log: RunLog;
  /** Aborted when the environment ends: its running commands are stopped (their trees killed). */
  readonly #ending = new AbortController();
  readonly #cleanups: (() => Promise<unknown>)[];
  readonly #egress: AccessLogEntry[];
  readonly #limits: AbortSignal;
  #closed = false;

  constructor(parts: {
    id: string;
    profile: Profile;
    repo: LocalRepo;
    worktree: RunWorktree;
    sandbox: RunSandbox;
    session: SandboxSession;
    log: RunLog;
    cleanups: (() => Promise<unknown>)[];
    egress: AccessLogEntry[];
    /** Aborted (with the reason) when the sandbox passes a limit watched while it lives. */
    limits: AbortSignal;
  }) {
    this.id = parts.id;
    this.profile = parts.profile;
    this.repo = parts.repo;
    this.worktree = parts.worktree;
    this.sandbox = parts.sandbox;
    this.session = parts.session;
    this.log = parts.log;
    this.#cleanups = parts.cleanups;
    this.#egress = parts.egress;
    this.#limits = parts.limits;
  }

  /** The sandbox's operations (exec, files). */
  get provider(): SandboxProvider {
    return this.sandbox.provider;
  }

  /** The checkout inside the sandbox. */
  get checkout(): string {
    return this.worktree.path;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Aborted when the environment ends, or when `signal` does. */
  #signal(signal?: AbortSignal): AbortSignal {
    if (this.#closed) throw new SandboxError("usage", `Environment "${this.id}" has ended`);
    if (this.#limits.aborted) throw this.#limits.reason;
    return AbortSignal.any([this.#ending.signal, this.#limits, ...(signal ? [signal] : [])]);
  }

  /** Record one step of the client's in the run's events (`sandbox logs ID`). */
  async record(message: AgenticMessage): Promise<void> {
    await this.log.append(message);
  }

  /**
   * Run `command` (argv, or a string for `sh -c`) in `cwd` (inside the checkout). At `timeoutMs`
   * its whole process tree is killed; output past `maxOutputBytes` per stream is counted, not kept.
   */
  async run(
    command: string | string[],
    options: { cwd?: string; timeoutMs: number; maxOutputBytes: number; signal?: AbortSignal },
  ): Promise<CommandOutcome> {
    const signal = this.#signal(options.signal);
    const cwd = (await confined(this.provider, "dir", {
      root: this.checkout,
      path: options.cwd ?? ".",
    }, { signal })).replace(/\n$/, "");
    const argv = typeof command === "string" ? ["sh", "-c", command] : command;
    const stderr = new CapturedLines(options.maxOutputBytes);
    const started = performance.now();
    const child = this.provider.execBytes(argv, {
      cwd,
      env: { ...this.session.env, ...AGENT_GIT_IDENTITY },
      timeoutMs: options.timeoutMs,
      signal,
      onStderrLine: (line) => stderr.add(line),
      runId: this.id,
    });
    const stdout = await captureBytes(child.stdout, options.maxOutputBytes);
    try {
      const ended = await child.outcome;
      return {
        exitCode: ended.exitCode,
        timedOut: false,
        stdout,
        stderr: stderr.result(),
        durationMs: ended.durationMs,
      };
    } catch (error) {
      if (!(error instanceof SandboxError) || error.code !== "timeout") throw error;
      return {
        exitCode: 124,
        timedOut: true,
        stdout,
        stderr: stderr.result(),
        durationMs: Math.round(performance.now() - started),
      };
    }
  }

  /** The file's first `maxBytes` bytes as text, and its size. */
  async readFile(
    path: string,
    options: { maxBytes: number; signal?: AbortSignal },
  ): Promise<{ text: string; sizeBytes: number }> {
    const out = await confined(this.provider, "read", { root: this.checkout, path }, {
      args: [String(options.maxBytes)],
      signal: this.#signal(options.signal),
    });
    const newline = out.indexOf("\n");
    return { sizeBytes: Number(out.slice(0, newline)), text: out.slice(newline + 1) };
  }

  async writeFile(path: string, content: string, signal?: AbortSignal): Promise<void> {
    await confined(this.provider, "write", { root: this.checkout, path }, {
      stdin: content,
      signal: this.#signal(signal),
    });
  }

  /** Entries under `path` ("TYPE SIZE PATH" lines; `.git` left out), `depth` levels deep. */
  async list(path: string, options: { depth: number; maxEntries: number; signal?: AbortSignal }) {
    const out = await confined(this.provider, "list", { root: this.checkout, path }, {
      args: [String(options.depth), String(options.maxEntries + 1)],
      signal: this.#signal(options.signal),
    });
    const lines = out.split("\n").filter(Boolean);
    return {
      entries: lines.slice(0, options.maxEntries).map((line) => {
        const [type, size, ...name] = line.split(" ");
        return {
          path: name.join(" "),
          type: type === "d" ? "dir" : type === "l" ? "symlink" : type === "f" ? "file" : "other",
          sizeBytes: Number(size),
        };
      }),
      truncated: lines.length > options.maxEntries,
    };
  }

  /** Lines matching `pattern` under `path`: "PATH:LINE:TEXT", PATH relative to the checkout. */
  async search(
    pattern: string,
    options: {
      path: string;
      fixed: boolean;
      ignoreCase: boolean;
      maxLines: number;
      signal?: AbortSignal;
    },
  ): Promise<{ matches: string[]; truncated: boolean }> {
    const flags = [options.fixed ? "-F" : "-E", ...(options.ignoreCase ? ["-i"] : [])].join(" ");
    const out = await confined(
      this.provider,
      "search",
      { root: this.checkout, path: options.path },
      {
        args: [pattern, String(options.maxLines + 1), flags],
        signal: this.#signal(options.signal),
      },
    );
    const lines = out.split("\n").filter(Boolean);
    return {
      matches: lines.slice(0, options.maxLines),
      truncated: lines.length > options.maxLines,
    };
  }

  /** What the checkout differs from the base by (new files included), as `git diff`. */
  async diff(
    options: { maxBytes: number; signal?: AbortSignal },
  ): Promise<{ stat: string; patch: Captured }> {
    const signal = this.#signal(options.signal);
    // Intent-to-add makes new files show; `finish` adds everything anyway.
    const script =
      `cd "$1" && ${SAFE_GIT} add -A -N . && ${SAFE_GIT} diff --stat "$2" >&2 && ${SAFE_GIT} diff "$2"`;
    const stat = new CapturedLines(64 * 1024);
    const child = this.provider.execBytes([
      "sh",
      "-c",
      script,
      "sh",
      this.checkout,
      this.worktree.base,
    ], {
      signal,
      timeoutMs: 120_000,
      onStderrLine: (line) => stat.add(line),
    });
    const patch = await captureBytes(child.stdout, options.maxBytes);
    const ended = await child.outcome;
    if (ended.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot diff the checkout: ${stat.result().text.trim()}`,
      );
    }
    return { stat: stat.result().text, patch };
  }

  /** The proxies' decisions for this environment's sandbox, oldest first. */
  egressLog(): AccessLogEntry[] {
    return [...this.#egress];
  }

  /**
   * Bring the branch back into the host repository, as a run's comes back, then end the
   * environment. When it cannot come back, the environment stays open (nothing is lost) and the
   * error is raised.
   */
  async finish(signal?: AbortSignal): Promise<RepoResult> {
    const back = await collectResult(this.provider, this.repo, this.worktree, {
      runId: this.id,
      signal: this.#signal(signal),
      maxBytes: this.profile.resources.diskBytes,
    });
    await this.close({
      status: "succeeded",
      content: back.commit
        ? `branch ${back.branch}: ${back.commits.length} commit(s)`
        : "nothing changed: no branch",
      extra: {
        repo: this.repo.path,
        branch: back.commit ? back.branch : null,
        base: back.base,
        commit: back.commit,
        diffstat: back.diffstat,
        commits: back.commits,
      },
    });
    return back;
  }

  /**
   * End the environment: running commands stopped, the session closed, the sandbox released,
   * the run record finished. Brings nothing back. Never raises; a second call does nothing.
   */
  async close(
    outcome: { status: RunStatus; content: string; extra?: Record<string, unknown> },
  ): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#ending.abort(new SandboxError("interrupted", `Environment "${this.id}" ended`));
    const failed = outcome.status !== "succeeded";
    await this.log.append(
      agenticMessage({ type: "result", content: outcome.content, is_error: failed }),
    );
    await this.log.append(agenticMessage({ type: "usage", usage: {} }));
    for (const cleanup of this.#cleanups.splice(0).reverse()) {
      await cleanup().catch(() => {}); // each cleanup is best effort; the sandbox removal is last
    }
    await this.log.finish({
      status: outcome.status,
      exitCode: failed ? 1 : 0,
      usage: null,
      error: failed ? outcome.content : null,
      extra: { container: this.sandbox.name, workdir: this.checkout, ...outcome.extra },
    });
    await this.log[Symbol.asyncDispose]();
  }
}

/**
 * An environment is a sandbox: a profile in mode none (this machine, no isolation) has none to
 * give, and is refused as the user's mistake.
 */
export function requireSandboxed(profile: Profile): void {
  if (profile.sandbox.mode !== "none") return;
  throw new SandboxError(
    "usage",
    `Profile "${profile.name}" has sandbox mode "none": MCP environments need a sandbox`,
    { detail: "Use a profile in mode container, devcontainer, local or kubernetes (docs/mcp.md)" },
  );
}

/** Open an environment (see the module's comment); nothing of it is left when this fails. */
export async function openEnvironment(options: OpenEnvironmentOptions): Promise<Environment> {
  const { profile, signal } = options;
  requireSandboxed(profile);
  const repo = await resolveLocalRepo(options.repoPath, options.base);
  const id = newRunId();
  const branch = options.branch ?? `sandbox/${id}`;
  await checkRunBranch(repo, branch);
  const redactor = options.redactor ?? new Redactor();
  const log = await RunLog.create(
    { id, mode: "mcp", profile: profile.name, model: "mcp", sandbox: profile.sandbox.mode },
    redactor,
  );
  const cleanups: (() => Promise<unknown>)[] = [];
  try {
    const parts = await acquire(options, { id, branch, repo, log, redactor, cleanups });
    return new Environment({ id, profile, repo, log, cleanups, ...parts });
  } catch (error) {
    for (const cleanup of cleanups.splice(0).reverse()) {
      await cleanup().catch(() => {}); // best effort, as in close(); the error below is the one that counts
    }
    await log.finish({
      status: signal?.aborted ? "interrupted" : "failed",
      exitCode: 1,
      usage: null,
      error: error instanceof Error ? error.message : String(error),
    });
    await log[Symbol.asyncDispose]();
    throw error;
  }
}

/** What `acquire` registers its steps with. */
interface AcquireContext {
  id: string;
  branch: string;
  repo: LocalRepo;
  log: RunLog;
  redactor: Redactor;
  cleanups: (() => Promise<unknown>)[];
}

/**
 * The sandbox, checkout and session of a new environment, as a run gets them (lib/run/run.ts
 * `prepare`), each cleanup pushed on `cleanups` as soon as its step has begun.
 */
async function acquire(options: OpenEnvironmentOptions, context: AcquireContext) {
  const { signal } = options;
  // Mode devcontainer: the repository's devcontainer image, run as mode container from here on.
  const devcontainer = await openDevcontainerFor(options, context.repo);
  const profile = devcontainer?.profile ?? options.profile;
  const sandboxes = await sandboxLifecycle(profile);
  const kind: SandboxKind = { repo: { key: context.repo.key }, onProgress: options.onProgress };
  // A sandbox no run or other environment has touched, released when the environment ends.
  const sandbox = await sandboxes.acquire({ ...kind, runId: context.id, signal });
  context.cleanups.push(() => sandbox.release());
  await context.log.note({ container: sandbox.name });
  if (profile.sandbox.pool > 0) {
    // A refill that fails costs only a colder next environment, which starts its own sandbox.
    const refilling = sandboxes.fill(kind).catch(() => {});
    context.cleanups.push(() => refilling);
  }
  const egress: AccessLogEntry[] = [];
  const checkingOut = prepareWorktree(sandbox.provider, context.repo, {
    runId: context.id,
    branch: context.branch,
    signal,
    updateCache: () => sandbox.updateCache(context.repo, signal),
  });
  checkingOut.catch(() => {}); // awaited below, where its error counts
  // Every isolated sandbox has a relay; mode none, which has none, was refused before.
  const session = await openSession(profile, sandbox.relay!, {
    runId: context.id,
    redactor: context.redactor,
    keys: options.keys ?? new KeyStore({ redactor: context.redactor }),
    signal,
    onProgress: options.onProgress,
    onAccess: (entry) => {
      egress.push(entry);
      if (egress.length > EGRESS_ENTRIES_KEPT) egress.shift();
    },
  });
  context.cleanups.push(() => session.close());
  const limits = new AbortController();
  const watch = sandbox.watchDisk({ onAbort: (reason) => limits.abort(reason) });
  context.cleanups.push(() => watch.close());
  const worktree = await checkingOut;
  if (devcontainer) {
    await prepareWorkspace(sandbox.provider, devcontainer, worktree, session, options);
  }
  return { worktree, sandbox, session, egress, limits: limits.signal };
}

// Loaded only in mode devcontainer: its modules (jsonc-parser among them) cost other modes time.
const devcontainerModule = () => import("../sandbox/devcontainer/provider.ts");
type Devcontainer = Awaited<
  ReturnType<Awaited<ReturnType<typeof devcontainerModule>>["openDevcontainer"]>
>;

/** Mode devcontainer: the repository's devcontainer, built (or found current) now, at the base. */
async function openDevcontainerFor(
  options: OpenEnvironmentOptions,
  repo: LocalRepo,
): Promise<Devcontainer | undefined> {
  if (options.profile.sandbox.mode !== "devcontainer") return undefined;
  return await (await devcontainerModule()).openDevcontainer(options.profile, {
    repo: repo.path,
    base: repo.base,
    onProgress: options.onProgress,
    signal: options.signal,
  });
}

/**
 * The devcontainer's workspace folder pointed at the checkout and its lifecycle commands run, as
 * for a run; the environment's commands still start at the checkout's root.
 */
async function prepareWorkspace(
  provider: SandboxProvider,
  devcontainer: Devcontainer,
  worktree: RunWorktree,
  session: SandboxSession,
  options: OpenEnvironmentOptions,
): Promise<void> {
  await (await devcontainerModule()).prepareDevcontainerWorkspace(provider, devcontainer, {
    worktree: worktree.path,
    env: session.env,
    timeoutMs: options.profile.resources.timeoutMs,
    signal: options.signal,
    onProgress: options.onProgress,
  });
}
