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
import { attachSpare, attachSpareOn, spareCommand } from "../sandbox/spare.ts";
import { leaveWaitingExec, releaseWaitingExec, takeWaitingExec, type WaitingConnections } from "../sandbox/waiting_exec.ts";
import { trace } from "../trace.ts";
import type { UpstreamProvider } from "../proxy/credential_proxy.ts";
import { DockerSandboxProvider, type LeaseRelease, sandboxRepo } from "../sandbox/docker_provider.ts";
import { exitCodeFor, SandboxError } from "../errors.ts";
import { HostProvider } from "../sandbox/host_provider.ts";
import { describeKeySource, type KeySource, KeyStore } from "../keys.ts";
import { BUILTIN_PROVIDERS, llmTarget } from "../proxy/llm_providers.ts";
import { type AgenticMessage, agenticMessage, driverUsage } from "./protocol.ts";
import { Redactor } from "../redact.ts";
import { type LocalUpstream, loadRecording, startRecorder, startReplayUpstream } from "./replay.ts";
import { checkRunBranch, collectResult, type LocalRepo, prepareWorktree, removeWorktree, removeWorktreeArgv, type RepoResult, resolveLocalRepo, type RunWorktree } from "../repo/local.ts";
import { finishRemoteRun, gitRemoteFor, isRemoteUrl, prepareRemoteWorktree, remoteAuthorization, type RemoteRepo, resolveRemoteRepo } from "../repo/remote.ts";
import { run } from "../process.ts";
import { newRunId, RunLog, type RunMeta, type RunStatus } from "./run_log.ts";
import { openSession, type SandboxSession, startHostProxies } from "../proxy/session.ts";
import { workerBundlePath } from "../sandbox/worker_bundle.ts";
import { type AgentCliName, type AgentName, isAgentCli } from "../agents/packages.ts";
import { agentCli, checkAgentRun } from "../agents/agent_cli.ts";
import type { HeldLock } from "../lock.ts";
import { checkPromptFits } from "../input_file.ts";

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
    const local = startRecorder(llmTarget(request.profile.llm, keys).upstream, request.record, { redactor });
    return { upstream: local.upstream, model: request.model, local };
  }
  return { model: request.model };
}

