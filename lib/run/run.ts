/**
 * One `sandbox run`: the sandbox, the host proxies, the worker, the durable log, the outcome.
 *
 * Every event is validated, appended to the run's log, then handed to `onEvent` (the CLI prints
 * it). The `usage` event comes last. Whatever happens, the proxies close, the prompt file goes,
 * a per-run container is removed, and the run's metadata records how it ended.
 */
import type { JsonSchema } from "../../worker/json_schema.ts";
import type { Profile } from "../config.ts";
import { ContainerDriver, GenerationError, WORKER_COMMAND } from "./container_driver.ts";
import { startWorker, type WorkerProcess } from "./worker_process.ts";
import {
  attachPooledWorker,
  claimPooled,
  coldSandbox,
  destroy,
  fillPool,
} from "../sandbox/pool.ts";
import { keepSandbox } from "../sandbox/pool_records.ts";
import { cacheVolumeName, updateCache } from "../repo/cache.ts";
import { cliName } from "../cli_name.ts";
import { trace } from "../trace.ts";
import type { UpstreamProvider } from "../proxy/credential_proxy.ts";
import { type DockerSandboxProvider, sandboxRepo } from "../sandbox/docker_provider.ts";
import { EXIT, exitCodeFor, SandboxError } from "../errors.ts";
import { HostProvider } from "../sandbox/host_provider.ts";
import { describeKeySource, type KeySource, KeyStore } from "../keys.ts";
import { BUILTIN_PROVIDERS, llmTarget } from "../proxy/llm_providers.ts";
import { type AgenticMessage, agenticMessage, driverUsage } from "./protocol.ts";
import { Redactor } from "../redact.ts";
import { loadRecording, type LocalUpstream, startRecorder, startReplayUpstream } from "./replay.ts";
import {
  checkRunBranch,
  collectResult,
  type LocalRepo,
  prepareWorktree,
  type RepoResult,
  resolveLocalRepo,
  type RunWorktree,
} from "../repo/local.ts";
import {
  finishRemoteRun,
  gitRemoteFor,
  isRemoteUrl,
  remoteAuthorization,
  type RemoteRepo,
  resolveRemoteRepo,
} from "../repo/remote.ts";
import { fetchRemote } from "../repo/remote_mirror.ts";
import { run } from "../process.ts";
import { newRunId, RunLog, type RunMeta, type RunStatus } from "./run_log.ts";
import { openSession, type SandboxSession, startHostProxies } from "../proxy/session.ts";
import { workerBundlePath } from "../sandbox/worker_bundle.ts";
import { type AgentCliName, type AgentName, isAgentCli } from "../agents/packages.ts";
import { agentCli, checkAgentRun } from "../agents/agent_cli.ts";
import { checkAgentProjectConfig, describeIgnored } from "../agents/project_config.ts";
import { checkPromptFits } from "../input_file.ts";
import type { BudgetLimits, RunBudget } from "../proxy/budget.ts";
import { startRunSpending } from "./period_budget.ts";

/** Mode devcontainer's modules (jsonc-parser among them), loaded only by runs in that mode. */
const devcontainerModule = () => import("../sandbox/devcontainer/provider.ts");

export const REPLAY_PREFIX = "replay:";
/** Where a run's agent works inside the sandbox when no repository is given. */
export const RUNS_WORKSPACE = "/workspace/runs";
/** So that an agent's own `git commit` works in its worktree. */
const AGENT_GIT_IDENTITY = {
  GIT_AUTHOR_NAME: "sandbox agent",
  GIT_AUTHOR_EMAIL: "agent@sandbox.localhost",
  GIT_COMMITTER_NAME: "sandbox agent",
  GIT_COMMITTER_EMAIL: "agent@sandbox.localhost",
};

