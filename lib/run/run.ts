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
import { cliName } from "../cli_name.ts";
import { trace } from "../trace.ts";
import type { UpstreamProvider } from "../proxy/credential_proxy.ts";
import { EXIT, exitCodeFor, SandboxError } from "../errors.ts";
import type { RunSandbox, SandboxKind, SandboxLifecycle } from "../sandbox/provider.ts";
import { sandboxLifecycle } from "../sandbox/providers.ts";
import { describeKeySource, type KeySource, KeyStore } from "../keys.ts";
import { keySourceFor, llmTarget } from "../proxy/llm_providers.ts";
import { type AgenticMessage, agenticMessage, driverUsage } from "./protocol.ts";
import { Redactor } from "../redact.ts";
import { loadRecording, type LocalUpstream, startRecorder, startReplayUpstream } from "./replay.ts";
import {
  AGENT_GIT_IDENTITY,
  checkRunBranch,
  collectResult,
  describeResult,
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
import { branchReturnNote } from "./recover.ts";
import { isContainerStopped, runFailure } from "./run_failure.ts";
import type { Recovery } from "./recovery.ts";
import type { BudgetLimits, RunBudget } from "../proxy/budget.ts";
import { type RunSpending, startRunSpending } from "./period_budget.ts";

/** Mode devcontainer's modules (jsonc-parser among them), loaded only by runs in that mode. */
const devcontainerModule = () => import("../sandbox/devcontainer/provider.ts");

export const REPLAY_PREFIX = "replay:";
/** Where a run's agent works inside the sandbox when no repository is given. */
export const RUNS_WORKSPACE = "/workspace/runs";

export interface RunRequest {
  /** The run's id, when its caller chose it (a supervised run's); default a new one. */
  id?: string;
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

/** What a run settles before it touches any sandbox: its id, repository, key, upstream and agent. */
interface RunPlan {
  /** The request, its signal also aborted by `limits`. */
  request: RunRequest;
  /** The user's interrupt, apart from the limits (a failure is recorded as what came first). */
  interrupt?: AbortSignal;
  /** Limits enforced while the run is live (resources.disk, budgets) stop it through this signal. */
  limits: AbortController;
  /** What the run may spend and has spent (lib/run/period_budget.ts), recorded at its end. */
  spending: RunSpending;
  /** The budget its credential and egress proxies hold. */
  budget: RunBudget;
  repo?: ResolvedRepo;
  redactor: Redactor;
  keys: KeyStore;
  chosen: { upstream?: UpstreamProvider; model?: string; local?: LocalUpstream };
  id: string;
  model: string;
  /** The agent CLI of `run agentic`, when it is not the built-in worker. */
  agent?: AgentCliName;
}

/**
 * Check the request and settle what the run needs before any sandbox, image or container is
 * touched: user mistakes and a missing key stop it here, with nothing to clean up but a started
 * replay or recorder upstream (closed when the agent check fails).
 */
async function planRun(request: RunRequest): Promise<RunPlan> {
  const { profile } = request;
  // The user's interrupt alone (request.signal below also carries the limits).
  const interrupt = request.signal;
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
  const id = repo?.id ?? request.id ?? newRunId();
  return {
    request,
    interrupt,
    limits,
    repo,
    redactor,
    keys,
    chosen,
    id,
    model,
    agent,
    spending,
    budget: spending.budget,
  };
}

/**
 * What a run has said, and where it ran. Invariant: the protocol promises one result and the
 * usage last, whatever happens; `sent` records what was said, so that a failure knows what it
 * still owes the reader.
 */
class RunStream {
  result?: AgenticMessage;
  generationError?: GenerationError;
  readonly sent = { result: false, usage: false };
  readonly started = performance.now();
  /** LLM calls the credential proxy completed: the usage known so far when the worker cannot say. */
  llmCalls = 0;
  /** Called once, at the first event: the run is under way (see prepare). */
  underWay?: () => void;
  /** Where the agent worked, and whether its sandbox stays (`kept`). */
  place: Record<string, unknown> = {};
  /** The run's sandbox, once it has one (a failure asks whether it was stopped from outside). */
  sandbox?: RunSandbox;
  kept?: { worktree: boolean; branch: boolean };
  #events = 0;

  constructor(
    readonly log: RunLog,
    readonly request: RunRequest,
    readonly budget: RunBudget,
  ) {}

  /** Append `message` to the run's log, then hand it on. */
  async emit(message: AgenticMessage): Promise<void> {
    await this.log.append(message);
    await this.request.onEvent(message);
    if (this.#events++ === 0) {
      trace("run: first event");
      this.underWay?.();
    }
    if (message.type === "result") this.sent.result = true;
    if (message.type === "usage") this.sent.usage = true;
  }

  readonly countLlmCall = (entry: { kind: string; decision: string; path?: string }) => {
    if (
      entry.kind === "llm" && entry.decision === "allow" &&
      /\/(chat\/completions|messages|responses)$/.test(entry.path ?? "")
    ) this.llmCalls++;
  };

  placed(): Record<string, unknown> {
    const kept = this.kept !== undefined && (this.kept.worktree || this.kept.branch);
    // What only a dead run's recovery needs (lib/run/recover.ts) goes once the run has ended.
    return { ...this.place, kept, branchReturn: undefined, budget: this.budget.record() };
  }
}

export async function runAgent(request: RunRequest): Promise<RunOutcome> {
  const plan = await planRun(request);
  request = plan.request;
  const { profile } = request;
  await using log = await RunLog.create({
    id: plan.id,
    mode: request.mode,
    profile: profile.name,
    model: plan.model,
    sandbox: profile.sandbox.mode,
  }, plan.redactor);
  request.onStart?.(log.meta);
  trace("run: id");
  // Undone in reverse order whatever happens: each step of setup pushes its own.
  const cleanups: (() => Promise<unknown>)[] = [];
  if (plan.chosen.local) cleanups.push(() => plan.chosen.local!.close());
  cleanups.push(() => plan.spending.record(plan.id));
  const stream = new RunStream(log, request, plan.budget);
  let prepared: Prepared | undefined;
  try {
    prepared = await prepare(request, {
      ...plan,
      cleanups,
      onAccess: stream.countLlmCall,
      onAgentEvent: (line) => log.appendAgentEvent(line),
      onNamed: (name) => log.note({ container: name }),
      onSandbox: (sandbox) => {
        stream.sandbox = sandbox;
        return log.note({ container: sandbox.name });
      },
    });
    stream.underWay = prepared.underWay;
    stream.place = { container: prepared.sandbox?.name ?? null, workdir: prepared.cwd };
    stream.kept = prepared.keep;
    // What the branch return needs, should this process die before it (lib/run/recover.ts).
    if (plan.repo && prepared.worktree) {
      await log.note(branchReturnNote(plan.repo, prepared.worktree));
    }
    await drive(prepared, plan, stream);
    const extra = await bringBack(prepared, plan, stream);
    return await finishSucceeded(prepared.driver, plan, stream, extra);
  } catch (error) {
    return await finishFailed(error, plan, stream, prepared);
  } finally {
    trace("run: cleaning up");
    // Each cleanup is independent: one that fails (a container already gone, a closed proxy)
    // must not keep the rest from running. Whatever a failed one leaves is found later by
    // label or by the pool's book (`up`, `teardown --all`).
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
    trace("run: cleaned up");
  }
}

/** The run's job: the agent's events, or the one generation, each appended and handed on. */
async function drive(prepared: Prepared, plan: RunPlan, stream: RunStream): Promise<void> {
  const { request, id, model } = plan;
  const { driver, cwd } = prepared;
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
      if (message.type === "result") plan.limits.signal.throwIfAborted();
      if (message.type === "result") stream.result = message;
      await stream.emit(message);
    }
    return;
  }
  try {
    const { value } = await driver.generate(request.prompt, {
      schema: request.schema,
      runId: id,
      timeoutMs: request.timeoutMs,
      signal: request.signal,
    });
    stream.result = agenticMessage({
      type: "result",
      content: typeof value === "string" ? value : JSON.stringify(value),
      model,
    });
  } catch (error) {
    // The model failed (an error answer, or one that does not fit the schema): that is the
    // run's result, an error one, as for an agent — not a sandbox failure.
    if (!(error instanceof GenerationError)) throw error;
    stream.generationError = error;
    stream.result = agenticMessage({
      type: "result",
      content: error.message,
      is_error: true,
      model,
    });
  }
  plan.limits.signal.throwIfAborted();
  await stream.emit(stream.result);
}

