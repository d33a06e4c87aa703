/**
 * Sandbox mode local's implementation of the seam (provider.ts): a `LocalSandbox` made for each
 * run and destroyed after it (no pool: a sandbox's holder lives only as long as the process that
 * made it, `--die-with-parent`), its relay transport (the relay started by a command in the
 * sandbox, its stdio the stream; the sandbox's socket directory bound in read-only), the disk of
 * its checkout watched with `du` from the host, and a repository's object cache kept by the host
 * and bound in read-only (lib/sandbox/local/cache.ts). Chosen by providers.ts.
 */
import type { Profile } from "../../config.ts";
import { SandboxError } from "../../errors.ts";
import { spawn } from "../../process.ts";
import { type RelayProcess, spawnRelayProcess } from "../../proxy/relay_host.ts";
import type { LocalRepo } from "../../repo/local.ts";
import { startDiskWatch } from "../disk_watch.ts";
import type {
  RunSandbox,
  SandboxKind,
  SandboxLifecycle,
  SandboxRelayTransport,
  SandboxRequest,
  Terminal,
} from "../provider.ts";
import { denoBinaryPath, workerBundlePath } from "../worker_bundle.ts";
import { ensureHostAgent } from "../../agents/host_agent.ts";
import { agentDir } from "../../agents/packages.ts";
import { LOCAL_PATHS } from "./bwrap.ts";
import { localCacheDir, updateLocalCache } from "./cache.ts";
import {
  createLocalSandbox,
  type LocalSandbox,
  localSandboxesDir,
  removeSandboxDir,
  sandboxOwnerAlive,
} from "./local_sandbox.ts";
import { applyLimits } from "./limits.ts";
import { warmDenoCache } from "./deno_cache.ts";
import { localRelayArgv } from "./relay.ts";

/** How often the checkout's size is measured. */
const DISK_POLL_S = 1;

/** The relay of a local sandbox: a command in it (relay.ts), its stdio the relay's lifetime. */
export class LocalRelayTransport implements SandboxRelayTransport {
  constructor(readonly sandbox: LocalSandbox) {}

  get sandboxName(): string {
    return this.sandbox.containerName;
  }

  launchRelay(relayArgs: readonly string[]): RelayProcess {
    // A command like any other: in the sandbox's one pid namespace, as the agent's uid (docs/local.md).
    return spawnRelayProcess(localRelayArgv(relayArgs), {
      spawn: (argv, options) => this.sandbox.spawnInside(argv, options),
    });
  }

  /** No spare relays: a local sandbox serves one run, whose session starts its relay. */
  startDetachedRelay(): Promise<undefined> {
    return Promise.resolve(undefined);
  }

  stopRelay(): Promise<void> {
    return Promise.resolve();
  }

  socketMount(): Promise<{ host: string; sandbox: string }> {
    return Promise.resolve({ host: this.sandbox.dirs.proxy, sandbox: LOCAL_PATHS.proxy });
  }
}

/** One run's local sandbox. */
export class LocalRunSandbox implements RunSandbox {
  readonly fromPool = false;
  readonly relay: LocalRelayTransport;
  constructor(readonly provider: LocalSandbox, readonly repoKey?: string) {
    this.relay = new LocalRelayTransport(provider);
  }

  get name(): string {
    return this.provider.containerName;
  }

  attachWorker() {
    return Promise.resolve(undefined);
  }

  watchDisk(options: { onAbort?: (reason: SandboxError) => void }) {
    // Every directory of the sandbox's that is on the host's disk: not the checkout alone (a
    // container's /tmp and home are size-limited tmpfs; here they are the host's disk too).
    const { workspace, home, tmp } = this.provider.dirs;
    return startDiskWatch(() =>
      Promise.resolve(spawn([
        "sh",
        "-c",
        // Stopped (SIGTERM) while it sleeps, it kills its sleep at once: the sleep holds its
        // output, whose end the close waits for (up to a whole interval, at every run's end).
        "trap 'kill $p 2>/dev/null; exit 0' TERM; p=; " +
        'i=$1; shift; while :; do s=$(du -skc -- "$@" 2>/dev/null | tail -n 1 | cut -f1); ' +
        'echo "du ${s:-0}"; sleep "$i" & p=$!; wait $p; done',
        "sh",
        String(DISK_POLL_S),
        workspace,
        home,
        tmp,
      ])), {
      limitBytes: this.provider.profile.resources.diskBytes,
      sandbox: this.name,
      profile: this.provider.profile.name,
      onAbort: options.onAbort,
    });
  }

  async updateCache(repo: LocalRepo, signal?: AbortSignal): Promise<number> {
    if (!this.repoKey) throw new TypeError(`Sandbox "${this.name}" binds no object cache`);
    return await updateLocalCache(this.repoKey, repo, signal);
  }

  startTerminal(): Promise<Terminal> {
    return Promise.reject(
      new SandboxError(
        "unsupported",
        'Sandbox mode "local" has no terminals: a shell needs mode "container"',
      ),
    );
  }

  /** Its processes are this host's: nothing outside the run stops them but the user. */
  stoppedFromOutside(): Promise<string | undefined> {
    return Promise.resolve(undefined);
  }

  release(): Promise<void> {
    return this.provider.destroy();
  }

  /** Its holder ends with this process: what is kept is its directory, until `sandbox down`. */
  keep(): Promise<void> {
    return Promise.resolve();
  }
}

/** Local sandboxes for runs of one profile. */
export class LocalLifecycle implements SandboxLifecycle {
  readonly isolated = true;
  constructor(readonly profile: Profile) {}

  async acquire(request: SandboxRequest): Promise<RunSandbox> {
    const cache = request.repo ? await localCacheDir(request.repo.key) : undefined;
    const { agent: cli, onProgress, signal } = request;
    const [worker, agent] = await Promise.all([
      workerBundlePath(onProgress),
      cli ? ensureHostAgent(cli, { onProgress, signal }) : undefined,
    ]);
    const name = `local-${request.runId.replace(/[^A-Za-z0-9_-]/g, "").slice(0, 24)}-${
      crypto.randomUUID().slice(0, 8)
    }`;
    const deno = denoBinaryPath();
    const sandbox = await createLocalSandbox(this.profile, name, {
      programs: {
        deno,
        worker,
        cache,
        agent: cli && agent ? { dir: agent, at: agentDir(cli) } : undefined,
      },
      denoCache: await warmDenoCache(this.profile, { deno, worker }, onProgress),
      signal: request.signal,
    });
    return new LocalRunSandbox(sandbox, cache ? request.repo!.key : undefined);
  }

  /** No pool: a holder cannot outlive the process that made it. */
  fill(_kind: SandboxKind): Promise<string[]> {
    return Promise.resolve([]);
  }

  ready(_kind: SandboxKind): Promise<string[]> {
    return Promise.resolve([]);
  }

  /** Sandbox directories (and cgroups) whose maker is gone: removed; their names. */
  async reapOrphans(): Promise<string[]> {
    const reaped: string[] = [];
    const dir = localSandboxesDir();
    const entries = await Array.fromAsync(Deno.readDir(dir)).catch(() => []);
    for (const entry of entries) {
      // Its owner runs (this process included): a live sandbox.
      if (await sandboxOwnerAlive(`${dir}/${entry.name}`)) continue;
      await (await applyLimits(entry.name, this.profile)).remove();
      await removeSandboxDir(`${dir}/${entry.name}`);
      reaped.push(entry.name);
    }
    return reaped;
  }
}