export async function runAgent(request: RunRequest): Promise<RunOutcome> {
  const { profile } = request;
  // Limits enforced while the run is live (resources.disk) stop it through this signal.
  const limits = new AbortController();
  request = { ...request, signal: request.signal ? AbortSignal.any([request.signal, limits.signal]) : limits.signal };
  if (request.prompt.trim() === "") throw new SandboxError("usage", "The prompt is empty");
  checkPromptFits(request.prompt, { instructions: request.instructions, profile });
  if (profile.sandbox.mode === "devcontainer" && !request.repo) (await devcontainerModule()).requireLocalRepo(undefined, false);
  const repo = request.repo ? await resolveRepo(request) : undefined;
  const redactor = new Redactor();
  const keys = new KeyStore({ redactor });
  // A replay needs no key; anything else does, and a missing one must stop the run here, before
  // any sandbox, image or container is touched, not as an error answer from the proxy later.
  if (!request.model?.startsWith(REPLAY_PREFIX)) await requireKey(profile, keys, request.signal);
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
  await using log = await RunLog.create({ id, mode: request.mode, profile: profile.name, model, sandbox: sandboxKind }, redactor);
  request.onStart?.(log.meta);
  trace("run: id");

  const cleanups: (() => Promise<unknown>)[] = [];
  if (chosen.local) cleanups.push(() => chosen.local!.close());
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
    if (events++ === 0) trace("run: first event");
    if (message.type === "result") sent.result = true;
    if (message.type === "usage") sent.usage = true;
  };
  const started = performance.now();
  /** LLM calls the credential proxy completed: the usage known so far when the worker cannot say. */
  let llmCalls = 0;
  const countLlmCall = (entry: { kind: string; decision: string; path?: string }) => {
    if (entry.kind === "llm" && entry.decision === "allow" && /\/(chat\/completions|messages|responses)$/.test(entry.path ?? "")) llmCalls++;
  };
  /** Where the agent worked, for `sandbox cp RUN_ID:PATH` later. */
  let place: Record<string, unknown> = {};
  try {
    const onAgentEvent = (line: string) => log.appendAgentEvent(line);
    const { driver, cwd, provider, worktree, session, keep, leased } = await prepare(request, { id, redactor, keys, chosen, cleanups, repo, onAccess: countLlmCall, agent, onAgentEvent, limits });
    // The container outlives the run: as its cleanup begins (not while it starts or works), the
    // next run's relay is started in it, so that its start does not wait for one
    // (spare_relay.ts); nothing is started when the run's own relay is a spare it passes on.
    if (leased && session) underWay = () => session.leaveSpareRelay();
    place = { container: provider?.containerName ?? null, workdir: cwd, kept: profile.sandbox.container !== "fresh" && (!worktree || request.repo?.keepWorktree === true) };
    if (request.mode === "agentic") {
      for await (const message of driver.executeAgentic(request.prompt, {
        cwd,
        instructions: request.instructions,
        runId: id,
        timeoutMs: request.timeoutMs,
        signal: request.signal,
      })) {
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
        result = agenticMessage({ type: "result", content: typeof value === "string" ? value : JSON.stringify(value), model });
      } catch (error) {
        // The model failed (an error answer, or one that does not fit the schema): that is the
        // run's result, an error one, as for an agent — not a sandbox failure.
        if (!(error instanceof GenerationError)) throw error;
        generationError = error;
        result = agenticMessage({ type: "result", content: error.message, is_error: true, model });
      }
      await emit(result);
    }
    let extra: Record<string, unknown> | undefined;
    if (repo?.kind === "local" && worktree && provider && result) {
      const back = await collectResult(provider, repo.local, worktree, { runId: id, signal: request.signal, maxBytes: profile.resources.diskBytes })
        .catch((error) => {
          keep.worktree = true;
          request.onProgress?.(
            `the run's work is kept in ${provider.containerName}: ${worktree.path} (branch ${worktree.branch} of ${worktree.bare})`,
          );
          throw error;
        });
      extra = { repo: repo.local.path, branch: back.commit ? back.branch : null, base: back.base, commit: back.commit, diffstat: back.diffstat, commits: back.commits };
      reportResult(request, back, repo.local.path);
      await request.onLifecycle?.({ type: "sandbox.branch", run_id: id, repository: repo.local.path, ...snake(back) });
    } else if (repo?.kind === "remote" && worktree && provider && session?.gitUrl && result) {
      const back = await finishRemoteRun(provider, worktree, {
        runId: id,
        push: request.repo?.push === true,
        gitUrl: session.gitUrl,
        env: session.env,
        signal: request.signal,
      });
      extra = { repo: repo.remote.url, branch: back.commit ? back.branch : null, base: back.base, commit: back.commit, diffstat: back.diffstat, commits: back.commits, pushed: back.pushed };
      const say = request.onProgress ?? (() => {});
      if (!back.commit) say("the agent changed nothing: nothing to push");
      else if (back.pushed) say(`branch ${back.branch}: ${back.commits.length} commit(s) on ${back.base.slice(0, 12)}, pushed to ${repo.remote.url}`);
      else {
        // Not pushed: the commits must not vanish with the worktree.
        keep.branch = true;
        say(`branch ${back.branch}: ${back.commits.length} commit(s) on ${back.base.slice(0, 12)}, not pushed: kept in ${provider.containerName} as ${worktree.branch} of ${worktree.bare}`);
      }
      for (const ref of back.ignoredRefs) say(`warning: the agent created ${ref} in the sandbox: not pushed (only the run branch is)`);
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
    await emit(agenticMessage({ type: "usage", usage: driver.getUsage(), model }));
    const failed = result?.is_error === true;
    await log.finish({
      status: failed ? "failed" : "succeeded",
      exitCode: failed ? 1 : 0,
      usage: driver.getUsage(),
      error: failed ? result?.content ?? "the agent reported an error" : null,
      extra: { ...place, ...extra, ...(agent ? { agent } : {}) },
    });
    return { meta: log.meta, exitCode: failed ? 1 : 0, error: generationError };
  } catch (error) {
    const failure = limits.signal.aborted
      ? limits.signal.reason as SandboxError
      : !(error instanceof SandboxError)
      ? new SandboxError("worker_failed", (error as Error).message ?? String(error), { cause: error })
      : error.code === "interrupted" && error.message !== "The run was interrupted"
      ? new SandboxError("interrupted", "The run was interrupted", { cause: error })
      : error;
    // Close the stream as promised: an error result saying what happened, then the usage so far.
    const usage = driverUsage({ duration_ms: Math.round(performance.now() - started), num_turns: llmCalls, model });
    if (!sent.result) await emit(agenticMessage({ type: "result", content: failure.message, is_error: true, model })).catch(() => {});
    if (!sent.usage) await emit(agenticMessage({ type: "usage", usage, model })).catch(() => {});
    await log.finish({ status: statusFor(failure), exitCode: exitCodeFor(failure), usage, error: failure.message, extra: place });
    return { meta: log.meta, exitCode: exitCodeFor(failure), error: failure };
  } finally {
    underWay?.();
    trace("run: cleaning up");
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
    trace("run: cleaned up");
  }
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
      `Cannot run profile "${profile.name}": ${error.message.charAt(0).toLowerCase()}${error.message.slice(1)}`,
      { cause: error, detail: [error.detail, `${fix}; --model replay:FILE runs a recording without a key`].filter(Boolean).join("\n") },
    );
  }
}

