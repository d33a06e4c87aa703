/**
 * The warm pool: sandboxes started ahead, each claimed by exactly one run and destroyed after it.
 *
 * How it works:
 * 1. `fillPool` starts `sandbox.pool` fresh containers for a profile (per agent and repository):
 *    hardened as every sandbox, a workspace volume of their own, and — on a local engine, where
 *    the container has a socket directory mounted from the host (proxy_mount.ts) — the worker
 *    loaded and waiting for its job (lib/sandbox/pooled_worker.ts) and the relay waiting for the
 *    session that claims it (lib/proxy/spare_relay.ts). Then it records each as ready.
 * 2. A run claims one (`claimPooled`: a rename in the host's book, pool_records.ts: one winner),
 *    hands its worker the job on a socket only the host can make (`attachPooledWorker`), and its
 *    session claims the waiting relay.
 * 3. When the run ends, `destroy` removes the container and its volume, and the run refills the
 *    pool behind it.
 *
 * Why the waiting worker is safe to hand a job to: until a run claims it, a pooled container has
 * run nothing but our own code as our own uids (init, the worker, the relay); no command of any
 * run or `sandbox exec` has ever been in it, so nothing can be waiting to take the job in the
 * worker's place, and the socket the job goes through is made by the claiming host in a directory
 * the sandbox cannot write. The agent of the claiming run starts only once the
 * job has arrived, and the container goes with the run. Nothing of one run meets another.
 */
import type { Profile } from "../config.ts";
import { CommandExitError, SandboxError } from "../errors.ts";
import {
  type DockerEngine,
  dockerEngine,
  isEngineError,
  sandboxErrorOf,
  unless,
} from "./engine.ts";
import type { AgentCliName } from "../agents/packages.ts";
import { WORKER_COMMAND } from "../run/container_driver.ts";
import type { WorkerProcess } from "../run/worker_process.ts";
import type { WorkerOptions } from "./provider.ts";
import {
  claimPooledWorker,
  POOL_WORKER_DIR,
  POOL_WORKER_EXEC_ID,
  startedWarm,
} from "./pooled_worker.ts";
import { DockerRelayTransport } from "./docker_relay.ts";
import { DockerSandboxProvider, SANDBOX_USER, type SandboxRepo } from "./docker_provider.ts";
import { removeProxyMountSource } from "./proxy_mount.ts";
import {
  addReady,
  adoptOrphan,
  type ClaimedRecord,
  claimReady,
  forget,
  holdOwn,
  keepSandbox,
  listReady,
  orphaned,
  poolKey,
  releaseOwn,
  startingFor,
} from "./pool_records.ts";
import { randomHex, sha256Hex } from "../hash.ts";
import { removeFreeLocks, withHostLock } from "../lock.ts";
import { userStateDir } from "../paths.ts";
import { trace } from "../trace.ts";
import { recoverRun } from "../run/recover.ts";

export interface PoolOptions {
  agent?: AgentCliName;
  repository?: SandboxRepo;
  /** The repository's object cache volume (lib/repo/cache.ts), mounted read-only. */
  cacheVolume?: string;
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
}

/** A provider for a new container of the kind a run of `profile` with `options` uses. */
export function runSandbox(
  profile: Profile,
  instance: string,
  options: PoolOptions & { pooled: boolean },
): DockerSandboxProvider {
  return new DockerSandboxProvider(profile, {
    instance,
    pooled: options.pooled,
    agent: options.agent,
    repository: options.repository,
    cacheVolume: options.cacheVolume,
    onProgress: options.onProgress,
  });
}

function keyOf(profile: Profile, options: PoolOptions): string {
  return poolKey(profile.name, options.agent, options.repository?.key);
}

/** A pooled container's instance name: `p` and 8 random hex digits. */
function instanceOf(name: string): string {
  return name.slice(name.lastIndexOf("-") + 1);
}

/**
 * Claim a ready container for one run: the provider for it, or undefined when the pool has none
 * that was made with the current configuration. Stale ones (another configuration or image) are
 * removed on the way, never used.
 */