/** The run's work brought back from the sandbox (a repository run with a result): what to record. */
async function bringBack(
  prepared: Prepared,
  plan: RunPlan,
  stream: RunStream,
): Promise<Record<string, unknown> | undefined> {
  const { repo } = plan;
  const { worktree, sandbox, session } = prepared;
  if (!worktree || !sandbox || !stream.result) return undefined;
  if (repo?.kind === "local") return await bringBackLocal(repo, worktree, sandbox, prepared, plan);
  if (repo?.kind === "remote" && session?.gitUrl) {
    return await bringBackRemote(repo, worktree, sandbox, prepared, plan);
  }
  return undefined;
}

/** A local repository's run branch, imported through the quarantine; kept in the sandbox on failure. */
async function bringBackLocal(
  repo: Extract<ResolvedRepo, { kind: "local" }>,
  worktree: RunWorktree,
  sandbox: RunSandbox,
  prepared: Prepared,
  { request, id }: RunPlan,
): Promise<Record<string, unknown>> {
  trace("run: branch return");
  const back = await collectResult(sandbox.provider, repo.local, worktree, {
    runId: id,
    signal: request.signal,
    maxBytes: request.profile.resources.diskBytes,
    onProgress: request.onProgress,
  })
    .catch((error) => {
      prepared.keep.worktree = true;
      request.onProgress?.(
        `the run's work is kept in ${sandbox.name}: ${worktree.path} (branch ${worktree.branch} of ${worktree.bare})`,
      );
      throw error;
    });
  reportResult(request, back, repo.local.path);
  await request.onLifecycle?.({
    type: "sandbox.branch",
    run_id: id,
    repository: repo.local.path,
    ...snake(back),
  });
  return {
    repo: repo.local.path,
    branch: back.commit ? back.branch : null,
    base: back.base,
    commit: back.commit,
    diffstat: back.diffstat,
    commits: back.commits,
  };
}