export interface RunRequest {
  mode: "agentic" | "generate";
  prompt: string;
  profile: Profile;
  /** A model name, or `replay:FILE` to serve a recorded conversation instead of a provider. */
  model?: string;
  instructions?: string;
  schema?: JsonSchema;
  timeoutMs?: number;
  /** Record the real upstream's responses to this file (for later `--model replay:FILE`). */
  record?: string;
  /** Mode "none": the host directory the agent works in. */
  hostCwd?: string;
  signal?: AbortSignal;
  onEvent: (message: AgenticMessage) => Promise<void> | void;
  /** Slow steps and diagnostics, for stderr. */
  onProgress?: (line: string) => void;
  /** Worker stderr lines. */
  onWorkerStderr?: (line: string) => void;
  /** Called once the run id exists (before anything slow). */
  onStart?: (meta: RunMeta) => void;
  /** A local repository the agent works on, in its own worktree and branch. */
  repo?: RepoRequest;
  /** Our own namespaced events (e.g. `sandbox.branch`), printed only when asked for. */
  onLifecycle?: (event: Record<string, unknown>) => Promise<void> | void;
  /** The agent of `run agentic` (default: the profile's `llm.agent`). */
  agent?: AgentName;
  /** Per-run budgets (the `--max-*` flags), each replacing the profile's of the same name. */
  budget?: BudgetLimits;
}

export interface RepoRequest {
  path: string;
  /** Base commit-ish (default HEAD). */
  base?: string;
  /** Run branch (default `sandbox/<run-id>`). */
  branch?: string;
  keepWorktree?: boolean;
  /** Remote repositories: push the run branch (through the git proxy, which allows only it). */
  push?: boolean;
}

export interface RunOutcome {
  meta: RunMeta;
  exitCode: number;
  error?: SandboxError;
  /** The run's record could not be written in full (a full or failing disk): then `exitCode` is 74. */
  storeError?: SandboxError;
}

function statusFor(error: unknown): RunStatus {
  if (error instanceof SandboxError && error.code === "timeout") return "timed_out";
  if (error instanceof SandboxError && error.code === "interrupted") return "interrupted";
  return "failed";
}

/** The upstream a run talks to: replayed, recorded, or the profile's own. */
async function chooseUpstream(
  request: RunRequest,
  keys: KeyStore,
  redactor: Redactor,
): Promise<{ upstream?: UpstreamProvider; model?: string; local?: LocalUpstream }> {
  if (request.model?.startsWith(REPLAY_PREFIX)) {
    if (request.record) throw new SandboxError("usage", "Cannot --record a replayed run");
    const path = request.model.slice(REPLAY_PREFIX.length);
    const local = startReplayUpstream(await loadRecording(path));
    return { upstream: local.upstream, model: "replay", local };
  }
  if (request.record) {
    const local = startRecorder(llmTarget(request.profile.llm, keys).upstream, request.record, {
      redactor,
    });
    return { upstream: local.upstream, model: request.model, local };
  }
  return { model: request.model };
}