export async function claimPooled(
  profile: Profile,
  options: PoolOptions = {},
): Promise<DockerSandboxProvider | undefined> {
  const key = keyOf(profile, options);
  const isStale = staleness(options.signal);
  for (const record of await listReady()) {
    if (record.key !== key) continue;
    const provider = runSandbox(profile, instanceOf(record.name), { ...options, pooled: true });
    if (provider.containerName !== record.name) continue;
    const stale = await isStale(record, provider);
    if (!await claimReady(record.name)) continue;
    if (stale) {
      options.onProgress?.(
        `removing pooled sandbox ${provider.containerName}: made with another configuration or image`,
      );
      await destroy(provider);
      continue;
    }
    // Gone or stopped since it was made (removed by hand, the engine restarted): never used.
    // An engine that cannot say counts as "not running": the container is never used unchecked.
    if (!await provider.isRunning(options.signal).catch(() => false)) {
      await destroy(provider);
      continue;
    }
    trace(`pool: claimed ${record.name}`);
    return provider;
  }
  return undefined;
}

/**
 * Remove the pool's ready containers made with another configuration or image than a run would
 * use now (after a configuration change, `sandbox image build` or `sandbox snapshot`).
 */
async function dropStale(
  profile: Profile,
  key: string,
  options: PoolOptions & { probe?: boolean },
): Promise<void> {
  const isStale = staleness(options.signal);
  for (const record of await listReady()) {
    if (record.key !== key) continue;
    const provider = runSandbox(profile, instanceOf(record.name), { ...options, pooled: true });
    const why = await isStale(record, provider)
      ? "made with another configuration or image"
      : options.probe && await isWedged(provider, options.signal)
      ? "it runs no command (paused, or its engine cannot exec in it)"
      : undefined;
    if (!why || !await claimReady(record.name)) continue;
    options.onProgress?.(`removing pooled sandbox ${provider.containerName}: ${why}`);
    await destroy(provider);
  }
}

/** How long a ready container has to run `true` before `up` calls it wedged. */
const PROBE_TIMEOUT_MS = 10_000;

/**
 * Whether a ready container cannot run a command (paused, frozen, an engine that cannot exec in
 * it): a run that claimed it would wait on it. `true`, as the sandbox's user, is our own code: the
 * container stays one no run has touched.
 */
async function isWedged(provider: DockerSandboxProvider, signal?: AbortSignal): Promise<boolean> {
  try {
    const result = await provider.exec(["true"], { timeoutMs: PROBE_TIMEOUT_MS, signal });
    return result.exitCode !== 0;
  } catch (error) {
    // Interrupted by the user: not the container's fault.
    if (signal?.aborted) throw error;
    return true;
  }
}

/**
 * Whether a ready record was made with another configuration or image than a run would use now.
 * What a run would use is worked out once (by the first provider asked), for all of a pool's
 * records alike.
 */
function staleness(
  signal?: AbortSignal,
): (record: { configHash: string; imageId?: string }, provider: DockerSandboxProvider) => Promise<
  boolean
> {
  let current: Promise<{ configHash: string; imageId: string | undefined }> | undefined;
  return async (record, provider) => {
    current ??= (async () => ({
      configHash: await provider.configHash(),
      imageId: await provider.imageId(signal),
    }))();
    const now = await current;
    return record.configHash !== now.configHash || record.imageId !== now.imageId;
  };
}

/**
 * A container of the run's own, made now (the pool had none): recorded as held by this process,
 * its name told to `onNamed` before it is made. A start that fails or is interrupted leaves
 * nothing: what it made of the container and its workspace volume is removed (each engine call
 * has settled by then), and so is the record.
 */
export async function coldSandbox(
  profile: Profile,
  runId: string,
  options: PoolOptions & { onNamed?: (name: string) => Promise<void> } = {},
): Promise<DockerSandboxProvider> {
  const provider = runSandbox(profile, runId.toLowerCase(), { ...options, pooled: false });
  await holdOwn(provider.containerName);
  try {
    await options.onNamed?.(provider.containerName);
    await provider.ensureRunning({ signal: options.signal });
  } catch (error) {
    try {
      await provider.teardown({ volumes: true });
      await forget(provider.containerName);
    } catch (cleanup) {
      // The engine would not remove it now: the held record stays, and the next `up` reaps it.
      options.onProgress?.(
        `warning: cannot remove the half-made sandbox ${provider.containerName}: ${
          (cleanup as Error).message
        }`,
      );
    }
    throw error;
  }
  return provider;
}

/**
 * The worker waiting in a claimed container, connected (its job not sent yet), or undefined when
 * it has none (an agent CLI's pool, an engine without the socket directory, a worker that never
 * came).
 */