type ResolvedRepo =
  | { kind: "local"; id: string; local: LocalRepo; branch: string }
  | { kind: "remote"; id: string; remote: RemoteRepo; branch: string };

/** Check the repository request before anything slow starts; user mistakes are usage errors. */
async function resolveRepo(request: RunRequest): Promise<ResolvedRepo> {
  const repo = request.repo!;
  if (request.profile.sandbox.mode === "devcontainer") (await devcontainerModule()).requireLocalRepo(repo.path, isRemoteUrl(repo.path));
  else if (request.profile.sandbox.mode !== "container") {
    throw new SandboxError("usage", "--repo needs sandbox mode \"container\"", {
      detail: "In mode none the agent would work on your checkout directly: run it there with --cwd instead",
    });
  }
  if (request.mode !== "agentic") throw new SandboxError("usage", "--repo is for run agentic");
  const id = newRunId();
  const branch = repo.branch ?? `sandbox/${id}`;
  if (isRemoteUrl(repo.path)) {
    const valid = await run(["git", "check-ref-format", "--branch", branch]);
    if (valid.exitCode !== 0) throw new SandboxError("usage", `Invalid branch name "${branch}"`);
    if (!repo.push) {
      request.onProgress?.("note: without --push the run's commits stay in the sandbox and are reported, not pushed");
    }
    return { kind: "remote", id, remote: await resolveRemoteRepo(repo.path, repo.base), branch };
  }
  if (repo.push) throw new SandboxError("usage", "--push is for remote repositories; a local run's branch comes back by itself");
  const local = await resolveLocalRepo(repo.path, repo.base);
  await checkRunBranch(local, branch);
  if (local.uncommitted > 0) {
    request.onProgress?.(
      `warning: ${local.uncommitted} uncommitted change(s) in ${local.path} are NOT sent: the sandbox gets ${local.baseName} (${local.base.slice(0, 12)}) as committed`,
    );
  }
  return { kind: "local", id, local, branch };
}