export async function runAgent(request: RunRequest): Promise<RunOutcome> {
  const { profile } = request;
  // Limits enforced while the run is live (resources.disk) stop it through this signal.
  const limits = new AbortController();
  request = {
    ...request,
    signal: request.signal ? AbortSignal.any([request.signal, limits.signal]) : limits.signal,
  };
  if (request.prompt.trim() === "") throw new SandboxError("usage", "The prompt is empty");
  checkPromptFits(request.prompt, { instructions: request.instructions, profile });
  if (profile.sandbox.mode === "devcontainer" && !request.repo) {
    (await devcontainerModule()).requireLocalRepo(undefined, false);
  }
  const repo = request.repo ? await resolveRepo(request) : undefined;
  const redactor = new Redactor();
  const keys = new KeyStore({ redactor });
  // A replay needs no key; anything else does, and a missing one must stop the run here, before
  // any sandbox, image or container is touched, not as an error answer from the proxy later.
  if (!request.model?.startsWith(REPLAY_PREFIX)) await requireKey(profile, keys, request.signal);
  // Before anything starts: a run over its profile's budget for the day does not start.
  const spending = startRunSpending(profile, {
    flags: request.budget,
    onExceeded: (error) => limits.abort(error),
    onProgress: request.onProgress,
  });
  const chosen = await chooseUpstream(request, keys, redactor);
  const id = repo?.id ?? newRunId();
  const sandboxKind = profile.sandbox.mode === "container" ? "container" : profile.sandbox.mode;
  const model = chosen.model ?? llmTarget(profile.llm, keys).model;
  const agentName = request.mode === "agentic" ? request.agent ?? profile.llm.agent : undefined;
  const agent = isAgentCli(agentName) ? agentName : undefined;
  if (agent) {
    try {
      checkAgentRun(agent, {
        mode: request.mode,
        sandboxMode: profile.sandbox.mode,
        api: (chosen.upstream ?? llmTarget(profile.llm, keys).upstream).kind,
        profile: profile.name,
        replay: request.model?.startsWith(REPLAY_PREFIX) === true,
      });
    } catch (error) {
      await chosen.local?.close();
      throw error;
    }
  }
  await using log = await RunLog.create({
    id,
    mode: request.mode,
    profile: profile.name,
    model,
    sandbox: sandboxKind,
  }, redactor);
  request.onStart?.(log.meta);
  trace("run: id");

  const cleanups: (() => Promise<unknown>)[] = [];
  if (chosen.local) cleanups.push(() => chosen.local!.close());
  cleanups.push(() => spending.record(id));
  let result: AgenticMessage | undefined;
  let generationError: GenerationError | undefined;
  // The protocol promises one result and the usage last, whatever happens: what was sent decides
  // what a failure still owes the reader.
  const sent = { result: false, usage: false };
  let events = 0;
  /** As the run's cleanup begins: what it leaves for the next run (see prepare). */
  let underWay: (() => void) | undefined;
  const emit = async (message: AgenticMessage) => {
    await log.append(message);
    await request.onEvent(message);
    if (events++ === 0) {
      trace("run: first event");
      underWay?.();
    }
    if (message.type === "result") sent.result = true;
    if (message.type === "usage") sent.usage = true;
  };
  const started = performance.now();
  /** LLM calls the credential proxy completed: the usage known so far when the worker cannot say. */
  let llmCalls = 0;
  const countLlmCall = (entry: { kind: string; decision: string; path?: string }) => {
    if (
      entry.kind === "llm" && entry.decision === "allow" &&
      /\/(chat\/completions|messages|responses)$/.test(entry.path ?? "")
    ) llmCalls++;
  };
  /** Where the agent worked, and whether its container stays (`kept`). */
  let place: Record<string, unknown> = {};
  let kept: { worktree: boolean; branch: boolean } | undefined;
  const placed = () => ({
    ...place,
    kept: kept !== undefined && (kept.worktree || kept.branch),
    budget: spending.budget.record(),
  });
  try {
    const onAgentEvent = (line: string) => log.appendAgentEvent(line);
    const { driver, cwd, provider, worktree, session, keep, underWay: prepared } = await prepare(
      request,
      {
        id,
        redactor,
        keys,
        chosen,
        cleanups,
        repo,
        onAccess: countLlmCall,
        budget: spending.budget,
        agent,
        onAgentEvent,
        limits,
        onSandbox: (container) => log.note({ container }),
      },
    );
    underWay = prepared;
    place = { container: provider?.containerName ?? null, workdir: cwd };
    kept = keep;
    if (request.mode === "agentic") {
      for await (
        const message of driver.executeAgentic(request.prompt, {
          cwd,
          instructions: request.instructions,
          runId: id,
          timeoutMs: request.timeoutMs,
          signal: request.signal,
        })
      ) {
        // A budget passed by the last response ends the run as one passed earlier would.
        if (message.type === "result") limits.signal.throwIfAborted();
        if (message.type === "result") result = message;
        await emit(message);
      }
    } else {
      try {
        const { value } = await driver.generate(request.prompt, {
          schema: request.schema,
          runId: id,
          timeoutMs: request.timeoutMs,
          signal: request.signal,
        });
        result = agenticMessage({
          type: "result",
          content: typeof value === "string" ? value : JSON.stringify(value),
          model,
        });
      } catch (error) {
        // The model failed (an error answer, or one that does not fit the schema): that is the
        // run's result, an error one, as for an agent — not a sandbox failure.
        if (!(error instanceof GenerationError)) throw error;
        generationError = error;
        result = agenticMessage({ type: "result", content: error.message, is_error: true, model });
      }
      limits.signal.throwIfAborted();
      await emit(result);
    }
    let extra: Record<string, unknown> | undefined;
    if (repo?.kind === "local" && worktree && provider && result) {
      const back = await collectResult(provider, repo.local, worktree, {
        runId: id,
        signal: request.signal,
        maxBytes: profile.resources.diskBytes,
      })
        .catch((error) => {
          keep.worktree = true;
          request.onProgress?.(
            `the run's work is kept in ${provider.containerName}: ${worktree.path} (branch ${worktree.branch} of ${worktree.bare})`,
          );
          throw error;
        });
      extra = {
        repo: repo.local.path,
        branch: back.commit ? back.branch : null,
        base: back.base,
        commit: back.commit,
        diffstat: back.diffstat,
        commits: back.commits,
      };
      reportResult(request, back, repo.local.path);
      await request.onLifecycle?.({
        type: "sandbox.branch",
        run_id: id,
        repository: repo.local.path,
        ...snake(back),
      });
    } else if (repo?.kind === "remote" && worktree && provider && session?.gitUrl && result) {
      const back = await finishRemoteRun(provider, worktree, {
        runId: id,
        push: request.repo?.push === true,
        gitUrl: session.gitUrl,
        env: session.env,
        signal: request.signal,
      });
      extra = {
        repo: repo.remote.url,
        branch: back.commit ? back.branch : null,
        base: back.base,
        commit: back.commit,
        diffstat: back.diffstat,
        commits: back.commits,
        pushed: back.pushed,
      };
      const say = request.onProgress ?? (() => {});
      if (!back.commit) say("the agent changed nothing: nothing to push");
      else if (back.pushed) {
        say(
          `branch ${back.branch}: ${back.commits.length} commit(s) on ${
            back.base.slice(0, 12)
          }, pushed to ${repo.remote.url}`,
        );
      } else {
        // Not pushed: the commits must not vanish with the worktree.
        keep.branch = true;
        say(
          `branch ${back.branch}: ${back.commits.length} commit(s) on ${
            back.base.slice(0, 12)
          }, not pushed: kept in ${provider.containerName} as ${worktree.branch} of ${worktree.bare}`,
        );
      }
      for (const ref of back.ignoredRefs) {
        say(
          `warning: the agent created ${ref} in the sandbox: not pushed (only the run branch is)`,
        );
      }
      await request.onLifecycle?.({
        type: "sandbox.branch",
        run_id: id,
        repository: repo.remote.url,
        ignored_refs: back.ignoredRefs,
        branch: back.commit ? back.branch : null,
        base: back.base,
        commit: back.commit,
        commits: back.commits,
        diffstat: back.diffstat,
        pushed: back.pushed,
        committed_leftovers: back.committedLeftovers,
      });
    }
    await emitUsage(
      log,
      request,
      agenticMessage({ type: "usage", usage: driver.getUsage(), model }),
    );
    sent.usage = true;
    const failed = result?.is_error === true;
    await log.finish({
      status: failed ? "failed" : "succeeded",
      exitCode: failed ? 1 : 0,
      usage: driver.getUsage(),
      error: failed ? result?.content ?? "the agent reported an error" : null,
      extra: { ...placed(), ...extra, ...(agent ? { agent } : {}) },
    });
    return outcomeOf(log, failed ? 1 : 0, generationError);
  } catch (error) {
    const failure = limits.signal.aborted
      ? limits.signal.reason as SandboxError
      : !(error instanceof SandboxError)
      ? new SandboxError("worker_failed", (error as Error).message ?? String(error), {
        cause: error,
      })
      : error.code === "interrupted" && error.message !== "The run was interrupted"
      ? new SandboxError("interrupted", "The run was interrupted", { cause: error })
      : error;
    // Close the stream as promised: an error result saying what happened, then the usage so far.
    const usage = driverUsage({
      ...spending.budget.driverUsage(),
      duration_ms: Math.round(performance.now() - started),
      num_turns: llmCalls,
      model,
    });
    if (!sent.result) {
      await emit(
        agenticMessage({ type: "result", content: failure.message, is_error: true, model }),
      ).catch(() => {});
    }
    if (!sent.usage) {
      await emitUsage(log, request, agenticMessage({ type: "usage", usage, model })).catch(
        () => {},
      );
    }
    await log.finish({
      status: statusFor(failure),
      exitCode: exitCodeFor(failure),
      usage,
      error: failure.message,
      extra: placed(),
    });
    return outcomeOf(log, exitCodeFor(failure), failure);
  } finally {
    trace("run: cleaning up");
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
    trace("run: cleaned up");
  }
}