export async function attachPooledWorker(
  provider: DockerSandboxProvider,
  options: WorkerOptions,
): Promise<WorkerProcess | undefined> {
  const mount = await new DockerRelayTransport(provider).socketMount();
  const dir = mount && `${mount.host}/${POOL_WORKER_DIR}`;
  if (!dir || !(await Deno.lstat(dir).catch(() => undefined))?.isDirectory) return undefined;
  return await claimPooledWorker(dir, {
    ...options,
    sandboxName: provider.containerName,
    stop: () => provider.stopExec(POOL_WORKER_EXEC_ID),
    oomKilled: () => provider.execOomKilled(POOL_WORKER_EXEC_ID),
  });
}

/** Remove a run's container, its workspace volume and the host's records of it, without waiting. */
export async function destroy(provider: DockerSandboxProvider): Promise<void> {
  provider.teardownDetached();
  await Promise.all([
    removeProxyMountSource(provider.containerName),
    forget(provider.containerName),
  ]);
}

/**
 * Bring the pool for runs of `profile` (with `options`) up to `sandbox.pool` ready containers,
 * after removing the containers of runs whose process is gone. Returns the names it started.
 *
 * What the pool lacks (its ready containers, and those live processes are starting for it, count)
 * is reserved under a host lock per pool — each new name held by this process as starting for the
 * pool — and the containers then start outside the lock, side by side. So runs that end together
 * each start what is missing when they look, never the same gap twice, and none is skipped. With
 * `wait` (`up`), it then waits for what other processes are starting, and fills again what they
 * failed to make: it returns once the pool is full.
 */
export async function fillPool(
  profile: Profile,
  options: PoolOptions & { wait?: boolean } = {},
): Promise<string[]> {
  await reapOrphans(profile);
  const key = keyOf(profile, options);
  const lock = `pool-${(await sha256Hex(`${userStateDir()}\0${key}`)).slice(0, 16)}`;
  const started: string[] = [];
  // `up` also asks each ready container to run a command, once; a run's refill does not.
  let probe = options.wait;
  while (true) {
    const reserved = await withHostLock(lock, async () => {
      await dropStale(profile, key, { ...options, probe });
      const ready = (await listReady()).filter((record) => record.key === key).length;
      const missing = profile.sandbox.pool - ready - (await startingFor(key)).length;
      return await reserve(Math.max(0, missing), () => reservePooled(profile, key, options));
    });
    probe = false;
    // Side by side; one that fails leaves nothing behind, and the first failure is raised once
    // the others are settled.
    const made = await Promise.allSettled(
      reserved.map((provider) => startPooled(provider, key, options)),
    );
    const failed = made.find((each) => each.status === "rejected");
    if (failed) throw failed.reason;
    started.push(...reserved.map((provider) => provider.containerName));
    if (!options.wait || (await startingFor(key)).length === 0) return started;
    while ((await startingFor(key)).length > 0) {
      await new Promise((resolve) => setTimeout(resolve, STARTING_POLL_MS));
    }
  }
}

/** How often `up` looks whether what other processes start for its pool is ready. */
const STARTING_POLL_MS = 100;

/**
 * `count` reservations, all or none: should one fail (a full disk), the names already held are let
 * go, so that no other filler waits for or counts a container nobody will start.
 */
async function reserve(
  count: number,
  one: () => Promise<DockerSandboxProvider>,
): Promise<DockerSandboxProvider[]> {
  const held = await Promise.allSettled(Array.from({ length: count }, one));
  const refused = held.find((each) => each.status === "rejected");
  if (!refused) {
    return held.map((each) => (each as PromiseFulfilledResult<DockerSandboxProvider>).value);
  }
  await Promise.allSettled(
    held.flatMap((each) =>
      each.status === "fulfilled" ? [releaseOwn(each.value.containerName)] : []
    ),
  );
  throw refused.reason;
}

/** A new pooled container's provider, its name held by this process as starting for `key`. */
async function reservePooled(
  profile: Profile,
  key: string,
  options: PoolOptions,
): Promise<DockerSandboxProvider> {
  const provider = runSandbox(profile, `p${randomHex(4)}`, { ...options, pooled: true });
  await holdOwn(provider.containerName, key);
  return provider;
}

/** One reserved pooled container, started and recorded; when it fails, nothing of it is left. */
async function startPooled(
  provider: DockerSandboxProvider,
  key: string,
  options: PoolOptions,
): Promise<void> {
  try {
    await provider.ensureRunning({ signal: options.signal });
    const { readySpareRelay } = await import("../proxy/session.ts");
    await Promise.all([
      options.agent ? undefined : startWaitingWorker(provider),
      readySpareRelay(provider.profile, new DockerRelayTransport(provider), options.signal),
    ]);
    const imageId = await provider.imageId(options.signal);
    if (!imageId) {
      throw new SandboxError(
        "docker_failed",
        `Cannot start a pooled sandbox: the image of "${provider.containerName}" is gone`,
      );
    }
    // Ready, then no longer starting: a filler looking in between counts it twice (one short,
    // made up by the next refill), never not at all (one too many).
    await addReady({
      name: provider.containerName,
      key,
      configHash: await provider.configHash(),
      imageId,
    });
    await releaseOwn(provider.containerName);
  } catch (error) {
    await destroy(provider);
    throw error;
  }
}

