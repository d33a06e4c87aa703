/**
 * The Docker implementation of the seam's lifecycle (provider.ts; its relay transport is
 * docker_relay.ts): adapters
 * over the warm pool (pool.ts), the book of held containers (pool_records.ts) and the hardened
 * container (docker_provider.ts). Nothing above lib/sandbox imports those directly; providers.ts
 * chooses this implementation for modes container and devcontainer.
 */
import type { Profile } from "../config.ts";
import type { LocalRepo } from "../repo/local.ts";
import { cacheVolumeName, updateCache } from "../repo/cache.ts";
import { type DockerSandboxProvider, sandboxRepo } from "./docker_provider.ts";
import { DockerRelayTransport } from "./docker_relay.ts";
import { startTtyExec } from "./docker_tty.ts";
import {
  attachPooledWorker,
  claimPooled,
  coldSandbox,
  destroy,
  fillPool,
  type PoolOptions,
  reapOrphans,
} from "./pool.ts";
import { keepSandbox, listReady, poolKey } from "./pool_records.ts";
import type {
  RunSandbox,
  SandboxKind,
  SandboxLifecycle,
  SandboxRequest,
  Terminal,
  TerminalRequest,
  WorkerOptions,
} from "./provider.ts";
import type { SandboxError } from "../errors.ts";

/** How many times, `STOP_SETTLE_STEP_MS` apart, a container that still runs is asked again. */
const STOP_SETTLE_ASKS = 15;
const STOP_SETTLE_STEP_MS = 200;

/** One run's Docker container, from the pool or started for it. */
class DockerRunSandbox implements RunSandbox {
  readonly relay: DockerRelayTransport;
  constructor(
    readonly provider: DockerSandboxProvider,
    readonly fromPool: boolean,
    readonly cacheVolume: string | undefined,
  ) {
    this.relay = new DockerRelayTransport(provider);
  }

  get name(): string {
    return this.provider.containerName;
  }

  async attachWorker(options: WorkerOptions) {
    // Only a pooled container has a worker waiting; one started for the run has none.
    return this.fromPool ? await attachPooledWorker(this.provider, options) : undefined;
  }

  watchDisk(options: { onAbort?: (reason: SandboxError) => void }) {
    return this.provider.watchDisk(options);
  }

  async updateCache(repo: LocalRepo, signal?: AbortSignal): Promise<number> {
    if (!this.cacheVolume) throw new TypeError(`Sandbox "${this.name}" mounts no object cache`);
    return await updateCache(this.provider, this.cacheVolume, repo, signal);
  }

  startTerminal(request: TerminalRequest): Promise<Terminal> {
    return startTtyExec({ ...request, container: this.name });
  }

  async stoppedFromOutside(): Promise<string | undefined> {
    // A killed container's processes die before the engine marks it exited (a moment later, more
    // under load): one that still reads as running is asked again, for a bounded while.
    for (let ask = 0; ask <= STOP_SETTLE_ASKS; ask++) {
      if (ask > 0) await new Promise((resolve) => setTimeout(resolve, STOP_SETTLE_STEP_MS));
      const inspected = await this.provider.docker.run(
        ["container", "inspect", "--format", "{{json .State}}", this.name],
        { timeoutMs: 30_000 },
      ).catch(() => undefined);
      if (!inspected) return undefined; // the engine cannot say: what noticed it stands
      if (inspected.exitCode !== 0) return "it was removed";
      const state = JSON.parse(inspected.stdout) as {
        Running?: boolean;
        Status?: string;
        ExitCode?: number;
        OOMKilled?: boolean;
      };
      if (state.Running) continue;
      return `it is ${state.Status ?? "stopped"} (exit code ${state.ExitCode ?? "unknown"}${
        state.OOMKilled ? ", killed for memory" : ""
      })`;
    }
    return undefined;
  }

  release(): Promise<void> {
    return destroy(this.provider);
  }

  keep(): Promise<void> {
    return keepSandbox(this.provider.containerName);
  }
}

/** Docker sandboxes for runs of one profile (mode container; devcontainer once its image is built). */
export class DockerLifecycle implements SandboxLifecycle {
  readonly isolated = true;
  constructor(readonly profile: Profile) {}

  /** What pool.ts needs to know of a kind of run. */
  async #poolOptions(kind: SandboxKind): Promise<PoolOptions> {
    const repository = kind.repo ? await sandboxRepo(kind.repo.key) : undefined;
    return {
      agent: kind.agent,
      repository,
      cacheVolume: repository ? cacheVolumeName(repository) : undefined,
      onProgress: kind.onProgress,
      signal: kind.signal,
    };
  }

  async acquire(request: SandboxRequest): Promise<RunSandbox> {
    const options = await this.#poolOptions(request);
    const claimed = this.profile.sandbox.pool > 0
      ? await claimPooled(this.profile, options)
      : undefined;
    const provider = claimed ??
      await coldSandbox(this.profile, request.runId, { ...options, onNamed: request.onNamed });
    return new DockerRunSandbox(provider, claimed !== undefined, options.cacheVolume);
  }

  async fill(kind: SandboxKind & { wait?: boolean }): Promise<string[]> {
    return await fillPool(this.profile, { ...await this.#poolOptions(kind), wait: kind.wait });
  }

  async ready(kind: SandboxKind): Promise<string[]> {
    const repository = kind.repo ? await sandboxRepo(kind.repo.key) : undefined;
    const key = poolKey(this.profile.name, kind.agent, repository?.key);
    return (await listReady()).filter((record) => record.key === key).map((record) => record.name);
  }

  reapOrphans(): Promise<string[]> {
    return reapOrphans(this.profile);
  }
}