/**
 * The closing `usage` line: appended, then handed on — saying, in its `content`, that the run's
 * record is incomplete when a write to it failed (this line's own included).
 */
async function emitUsage(log: RunLog, request: RunRequest, message: AgenticMessage): Promise<void> {
  await log.append(message);
  const lost = log.storeError;
  await request.onEvent(
    lost === undefined
      ? message
      : { ...message, content: `The run's record is incomplete: ${lost}` },
  );
}

/** How a run ends: a record that could not be written in full makes it exit `EXIT.storeFailed`. */
function outcomeOf(log: RunLog, exitCode: number, error: SandboxError | undefined): RunOutcome {
  const storeError = log.storeFailure();
  return { meta: log.meta, exitCode: storeError ? EXIT.storeFailed : exitCode, error, storeError };
}

/** The key source a profile's LLM calls use. */
function keySourceOf(profile: Profile): KeySource {
  const llm = profile.llm;
  // Schema validation guarantees a key for custom providers.
  return llm.key ?? BUILTIN_PROVIDERS[llm.provider as keyof typeof BUILTIN_PROVIDERS].key;
}

/** Read the profile's API key now (it stays cached for the proxy); a missing one is a config error. */
async function requireKey(profile: Profile, keys: KeyStore, signal?: AbortSignal): Promise<void> {
  const source = keySourceOf(profile);
  try {
    await keys.resolve(source, signal);
  } catch (error) {
    if (!(error instanceof SandboxError) || error.code !== "config_invalid") throw error;
    const fix = "env" in source
      ? `Set ${source.env}, or choose another source with profiles.${profile.name}.llm.key`
      : `Check that ${describeKeySource(source)} prints the key (profiles.${profile.name}.llm.key)`;
    throw new SandboxError(
      "config_invalid",
      `Cannot run profile "${profile.name}": ${error.message.charAt(0).toLowerCase()}${
        error.message.slice(1)
      }`,
      {
        cause: error,
        detail: [error.detail, `${fix}; --model replay:FILE runs a recording without a key`].filter(
          Boolean,
        ).join("\n"),
      },
    );
  }
}