function reportResult(request: RunRequest, back: RepoResult, path: string): void {
  const say = request.onProgress ?? (() => {});
  for (const ref of back.ignoredRefs) say(`warning: the sandbox created ${ref}: not imported (only the run branch is)`);
  if (!back.commit) return say("the agent changed nothing: no branch created");
  say(`branch ${back.branch} in ${path}: ${back.commits.length} commit(s) on ${back.base.slice(0, 12)}${back.committedLeftovers ? " (uncommitted changes committed by sandbox)" : ""}`);
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
 * Lease the shared container for this run; undefined when another run or command is live in it.
 * A container that cannot even start the lease is probed, and replaced when wedged, once.
 */
async function leaseShared(
  provider: DockerSandboxProvider,
  seconds: number,
  runId: string,
  signal?: AbortSignal,
  /** This host's lock on the container, when taken already (the first attempt's; see lease). */
  held?: HeldLock,
): Promise<LeaseRelease | undefined> {
  for (let attempt = 0;; attempt++) {
    try {
      return await provider.lease(runId, seconds, signal, attempt === 0 ? held : undefined);
    } catch (error) {
      trace(`run: cannot lease: ${error instanceof Error ? error.message : error}`);
      signal?.throwIfAborted();
      // Cannot look: a container of one's own is the safe side.
      if (attempt === 1) return undefined;
      await provider.ensureRunning({ signal, probe: true });
    }
  }
}

/**
 * The profile's shared containers after the first (`sandbox.containers`: slots 2 to `slots`), tried
 * in a random order (so that runs starting together spread over them) until one's lease is
 * granted; a slot's container is made the first time a run needs it, and kept. Undefined when
 * every one is busy (or there are none).
 */
async function leaseOtherSlot(
  slots: number,
  providerFor: (slot: number) => DockerSandboxProvider,
  seconds: number,
  runId: string,
  signal?: AbortSignal,
): Promise<{ provider: DockerSandboxProvider; release: LeaseRelease } | undefined> {
  const order = Array.from({ length: Math.max(0, slots - 1) }, (_, i) => i + 2);
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  for (const slot of order) {
    const candidate = providerFor(slot);
    // Held by another run of this host: the next, without asking Docker about this one.
    const held = await candidate.holdOnHost();
    if (!held) {
      trace(`run: ${candidate.containerName} is busy on this host`);
      continue;
    }
    try {
      await candidate.ensureRunning({ signal });
      const release = await leaseShared(candidate, seconds, runId, signal, held);
      if (release) return { provider: candidate, release };
    } catch (error) {
      held.release();
      // A slot that cannot be made or reached is passed over (the run goes on to the next, or
      // to a container of its own); an interruption is not.
      signal?.throwIfAborted();
      trace(`run: ${candidate.containerName} passed over: ${error instanceof Error ? error.message : error}`);
    }
  }
  return undefined;
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
    /** An agent CLI instead of the worker. */
    agent?: AgentCliName;
    onAgentEvent?: (line: string) => void;
    /** Aborted (with the reason) when the run passes a limit watched while it is live. */
    limits: AbortController;
  },
): Promise<{ driver: ContainerDriver; cwd: string; provider?: DockerSandboxProvider; worktree?: RunWorktree; session?: SandboxSession; keep: { worktree: boolean; branch: boolean }; leased?: boolean }> {
  /** Set when the result could not be brought back: the work then stays in the sandbox. */
  const keep = { worktree: false, branch: false };
  const { signal } = request;
  // Mode devcontainer: the repository's devcontainer image, run by the Docker provider from here on.
  const devcontainer = request.profile.sandbox.mode === "devcontainer" && context.repo?.kind === "local"
    ? await (await devcontainerModule()).openDevcontainer(request.profile, { repo: context.repo.local.path, base: context.repo.local.base, onProgress: request.onProgress, signal })
    : undefined;
  const profile = devcontainer?.profile ?? request.profile;
  const sessionOptions = {
    runId: context.id,
    redactor: context.redactor,
    keys: context.keys,
    upstream: context.chosen.upstream,
    model: context.chosen.model,
    signal,
    onAccess: context.onAccess,
    onProgress: request.onProgress,
  };
  if (profile.sandbox.mode === "none") {
    request.onProgress?.("UNSAFE: sandbox mode \"none\" runs the agent on this machine with no isolation");
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
    throw new SandboxError("unsupported", `Sandbox mode "${profile.sandbox.mode}" is not implemented yet`);
  }
  // A container and its workspace are shared only by runs on the same repository (or only by runs
  // without one), and by one run at a time: runs are the same user inside, and could read each
  // other's files and processes. A run that finds its container in use gets one of its own.
  let fresh = profile.sandbox.container === "fresh";
  const repoKey = context.repo?.kind === "local" ? context.repo.local.key : context.repo?.remote.key;
  const repository = repoKey ? await sandboxRepo(repoKey) : undefined;
  let provider = new DockerSandboxProvider(profile, { repository, onProgress: request.onProgress, agent: context.agent });
  const remote = context.repo?.kind === "remote" ? context.repo : undefined;
  const openFor = (sandbox: DockerSandboxProvider) =>
    openSession(profile, sandbox, {
      ...sessionOptions,
      gitRemote: remote
        ? gitRemoteFor(remote.remote, {
          branch: remote.branch,
          push: request.repo?.push === true,
          authorization: remoteAuthorization(remote.remote, {
            token: profile.git.token,
            keys: context.keys,
            redactor: context.redactor,
          }),
        })
        : undefined,
    });
  /** What the shared container's lease does behind the run, filled in as the run goes. */
  const behind: { worktree?: RunWorktree; spare: boolean } = { spare: false };
  let opening: Promise<SandboxSession> | undefined;
  let leased = false;
  /** The lease granted (it also watches the workspace's disk use, see watchDisk). */
  let held: LeaseRelease | undefined;
  const workerOptions = { timeoutMs: request.timeoutMs ?? profile.resources.timeoutMs, signal, onStderrLine: request.onWorkerStderr, runId: context.id };
  /** The worker waiting in the shared container, reached while the lease is taken. */
  let waiting: Promise<WorkerProcess | undefined> = Promise.resolve(undefined);
  /** The shared container's waiting wrapper, claimed while the lease is taken: the connector to
   * the waiting worker runs on it once the lease is granted, instead of a `docker exec` (spare.ts). */
  let wrapper: Promise<WaitingConnections | undefined> = Promise.resolve(undefined);
  const leaseSeconds = (request.timeoutMs ?? profile.resources.timeoutMs) / 1000 + 60;
  /** The run holds `granted`. Behind the run, inside the container, without the user waiting: its
   * worktree removed, whatever it left running killed, the next run's worker started (see lease()). */
  const behindTheRun = (granted: LeaseRelease) => {
    leased = true;
    held = granted;
    context.cleanups.push(() =>
      granted({
        then: behind.worktree && !request.repo?.keepWorktree && !keep.worktree
          ? [removeWorktreeArgv(behind.worktree, { keepBranch: keep.branch })]
          : [],
        spare: behind.spare ? spareCommand() : undefined,
      })
    );
  };
  /** The profile's container is busy: its other shared containers (sandbox.containers), before one of its own. */
  const elsewhere = async () => {
    const other = await leaseOtherSlot(profile.sandbox.containers, (slot) =>
      new DockerSandboxProvider(profile, { slot, repository, onProgress: request.onProgress, agent: context.agent }), leaseSeconds, context.id, signal);
    if (other) {
      provider = other.provider;
      behindTheRun(other.release);
      trace(`run: leased ${provider.containerName}`);
    } else {
      fresh = true;
      request.onProgress?.("another run of this profile is live: this run gets a container of its own");
    }
  };
  // Another run of this host holds the container: it is passed over at once, and nothing of it
  // is reached for early (its waiting worker and relay are for the run that wins its lease).
  const onHost = fresh ? undefined : await provider.holdOnHost();
  if (!fresh && !onHost) {
    trace(`run: ${provider.containerName} is busy on this host`);
    await elsewhere();
  } else if (!fresh) {
    // The relay starts, and the waiting worker is reached, while Docker is asked about the
    // container and the lease is taken: they are independent, the container is all but always
    // up, and the lease all but always granted. When the container had to be started (or made)
    // just now, or the lease is refused, what started early is let go.
    const shared = provider;
    // `fresh`: a container started just now has no worker waiting: one starts at once (it gets
    // its job only once the lease is granted).
    const early = (started = false) => {
      opening = openFor(shared);
      opening.catch(() => {});
      if (context.agent) return;
      if (started) {
        waiting = Promise.resolve(startWorker(shared, [...WORKER_COMMAND, "serve"], workerOptions));
        return;
      }
      // Without a waiting wrapper, the connector's own `docker exec` starts at once (the worker
      // gets its job only once the lease is granted).
      wrapper = takeWaitingExec(shared).catch(() => undefined);
      waiting = wrapper.then((taken) => taken ? undefined : attachSpare(shared, workerOptions).catch(() => undefined));
    };
    const letGo = async () => {
      // Closed once it is open, without the run waiting for that (its relay may still be loading):
      // before this process ends, whatever happens.
      const dropped = opening?.then((session) => session.close(), () => {});
      if (dropped) context.cleanups.push(() => dropped);
      opening = undefined;
      (await waiting)?.close();
      waiting = Promise.resolve(undefined);
      const taken = await wrapper;
      wrapper = Promise.resolve(undefined);
      if (taken) await releaseWaitingExec(taken);
    };
    early();
    context.cleanups.push(async () => (await waiting)?.close());
    context.cleanups.push(async () => {
      const taken = await wrapper;
      if (taken && !taken.reported) await releaseWaitingExec(taken);
    });
    // The lease is asked for at once too (the runs that are the container's own are not counted
    // against it: scripts/sandbox-exec). An answer from a container that was not up as it is now
    // is let go below, and the lease asked for again.
    let asked: Promise<LeaseRelease | undefined> | undefined = provider.lease(context.id, leaseSeconds, signal, onHost);
    asked.catch(() => {});
    const unclaimed = asked;
    let claimed = false;
    // Granted but never used (the run failed first): handed back, nothing to do behind it.
    context.cleanups.push(async () => {
      if (!claimed) await (await unclaimed.catch(() => undefined))?.();
    });
    trace("run: looking at the sandbox");
    await provider.ensureRunning({ signal });
    trace("run: sandbox up");
    if (!provider.wasRunning) {
      // Handed back before the lease is asked for again (it would be found live: busy).
      asked = undefined;
      claimed = true;
      await (await unclaimed.catch(() => undefined))?.();
      await letGo();
      early(true);
    } else if (opening) {
      // Started before Docker was asked: a concurrent run may have been making the container
      // just then ("No such container"). It exists now, so one more try is the answer.
      opening = opening.catch((error) => {
        trace(`run: early relay failed (${error instanceof Error ? error.message : error}); once more`);
        return openFor(shared);
      });
      opening.catch(() => {});
    }
    const release = asked
      ? await asked.then((granted) => {
        claimed = true;
        return granted;
      }, (error) => {
        trace(`run: cannot lease: ${error instanceof Error ? error.message : error}`);
        return leaseShared(provider, leaseSeconds, context.id, signal);
      })
      : await leaseShared(provider, leaseSeconds, context.id, signal);
    trace(release ? "run: leased" : "run: busy");
    if (release) {
      behindTheRun(release);
    } else {
      await letGo();
      await elsewhere();
    }
  }
  if (fresh) {
    provider = new DockerSandboxProvider(profile, { instance: context.id.toLowerCase(), repository, onProgress: request.onProgress, agent: context.agent });
    const own = provider;
    // Removed behind the run's back: its user does not wait for it (see teardownDetached).
    context.cleanups.push(() => Promise.resolve(own.teardownDetached()));
    await provider.ensureRunning({ signal });
  }
  const sandbox = provider;
  trace("run: sandbox running");
  /**
   * The connector to the leased container's waiting worker: on its waiting wrapper (the one
   * claimed early, or, in another of the profile's containers, that one's), passed on to the next
   * command before the lease is released (a wrapper running a command counts against leases); on
   * a `docker exec` of its own without one.
   */
  let onWrapper = false;
  const attachLeased = async (target: DockerSandboxProvider): Promise<WorkerProcess | undefined> => {
    const taken = await wrapper ?? await takeWaitingExec(target).catch(() => undefined);
    if (!taken) return await attachSpare(target, workerOptions).catch(() => undefined);
    onWrapper = true;
    const attached = await attachSpareOn(target, taken, workerOptions).catch(() => undefined);
    // (Its input ended first: a run cut short stops its worker, and so the connector, that way.)
    if (attached) {
      context.cleanups.push(() => {
        attached.worker?.close();
        return attached.passedOn();
      });
    }
    return attached?.worker;
  };
  // The worker: the one waiting in a leased container (loaded, warm), or one started now, which
  // loads its code while the session opens and the repository goes in. Either gets its job once
  // they are ready. (An agent CLI is started by its driver.)
  // A local repository goes in while the session opens (it needs the lease, not the relay).
  const local = context.repo?.kind === "local" ? context.repo : undefined;
  const sending = local
    ? prepareWorktree(provider, local.local, { runId: context.id, branch: local.branch, signal }).then((created) => {
      // Removed behind the run even when the session then fails to open.
      if (leased && !request.repo?.keepWorktree) behind.worktree = created;
      return created;
    })
    : undefined;
  sending?.catch(() => {});
  const starting: Promise<WorkerProcess | undefined> = context.agent ? Promise.resolve(undefined) : (async () => {
    behind.spare = leased;
    // Reached too early (the lease was still waiting for the worker to get ready): once more.
    const spare = leased ? (await waiting ?? await attachLeased(sandbox)) : undefined;
    // A leased container without a waiting wrapper gets one behind the run, for the next run's
    // connector (and `sandbox exec`): one `docker exec` now, none in each run after.
    if (leased && !onWrapper) context.cleanups.push(() => leaveWaitingExec(sandbox).catch(() => {}));
    trace(spare ? "run: worker ready (waiting, or started at once)" : "run: worker started");
    return spare ?? startWorker(sandbox, [...WORKER_COMMAND, "serve"], workerOptions);
  })();
  // A run that fails before its job was sent ends the worker's input: it stops.
  context.cleanups.push(async () => (await starting.catch(() => undefined))?.close());
  const watch = provider.watchDisk({ onAbort: (reason) => context.limits.abort(reason), lease: held });
  context.cleanups.push(() => watch.close());
  const session: SandboxSession = await (opening ?? openFor(provider));
  // Closed alongside the cleanups after it (the lease's release, the disk watch…), which do not
  // depend on it: closing starts the next run's relay, a `docker exec` the user need not wait
  // for twice. Awaited last.
  let closing: Promise<void> | undefined;
  context.cleanups.unshift(() => closing ?? Promise.resolve());
  context.cleanups.push(() => {
    closing = session.close();
    return Promise.resolve();
  });
  trace("run: session open");
  let worktree: RunWorktree | undefined;
  if (remote) {
    worktree = await prepareRemoteWorktree(provider, remote.remote, {
      runId: context.id,
      branch: remote.branch,
      gitUrl: session.gitUrl!,
      env: session.env,
      signal,
    });
    request.onProgress?.(`fetched ${remote.remote.url} into the sandbox; base ${worktree.base.slice(0, 12)}`);
  } else if (local && sending) {
    worktree = await sending;
    request.onProgress?.(`sent ${local.local.baseName} (${local.local.base.slice(0, 12)}): ${worktree.sentBytes} bytes of objects`);
  }
  if (worktree) {
    const created = worktree;
    if (request.repo?.keepWorktree) {
      context.cleanups.push(() => {
        request.onProgress?.(`worktree kept: ${created.path} in ${provider.containerName}`);
        return Promise.resolve();
      });
    } else if (leased) {
      behind.worktree = created;
    } else if (!fresh) {
      context.cleanups.push(async () => {
        if (!keep.worktree) await removeWorktree(provider, created, { keepBranch: keep.branch });
      });
    }
    // (A container of the run's own goes with everything in it.)
  }
  let early = await starting;
  const driver = new ContainerDriver({
    provider,
    env: { ...session.env, ...(worktree ? AGENT_GIT_IDENTITY : {}) },
    model: context.chosen.model,
    onStderrLine: request.onWorkerStderr,
    agent: context.agent ? agentCli(context.agent) : undefined,
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
  return { driver, cwd, provider, worktree, session, keep, leased };
}