/**
 * Start the worker that waits, loaded, for the job of the run that claims `provider`: in a
 * directory of the container's socket directory, where only the host can make its job's socket
 * (pooled_worker.ts). Without that directory (an engine that does not share this machine's
 * files) none waits: the run starts its worker itself.
 */
async function startWaitingWorker(provider: DockerSandboxProvider): Promise<void> {
  const mount = await new DockerRelayTransport(provider).socketMount({ confirm: true });
  if (!mount) return;
  // Readable (0755): the worker watches it for the job's socket. Nothing in it is secret.
  await Deno.mkdir(`${mount.host}/${POOL_WORKER_DIR}`, { mode: 0o755 });
  await Deno.chmod(`${mount.host}/${POOL_WORKER_DIR}`, 0o755);
  const start = async () => {
    const child = provider.engine.exec({
      container: provider.containerName,
      cmd: [
        "sandbox-exec",
        POOL_WORKER_EXEC_ID,
        ...WORKER_COMMAND,
        "serve",
        "--await-job",
        `${mount.sandbox}/${POOL_WORKER_DIR}`,
      ],
      user: SANDBOX_USER,
      env: [],
      interactive: false,
      detach: true,
    }, { timeoutMs: 30_000 });
    const [, outcome] = await Promise.all([new Response(child.stdout).text(), child.finished]);
    if (outcome.exitCode === 0 && !outcome.failure) return;
    const message = `Cannot start the waiting worker in sandbox "${provider.containerName}"`;
    if (outcome.failure) throw sandboxErrorOf(outcome.failure, "exec_failed", message);
    throw new CommandExitError("exec_failed", message, outcome);
  };
  // Recorded ready only once warm: a run that claims it (right after the run that filled it, say)
  // then waits for nothing.
  if (!await startedWarm(`${mount.host}/${POOL_WORKER_DIR}`, start)) {
    throw new SandboxError(
      "exec_failed",
      `The waiting worker in sandbox "${provider.containerName}" did not load`,
    );
  }
}

/**
 * Before the container of a dead holder is removed: bring back or keep its run's work
 * (lib/run/recover.ts). "remove" when the container may go, "kept" when it stays with the work,
 * "taken" when another process adopted it first (and handles it).
 */
async function recoverOrphan(
  profile: Profile,
  held: ClaimedRecord,
): Promise<"remove" | "kept" | "taken"> {
  if (!await adoptOrphan(held)) return "taken";
  const provider = new DockerSandboxProvider(profile, { existing: held.name });
  return await recoverRun({
    name: held.name,
    pid: held.pid,
    provider,
    isRunning: () => provider.isRunning(),
    keep: () => keepSandbox(held.name),
  });
}

/**
 * Remove the containers of runs whose process is gone (killed before it could remove them), and
 * the lock files no process holds (lib/lock.ts `removeFreeLocks`): the containers are found by
 * name in the host's book; their labels also let `teardown --all` find them.
 */
export async function reapOrphans(
  profile: Profile,
  engine: DockerEngine = dockerEngine(),
): Promise<string[]> {
  const reaped: string[] = [];
  for (const held of await orphaned()) {
    // A dead run's work is brought back or kept first (lib/run/recover.ts); never removed with it.
    if (await recoverOrphan(profile, held) !== "remove") continue;
    const options = { volumes: true, timeoutMs: 60_000 };
    try {
      // Gone already (its run removed it after all, or a teardown did): as good as removed here.
      await unless(["not-found"], () => engine.removeContainer(held.name, options));
      await unless(["not-found"], () => engine.removeVolume(`${held.name}-workspace`, options));
    } catch (error) {
      // Refused for now (a removal already under way, say): its record stays for the next reap.
      if (isEngineError(error) && error.kind !== "engine-unreachable") continue;
      throw error;
    }
    await Promise.all([removeProxyMountSource(held.name), forget(held.name)]);
    reaped.push(held.name);
  }
  // And the lock files killed holders left (their names may never be taken again).
  await removeFreeLocks();
  return reaped;
}