/** A remote repository's run branch, pushed when asked; kept in the sandbox when not pushed. */
async function bringBackRemote(
  repo: Extract<ResolvedRepo, { kind: "remote" }>,
  worktree: RunWorktree,
  sandbox: RunSandbox,
  prepared: Prepared,
  { request, id }: RunPlan,
): Promise<Record<string, unknown>> {
  const session = prepared.session!;
  const back = await finishRemoteRun(sandbox.provider, worktree, {
    runId: id,
    push: request.repo?.push === true,
    gitUrl: session.gitUrl!,
    env: session.env,
    signal: request.signal,
  });
  const say = request.onProgress ?? (() => {});
  const commits = `${back.commits.length} commit(s) on ${back.base.slice(0, 12)}`;
  if (!back.commit) say("the agent changed nothing: nothing to push");
  else if (back.pushed) say(`branch ${back.branch}: ${commits}, pushed to ${repo.remote.url}`);
  else {
    // Not pushed: the commits must not vanish with the worktree.
    prepared.keep.branch = true;
    say(
      `branch ${back.branch}: ${commits}, not pushed: kept in ${sandbox.name} as ${worktree.branch} of ${worktree.bare}`,
    );
  }
  for (const ref of back.ignoredRefs) {
    say(`warning: the agent created ${ref} in the sandbox: not pushed (only the run branch is)`);
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
  return {
    repo: repo.remote.url,
    branch: back.commit ? back.branch : null,
    base: back.base,
    commit: back.commit,
    diffstat: back.diffstat,
    commits: back.commits,
    pushed: back.pushed,
  };
}

/** A run that got through: the usage last, the record finished, exit 1 for an `is_error` result. */
async function finishSucceeded(
  driver: ContainerDriver,
  { request, model, agent }: RunPlan,
  stream: RunStream,
  extra: Record<string, unknown> | undefined,
): Promise<RunOutcome> {
  const { log, result } = stream;
  await emitUsage(log, request, agenticMessage({ type: "usage", usage: driver.getUsage(), model }));
  stream.sent.usage = true;
  const failed = result?.is_error === true;
  await log.finish({
    status: failed ? "failed" : "succeeded",
    exitCode: failed ? 1 : 0,
    usage: driver.getUsage(),
    error: failed ? result?.content ?? "the agent reported an error" : null,
    extra: { ...stream.placed(), ...extra, ...(agent ? { agent } : {}) },
  });
  return outcomeOf(log, failed ? 1 : 0, stream.generationError);
}

/**
 * A run that failed: the stream closed as promised (an error result saying what happened, then
 * the usage so far, each only if not sent yet) and the record finished with the failure's code.
 */
async function finishFailed(
  error: unknown,
  plan: RunPlan,
  stream: RunStream,
  prepared: Prepared | undefined,
): Promise<RunOutcome> {
  const { interrupt, limits, model, request } = plan;
  const { log } = stream;
  const failure = await runFailure(error, {
    interrupt,
    limits: limits.signal,
    sandbox: stream.sandbox,
  });
  const recovery = isContainerStopped(failure) ? keepStoppedWork(prepared, plan) : undefined;
  const usage = driverUsage({
    ...plan.budget.driverUsage(),
    duration_ms: Math.round(performance.now() - stream.started),
    num_turns: stream.llmCalls,
    model,
  });
  // A reader that went away (a broken pipe) cannot be told: the record below still is, and a
  // write to it that fails is reported through `log.storeFailure()` in the outcome.
  if (!stream.sent.result) {
    await stream.emit(
      agenticMessage({ type: "result", content: failure.message, is_error: true, model }),
    ).catch(() => {});
  }
  if (!stream.sent.usage) {
    // A result already sent (the run failed after it: its branch return) did not say this.
    const content = stream.sent.result ? failure.message : null;
    await emitUsage(log, request, agenticMessage({ type: "usage", usage, model, content }))
      .catch(() => {}); // a reader gone away: the record still says it (above)
  }
  await log.finish({
    status: statusFor(failure),
    exitCode: exitCodeFor(failure),
    usage,
    error: failure.message,
    extra: { ...stream.placed(), ...(recovery ? { recovery } : {}) },
  });
  return outcomeOf(log, exitCodeFor(failure), failure);
}

/**
 * A repository run whose container was stopped from outside (`docker kill`): its checkout, with
 * the agent's commits, is in that container's workspace. The container is kept (never removed
 * with the run), and where the work is and how to get it is said and recorded, as for a dead
 * run's (lib/run/recover.ts). Undefined for a run without a checkout: nothing to keep.
 */
function keepStoppedWork(prepared: Prepared | undefined, plan: RunPlan): Recovery | undefined {
  const { sandbox, worktree } = prepared ?? {};
  if (!prepared || !sandbox || !worktree) return undefined;
  prepared.keep.worktree = true;
  const cli = cliName();
  const recovery: Recovery = {
    outcome: "kept",
    container: sandbox.name,
    worktree: worktree.path,
    branch: worktree.branch,
    reason: "its container was stopped during the run",
    how: `docker start ${sandbox.name}, then ${cli} cp ${plan.id}:. DIR copies its files ` +
      `(the commits are on branch ${worktree.branch}); ${cli} down -p ${plan.request.profile.name} removes it`,
  };
  plan.request.onProgress?.(
    `the run's work is kept in its stopped container ${sandbox.name}: ${worktree.path} (branch ${worktree.branch}); to get it: ${recovery.how}`,
  );
  return recovery;
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
  return keySourceFor(profile.llm);
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
  } else if (request.profile.sandbox.mode === "none") {
    throw new SandboxError(
      "usage",
      "--repo needs an isolated sandbox mode (container, kubernetes, local)",
      {
        detail:
          "In mode none the agent would work on your checkout directly: run it there with --cwd instead",
      },
    );
  }
  if (request.mode !== "agentic") throw new SandboxError("usage", "--repo is for run agentic");
  const id = request.id ?? newRunId();
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
  for (const line of describeResult(back, path, { who: "the agent" })) {
    request.onProgress?.(line);
  }
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

/** What the run's setup gives the rest of the run. */
interface Prepared {
  driver: ContainerDriver;
  cwd: string;
  /** The run's own sandbox; none in mode none (the host). */
  sandbox?: RunSandbox;
  worktree?: RunWorktree;
  session?: SandboxSession;
  /** Set when the work must stay in the sandbox (it is then kept instead of released). */
  keep: { worktree: boolean; branch: boolean };
  /** Called once the run is under way (its first event). */
  underWay?: () => void;
}

/** What `prepare` is given: the plan, and where to register each cleanup and observation. */
interface PrepareContext extends RunPlan {
  cleanups: (() => Promise<unknown>)[];
  onAccess?: (entry: { kind: string; decision: string; path?: string }) => void;
  onAgentEvent?: (line: string) => void;
  /** Told the run's sandbox as soon as it has one (recorded in the run's metadata). */
  /** The run's sandbox is named, before it is made: recorded, so that a leftover is found. */
  onNamed?: (name: string) => Promise<void>;
  onSandbox?: (sandbox: RunSandbox) => Promise<void>;
}

type Devcontainer = Awaited<
  ReturnType<Awaited<ReturnType<typeof devcontainerModule>>["openDevcontainer"]>
>;

/**
 * The end of a run's sandbox: released, unless the run's work stays in it (it could not be
 * brought back, or the user asked to keep it): then it is kept, and where to find it is said.
 */
async function finishSandbox(
  sandbox: RunSandbox,
  profile: Profile,
  keep: { worktree: boolean; branch: boolean },
  onProgress?: (line: string) => void,
): Promise<void> {
  if (!keep.worktree && !keep.branch) return await sandbox.release();
  await sandbox.keep();
  onProgress?.(
    `the run's container ${sandbox.name} is kept with its work; remove it with: ${cliName()} down -p ${profile.name}`,
  );
}

/**
 * The sandbox side of a run: sandbox, session, checkout and driver, each cleanup registered as
 * soon as its step has begun (so that a failure at any point undoes exactly what was done).
 */
async function prepare(request: RunRequest, context: PrepareContext): Promise<Prepared> {
  /** Set when the result could not be brought back: the work then stays in the sandbox. */
  const keep = { worktree: false, branch: false };
  // Mode devcontainer: the repository's devcontainer image, run as mode container from here on.
  const devcontainer = await openDevcontainerFor(request, context.repo);
  const profile = devcontainer?.profile ?? request.profile;
  const checkingConfig = checkAgentConfig(context, devcontainer);
  const sandboxes = await sandboxLifecycle(profile);
  if (!sandboxes.isolated) return await prepareHost(request, profile, sandboxes, context, keep);
  const local = context.repo?.kind === "local" ? context.repo : undefined;
  const remote = context.repo?.kind === "remote" ? context.repo : undefined;
  const kind: SandboxKind = {
    agent: context.agent,
    repo: context.repo && { key: local ? local.local.key : remote!.remote.key },
    onProgress: request.onProgress,
  };
  // A sandbox no other run has touched: one started ahead for the pool and claimed by this run
  // alone, or one made now. It is released (or kept) when the run ends.
  const sandbox = await sandboxes.acquire({
    ...kind,
    runId: context.id,
    signal: request.signal,
    onNamed: context.onNamed,
  });
  const refill = refillBehind(sandboxes, profile, kind);
  // The sandbox goes before the refill is awaited: its removal then runs beside the refill, not
  // after this process has exited, where it would slow the start of a run that follows at once.
  context.cleanups.push(async () => {
    refill.start();
    try {
      await finishSandbox(sandbox, profile, keep, request.onProgress);
    } finally {
      await refill.done();
    }
  });
  await context.onSandbox?.(sandbox);
  trace(sandbox.fromPool ? "run: sandbox claimed from the pool" : "run: sandbox started");
  const underWay = refill.start;
  // The worker, the session and the checkout go at once: they are independent.
  const starting = startRunWorker(sandbox, request, context);
  // The user's credential for a remote: used on the host, by its fetch and by the git proxy.
  const authorization = remote && remoteAuthorization(remote.remote, {
    token: profile.git.token,
    keys: context.keys,
    redactor: context.redactor,
  });
  const sending = context.repo && checkout(sandbox, context.repo, authorization, request, context);
  const watch = sandbox.watchDisk({ onAbort: (reason) => context.limits.abort(reason) });
  context.cleanups.push(() => watch.close());
  const session = await openRunSession(profile, sandbox, remote, authorization, request, context);
  context.cleanups.push(() => session.close());
  trace("run: session open");
  const worktree = sending && await checkedOut(context.repo!, sending, request);
  // Kept: the run's sandbox stays (with its checkout) instead of going with the run.
  if (worktree && request.repo?.keepWorktree) keep.worktree = true;
  const driver = await sandboxDriver(sandbox, session, worktree, await starting, {
    context,
    request,
    agentConfig: await checkingConfig,
  });
  const cwd = devcontainer && worktree
    ? await (await devcontainerModule()).prepareDevcontainerWorkspace(
      sandbox.provider,
      devcontainer,
      {
        worktree: worktree.path,
        env: session.env,
        timeoutMs: request.timeoutMs ?? profile.resources.timeoutMs,
        signal: request.signal,
        onProgress: request.onProgress,
      },
    )
    : worktree?.path ?? `${RUNS_WORKSPACE}/${context.id}`;
  return { driver, cwd, sandbox, worktree, session, keep, underWay };
}

/** Mode devcontainer on a local repository: its devcontainer, built (or found current) now. */
async function openDevcontainerFor(
  request: RunRequest,
  repo: ResolvedRepo | undefined,
): Promise<Devcontainer | undefined> {
  if (request.profile.sandbox.mode !== "devcontainer" || repo?.kind !== "local") return undefined;
  return await (await devcontainerModule()).openDevcontainer(request.profile, {
    repo: repo.local.path,
    base: repo.local.base,
    onProgress: request.onProgress,
    signal: request.signal,
  });
}

/**
 * What an agent CLI may read of the repository's configuration for it: only what the user
 * trusts. Read while the sandbox gets ready; awaited before the agent's driver is made.
 */
function checkAgentConfig(context: PrepareContext, devcontainer: Devcontainer | undefined) {
  const ownConfig = context.repo?.kind === "local" && !devcontainer?.config.workspaceSubdir
    ? context.repo.local
    : undefined;
  const checking = context.agent ? checkAgentProjectConfig(context.agent, ownConfig) : undefined;
  checking?.catch(() => {}); // awaited in prepare, where its error counts
  return checking;
}

/** What every session of a run is opened with. */
function sessionOptions(request: RunRequest, context: PrepareContext) {
  return {
    runId: context.id,
    redactor: context.redactor,
    keys: context.keys,
    upstream: context.chosen.upstream,
    model: context.chosen.model,
    signal: request.signal,
    onAccess: context.onAccess,
    onProgress: request.onProgress,
    budget: context.budget,
  };
}

/**
 * Mode none: the worker on this machine, with NO isolation (said on stderr), its proxies on
 * loopback TCP. Nothing is acquired: the host is the "sandbox".
 */
async function prepareHost(
  request: RunRequest,
  profile: Profile,
  sandboxes: SandboxLifecycle,
  context: PrepareContext,
  keep: Prepared["keep"],
): Promise<Prepared> {
  request.onProgress?.(
    'UNSAFE: sandbox mode "none" runs the agent on this machine with no isolation',
  );
  const proxies = await startHostProxies(profile, ["127.0.0.1"], sessionOptions(request, context));
  context.cleanups.push(() => proxies.close());
  const bundle = await workerBundlePath(request.onProgress);
  const promptRoot = await Deno.makeTempDir({ prefix: "sandbox-prompts-" });
  context.cleanups.push(() => Deno.remove(promptRoot, { recursive: true }));
  const host = await sandboxes.acquire({ runId: context.id, signal: request.signal });
  const driver = new ContainerDriver({
    provider: host.provider,
    env: proxies.envFor("127.0.0.1"),
    model: context.chosen.model,
    workerCommand: [Deno.execPath(), "run", "--allow-all", "--no-config", bundle],
    promptRoot,
    onStderrLine: request.onWorkerStderr,
  });
  return { driver, cwd: request.hostCwd ?? Deno.cwd(), keep };
}

/**
 * The pool is refilled behind the run once it is under way (`start`, called at its first event),
 * not while it starts; the run's cleanup starts it if the run never got there, and waits for it
 * (`done`).
 */
function refillBehind(
  sandboxes: SandboxLifecycle,
  profile: Profile,
  kind: SandboxKind,
): { start(): void; done(): Promise<void> } {
  let refilling: Promise<unknown> | undefined;
  return {
    start: () => {
      // A refill that fails costs only a colder next run, which starts its own sandbox.
      if (profile.sandbox.pool > 0) refilling ??= sandboxes.fill(kind).catch(() => {});
    },
    done: async () => {
      await refilling;
    },
  };
}

/**
 * The run's worker: the one waiting in a pooled sandbox, attached, or one started now (it loads
 * while the session opens); none for an agent CLI. A run that fails before its job was sent ends
 * the worker's input: it stops.
 */
function startRunWorker(
  sandbox: RunSandbox,
  request: RunRequest,
  context: PrepareContext,
): Promise<WorkerProcess | undefined> {
  if (context.agent) return Promise.resolve(undefined);
  const workerOptions = {
    timeoutMs: request.timeoutMs ?? request.profile.resources.timeoutMs,
    signal: request.signal,
    onStderrLine: request.onWorkerStderr,
    runId: context.id,
  };
  const starting = (async () =>
    await sandbox.attachWorker(workerOptions) ??
      startWorker(sandbox.provider, [...WORKER_COMMAND, "serve"], workerOptions))();
  // Awaited in prepare, where its error counts; the cleanup below only needs what started.
  starting.catch(() => {});
  // (A worker that failed to start has nothing to close.)
  context.cleanups.push(async () => (await starting.catch(() => undefined))?.close());
  return starting;
}

/**
 * The repository's checkout in the sandbox, started now (it goes on while the session opens): the
 * base from the user's repository, or from the host's mirror of a remote (fetched first), checked
 * out from the repository's cache (updated first when it lacks the base).
 */
function checkout(
  sandbox: RunSandbox,
  repo: ResolvedRepo,
  authorization: (() => Promise<string | undefined>) | undefined,
  request: RunRequest,
  context: PrepareContext,
): Promise<RunWorktree> {
  const source = repo.kind === "local"
    ? Promise.resolve(repo.local)
    : fetchRemote(repo.remote, { authorization: authorization!, signal: request.signal });
  const sending = source.then((base) =>
    prepareWorktree(sandbox.provider, base, {
      runId: context.id,
      branch: repo.branch,
      signal: request.signal,
      updateCache: () => sandbox.updateCache(base, request.signal),
    })
  );
  // Awaited in prepare (checkedOut), where its error counts.
  sending.catch(() => {});
  return sending;
}

async function checkedOut(
  repo: ResolvedRepo,
  sending: Promise<RunWorktree>,
  request: RunRequest,
): Promise<RunWorktree> {
  const worktree = await sending;
  const sent = worktree.sentBytes > 0
    ? `; ${worktree.sentBytes} bytes of objects added to its cache`
    : "";
  const from = repo.kind === "remote" ? `fetched ${repo.remote.url} on the host; ` : "";
  const baseName = repo.kind === "local" ? repo.local.baseName : repo.remote.baseName;
  request.onProgress?.(`${from}checked out ${baseName} (${worktree.base.slice(0, 12)})${sent}`);
  return worktree;
}

/** The run's session, with the git proxy for a remote repository (allowing only the run branch). */
function openRunSession(
  profile: Profile,
  sandbox: RunSandbox,
  remote: Extract<ResolvedRepo, { kind: "remote" }> | undefined,
  authorization: (() => Promise<string | undefined>) | undefined,
  request: RunRequest,
  context: PrepareContext,
): Promise<SandboxSession> {
  return openSession(profile, sandbox.relay!, {
    ...sessionOptions(request, context),
    gitRemote: remote && authorization
      ? gitRemoteFor(remote.remote, {
        branch: remote.branch,
        push: request.repo?.push === true,
        authorization,
      })
      : undefined,
  });
}

/** The driver of the run's job: the worker (handed over once), or the agent CLI. */
function sandboxDriver(
  sandbox: RunSandbox,
  session: SandboxSession,
  worktree: RunWorktree | undefined,
  worker: WorkerProcess | undefined,
  { context, request, agentConfig }: {
    context: PrepareContext;
    request: RunRequest;
    agentConfig: Awaited<ReturnType<typeof checkAgentProjectConfig>> | undefined;
  },
): ContainerDriver {
  for (const line of agentConfig ? describeIgnored(context.agent!, agentConfig) : []) {
    request.onProgress?.(line);
  }
  let early = worker;
  return new ContainerDriver({
    provider: sandbox.provider,
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
}