type ResolvedRepo =
  | { kind: "local"; id: string; local: LocalRepo; branch: string }
  | { kind: "remote"; id: string; remote: RemoteRepo; branch: string };

/** Check the repository request before anything slow starts; user mistakes are usage errors. */
async function resolveRepo(request: RunRequest): Promise<ResolvedRepo> {
  const repo = request.repo!;
  if (request.profile.sandbox.mode === "devcontainer") {
    (await devcontainerModule()).requireLocalRepo(repo.path, isRemoteUrl(repo.path));
  } else if (request.profile.sandbox.mode !== "container") {
    throw new SandboxError("usage", '--repo needs sandbox mode "container"', {
      detail:
        "In mode none the agent would work on your checkout directly: run it there with --cwd instead",
    });
  }
  if (request.mode !== "agentic") throw new SandboxError("usage", "--repo is for run agentic");
  const id = newRunId();
  const branch = repo.branch ?? `sandbox/${id}`;
  if (isRemoteUrl(repo.path)) {
    const valid = await run(["git", "check-ref-format", "--branch", branch]);
    if (valid.exitCode !== 0) throw new SandboxError("usage", `Invalid branch name "${branch}"`);
    if (!repo.push) {
      request.onProgress?.(
        "note: without --push the run's commits stay in the sandbox and are reported, not pushed",
      );
    }
    return { kind: "remote", id, remote: await resolveRemoteRepo(repo.path, repo.base), branch };
  }
  if (repo.push) {
    throw new SandboxError(
      "usage",
      "--push is for remote repositories; a local run's branch comes back by itself",
    );
  }
  const local = await resolveLocalRepo(repo.path, repo.base);
  await checkRunBranch(local, branch);
  if (local.uncommitted > 0) {
    request.onProgress?.(
      `warning: ${local.uncommitted} uncommitted change(s) in ${local.path} are NOT sent: the sandbox gets ${local.baseName} (${
        local.base.slice(0, 12)
      }) as committed`,
    );
  }
  return { kind: "local", id, local, branch };
}

function reportResult(request: RunRequest, back: RepoResult, path: string): void {
  const say = request.onProgress ?? (() => {});
  for (const ref of back.ignoredRefs) {
    say(`warning: the sandbox created ${ref}: not imported (only the run branch is)`);
  }
  if (!back.commit) return say("the agent changed nothing: no branch created");
  say(
    `branch ${back.branch} in ${path}: ${back.commits.length} commit(s) on ${
      back.base.slice(0, 12)
    }${back.committedLeftovers ? " (uncommitted changes committed by sandbox)" : ""}`,
  );
  for (const line of back.diffstat.split("\n")) if (line) say(`  ${line.trim()}`);
}

function snake(back: RepoResult): Record<string, unknown> {
  return {
    branch: back.commit ? back.branch : null,
    base: back.base,
    commit: back.commit,
    commits: back.commits,
    diffstat: back.diffstat,
    committed_leftovers: back.committedLeftovers,
    ignored_refs: back.ignoredRefs,
  };
}

/**
 * The end of a run's container: destroyed, unless the run's work stays in it (it could not be
 * brought back, or the user asked to keep it): then it is kept, and where to find it is said.
 */
async function finishSandbox(
  sandbox: DockerSandboxProvider,
  keep: { worktree: boolean; branch: boolean },
  onProgress?: (line: string) => void,
): Promise<void> {
  if (!keep.worktree && !keep.branch) return await destroy(sandbox);
  await keepSandbox(sandbox.containerName);
  onProgress?.(
    `the run's container ${sandbox.containerName} is kept with its work; remove it with: ${cliName()} down -p ${sandbox.profile.name}`,
  );
}

/** The sandbox side of a run: provider, session and driver, with their cleanups registered. */
async function prepare(
  request: RunRequest,
  context: {
    id: string;
    redactor: Redactor;
    keys: KeyStore;
    chosen: { upstream?: UpstreamProvider; model?: string };
    cleanups: (() => Promise<unknown>)[];
    repo?: ResolvedRepo;
    onAccess?: (entry: { kind: string; decision: string; path?: string }) => void;
    budget?: RunBudget;
    /** An agent CLI instead of the worker. */
    agent?: AgentCliName;
    onAgentEvent?: (line: string) => void;
    /** Aborted (with the reason) when the run passes a limit watched while it is live. */
    limits: AbortController;
    /** Told the run's container as soon as it has one (recorded in the run's metadata). */
    onSandbox?: (container: string) => Promise<void>;
  },
): Promise<{
  driver: ContainerDriver;
  cwd: string;
  provider?: DockerSandboxProvider;
  worktree?: RunWorktree;
  session?: SandboxSession;
  keep: { worktree: boolean; branch: boolean };
  /** Called once the run is under way (its first event). */
  underWay?: () => void;
}> {
  /** Set when the result could not be brought back: the work then stays in the sandbox. */
  const keep = { worktree: false, branch: false };
  const { signal } = request;
  // Mode devcontainer: the repository's devcontainer image, run by the Docker provider from here on.
  const devcontainer =
    request.profile.sandbox.mode === "devcontainer" && context.repo?.kind === "local"
      ? await (await devcontainerModule()).openDevcontainer(request.profile, {
        repo: context.repo.local.path,
        base: context.repo.local.base,
        onProgress: request.onProgress,
        signal,
      })
      : undefined;
  const profile = devcontainer?.profile ?? request.profile;
  // What an agent CLI may read of the repository's configuration for it: only what the user trusts.
  const ownConfig = context.repo?.kind === "local" && !devcontainer?.config.workspaceSubdir
    ? context.repo.local
    : undefined;
  // (Read while the sandbox gets ready; awaited before the agent's driver is made.)
  const checkingConfig = context.agent
    ? checkAgentProjectConfig(context.agent, ownConfig)
    : undefined;
  checkingConfig?.catch(() => {}); // awaited below, where its error counts
  const sessionOptions = {
    runId: context.id,
    redactor: context.redactor,
    keys: context.keys,
    upstream: context.chosen.upstream,
    model: context.chosen.model,
    signal,
    onAccess: context.onAccess,
    onProgress: request.onProgress,
    budget: context.budget,
  };
  if (profile.sandbox.mode === "none") {
    request.onProgress?.(
      'UNSAFE: sandbox mode "none" runs the agent on this machine with no isolation',
    );
    const proxies = await startHostProxies(profile, ["127.0.0.1"], sessionOptions);
    context.cleanups.push(() => proxies.close());
    const bundle = await workerBundlePath(request.onProgress);
    const promptRoot = await Deno.makeTempDir({ prefix: "sandbox-prompts-" });
    context.cleanups.push(() => Deno.remove(promptRoot, { recursive: true }));
    const driver = new ContainerDriver({
      provider: new HostProvider(profile.name),
      env: proxies.envFor("127.0.0.1"),
      model: context.chosen.model,
      workerCommand: [Deno.execPath(), "run", "--allow-all", "--no-config", bundle],
      promptRoot,
      onStderrLine: request.onWorkerStderr,
    });
    return { driver, cwd: request.hostCwd ?? Deno.cwd(), keep };
  }
  if (profile.sandbox.mode !== "container") {
    throw new SandboxError(
      "unsupported",
      `Sandbox mode "${profile.sandbox.mode}" is not implemented yet`,
    );
  }
  // A sandbox no other run has touched: one started ahead for the pool and claimed by this run
  // alone, or one made now. It is destroyed when the run ends (lib/sandbox/pool.ts).
  const repoKey = context.repo?.kind === "local"
    ? context.repo.local.key
    : context.repo?.remote.key;
  const repository = repoKey ? await sandboxRepo(repoKey) : undefined;
  const local = context.repo?.kind === "local" ? context.repo : undefined;
  const remote = context.repo?.kind === "remote" ? context.repo : undefined;
  const poolOptions = {
    agent: context.agent,
    repository,
    cacheVolume: repository ? cacheVolumeName(repository) : undefined,
    onProgress: request.onProgress,
  };
  const workerOptions = {
    timeoutMs: request.timeoutMs ?? profile.resources.timeoutMs,
    signal,
    onStderrLine: request.onWorkerStderr,
    runId: context.id,
  };
  const claimed = profile.sandbox.pool > 0
    ? await claimPooled(profile, { ...poolOptions, signal })
    : undefined;
  const sandbox = claimed ?? await coldSandbox(profile, context.id, { ...poolOptions, signal });
  context.cleanups.push(() => finishSandbox(sandbox, keep, request.onProgress));
  await context.onSandbox?.(sandbox.containerName);
  trace(claimed ? "run: sandbox claimed from the pool" : "run: sandbox started");
  // The pool is refilled behind the run once it is under way (`underWay`), not while it starts.
  let refilling: Promise<unknown> | undefined;
  const refill = () => {
    // A refill that fails costs only a colder next run, which starts its own container.
    if (profile.sandbox.pool > 0) refilling ??= fillPool(profile, poolOptions).catch(() => {});
  };
  context.cleanups.push(async () => {
    refill();
    await refilling;
  });
  // The user's credential for a remote: used on the host, by its fetch and by the git proxy.
  const authorization = remote
    ? remoteAuthorization(remote.remote, {
      token: profile.git.token,
      keys: context.keys,
      redactor: context.redactor,
    })
    : undefined;
  const openFor = (provider: DockerSandboxProvider) =>
    openSession(profile, provider, {
      ...sessionOptions,
      gitRemote: remote && authorization
        ? gitRemoteFor(remote.remote, {
          branch: remote.branch,
          push: request.repo?.push === true,
          authorization,
        })
        : undefined,
    });
  // The worker (the one waiting in the pooled container, or one started now, which loads while
  // the session opens), the session and the checkout go at once: they are independent.
  const starting: Promise<WorkerProcess | undefined> = context.agent
    ? Promise.resolve(undefined)
    : (async () => {
      const waiting = claimed ? await attachPooledWorker(claimed, workerOptions) : undefined;
      return waiting ?? startWorker(sandbox, [...WORKER_COMMAND, "serve"], workerOptions);
    })();
  starting.catch(() => {});
  // A run that fails before its job was sent ends the worker's input: it stops.
  context.cleanups.push(async () => (await starting.catch(() => undefined))?.close());
  // The repository's base, from the user's repository or from the host's mirror of a remote
  // (fetched now), checked out from the repository's cache (updated first when it lacks it).
  const source = local
    ? Promise.resolve(local.local)
    : remote && authorization
    ? fetchRemote(remote.remote, { authorization, signal })
    : undefined;
  const sending = source?.then((repo) =>
    prepareWorktree(sandbox, repo, {
      runId: context.id,
      branch: (local ?? remote)!.branch,
      signal,
      updateCache: () => updateCache(sandbox, poolOptions.cacheVolume!, repo, signal),
    })
  );
  sending?.catch(() => {});
  const watch = sandbox.watchDisk({ onAbort: (reason) => context.limits.abort(reason) });
  context.cleanups.push(() => watch.close());
  const session: SandboxSession = await openFor(sandbox);
  context.cleanups.push(() => session.close());
  trace("run: session open");
  let worktree: RunWorktree | undefined;
  if (sending) {
    worktree = await sending;
    const sent = worktree.sentBytes > 0
      ? `; ${worktree.sentBytes} bytes of objects added to its cache`
      : "";
    const from = remote ? `fetched ${remote.remote.url} on the host; ` : "";
    const baseName = (local?.local ?? remote!.remote).baseName;
    request.onProgress?.(`${from}checked out ${baseName} (${worktree.base.slice(0, 12)})${sent}`);
  }
  // Kept: the run's container stays (with its checkout) instead of going with the run.
  if (worktree && request.repo?.keepWorktree) keep.worktree = true;
  let early = await starting;
  const provider = sandbox;
  const agentConfig = await checkingConfig;
  for (const line of agentConfig ? describeIgnored(context.agent!, agentConfig) : []) {
    request.onProgress?.(line);
  }
  const driver = new ContainerDriver({
    provider,
    env: { ...session.env, ...(worktree ? AGENT_GIT_IDENTITY : {}) },
    model: context.chosen.model,
    onStderrLine: request.onWorkerStderr,
    agent: context.agent
      ? agentCli(context.agent, { trustedConfig: agentConfig?.trusted })
      : undefined,
    onAgentEvent: context.onAgentEvent,
    worker: () => {
      const started = early;
      early = undefined;
      return started;
    },
  });
  const cwd = devcontainer && worktree
    ? await (await devcontainerModule()).prepareDevcontainerWorkspace(provider, devcontainer, {
      worktree: worktree.path,
      env: session.env,
      timeoutMs: request.timeoutMs ?? profile.resources.timeoutMs,
      signal,
      onProgress: request.onProgress,
    })
    : worktree?.path ?? `${RUNS_WORKSPACE}/${context.id}`;
  return { driver, cwd, provider, worktree, session, keep, underWay: refill };
}
