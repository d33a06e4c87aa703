/**
 * `DockerSandboxProvider`: a profile's sandbox as a hardened, long-lived Docker container.
 *
 * Work enters through `docker exec`; nothing of the host is mounted but, on a local engine, the
 * container's own directory of proxy sockets, read-only (proxy_mount.ts). The container is created
 * from a `docker create` argv derived purely from the profile, and labelled with a hash of that argv,
 * so that a configuration change is detected with one `docker inspect` and the container replaced.
 */
import { withoutRefusedEnv } from "../refused_env.ts";
import type { Profile } from "../config.ts";
import { daemonDown, type DockerCli, LABEL, labelArgs, OWNER, OWNER_FILTER } from "./docker.ts";
import { CommandExitError, fileNotFound, SandboxError } from "../errors.ts";
import { NO_SUCH_FILE_EXIT, readFileArgv } from "./provider.ts";
import {
  type ContainerInspect,
  type DockerEngine,
  dockerEngine,
  type ExecOutcome,
  isEngineError,
  sandboxErrorOf,
  unless,
} from "./engine.ts";
import { cliName } from "../cli_name.ts";
import { sha256Hex } from "../hash.ts";
import { ensureImage, imageTagFor } from "./image.ts";
import type { AgentCliName } from "../agents/packages.ts";
import { removeLegacyFirewall } from "./legacy_cleanup.ts";
import { withHostLock } from "../lock.ts";
import { forget } from "./pool_records.ts";
import { readSnapshot, SNAPSHOT_REPOSITORY } from "./snapshot.ts";
import { CACHE_DIR } from "../repo/cache_layout.ts";
import { execStreamOf } from "./exec_stream.ts";
import { execEnvByName, runEnvByName } from "./docker_env.ts";
import { type DiskWatch, startDiskWatch } from "./disk_watch.ts";
import { type Child, spawn, spawnDetached } from "../process.ts";
import {
  engineMayShareFilesystem,
  prepareProxyMountSource,
  PROXY_MOUNT_PATH,
  proxyMountSource,
  removeProxyMountSource,
} from "./proxy_mount.ts";
import { assertNoSecrets } from "../secret_guard.ts";
import { formatBytes } from "../units.ts";
import { extractTar } from "../tar_extract.ts";
import type {
  EnsureRunningOptions,
  ExecBytes,
  ExecOptions,
  ExecResult,
  ExecStream,
  SandboxHealth,
  SandboxProvider,
  SandboxState,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
} from "./provider.ts";

export { RELAY_UID, RELAY_USER, SANDBOX_UID, SANDBOX_USER } from "./users.ts";
import { RELAY_USER, SANDBOX_UID, SANDBOX_USER } from "./users.ts";
/** Exec ids of relays start with this (lib/proxy/session.ts): they are stopped as the relay's uid. */
export const RELAY_EXEC_PREFIX = "relay-";
export const WORKSPACE_DIR = "/workspace";

export const SANDBOX_HOME = "/home/sandbox";
/** Exit code reported for a command killed by its timeout, as timeout(1) does. */
const EXIT_TIMEOUT = 124;
/** The in-container wrapper every command runs under (scripts/sandbox-exec). */
const SANDBOX_EXEC = "sandbox-exec";
/** How long `ensureRunning({probe})` gives a trivial command to start and end. */
const PROBE_TIMEOUT_MS = 10_000;
/** How many probes in a row must start their command, and the pause between them (see #probe). */
const PROBE_ROUNDS = 2;
const PROBE_GAP_MS = 100;
/** How long `ensureRunning` waits for a container another process is creating. */
const CONCURRENT_START_WAIT_MS = 60_000;
const ENSURE_MAX_PASSES = 600;

export interface DockerProviderOptions {
  /** Path of the docker CLI (default: `docker` on PATH). */
  docker?: string;
  /**
   * A run's own container (its name's last part) instead of the profile's development sandbox:
   * `pooled` ones are started ahead and claimed by one run (lib/sandbox/pool.ts).
   */
  instance?: string;
  /** An existing run's container, by name (`sandbox cp RUN_ID:PATH` of a live or kept run). */
  existing?: string;
  /** Started ahead for the warm pool (label kind "pool"), not for a run that waits for it (kind "run"). */
  pooled?: boolean;
  /**
   * The repository object cache (a volume only the host writes, lib/repo/cache.ts), mounted
   * read-only at `CACHE_DIR`: the run's checkout borrows its objects.
   */
  cacheVolume?: string;
  /**
   * Run from this agent CLI's image (the sandbox image plus the agent's layer), in a container
   * of its own (`sandbox-<profile>-<agent>`), so that runs of different agents never replace
   * each other's container.
   */
  agent?: AgentCliName;
  /** Build output and other slow-step progress, for stderr. */
  onProgress?: (line: string) => void;
  /** Host environment used for `environment.passthrough` (default: the process environment). */
  hostEnv?: (name: string) => string | undefined;
  /**
   * The repository this sandbox serves: its container and workspace are shared only by runs on
   * that repository (`sandbox-<profile>-repo-<id>`), never by runs on another or without one.
   */
  repository?: SandboxRepo;
  /**
   * Bind-mount the proxies' socket directory read-only into a container this creates, when the
   * engine may share this machine's filesystem (proxy_mount.ts; default true). Without it the
   * relay carries everything over the exec stream.
   */
  proxyMount?: boolean;
}

/** A repository's identity for naming its sandbox: `key` (`name-hash`, a label) and a short `id`. */
export interface SandboxRepo {
  key: string;
  id: string;
}

/** The sandbox identity of a repository with key `key` (see lib/repo: stable per path or URL). */
export async function sandboxRepo(key: string): Promise<SandboxRepo> {
  return { key, id: (await sha256Hex(`repo\0${key}`)).slice(0, 12) };
}

/** Names of a profile's Docker objects: predictable, so a human can find them with `docker ps`. */
export function sandboxNames(profile: string, instance?: string) {
  const base = instance ? `sandbox-${profile}-${instance}` : `sandbox-${profile}`;
  return {
    container: base,
    volume: `${base}-workspace`,
  };
}

export class DockerSandboxProvider implements SandboxProvider {
  readonly profile: Profile;
  /** The docker CLI, for what the engine port does not cover (`engine.cli`). */
  readonly docker: DockerCli;
  /** The port through which this provider acts on Docker (engine.ts). */
  readonly engine: DockerEngine;
  readonly names: ReturnType<typeof sandboxNames>;
  readonly #options: DockerProviderOptions;

  constructor(profile: Profile, options: DockerProviderOptions = {}) {
    if (profile.sandbox.mode !== "container") {
      throw new TypeError(
        `DockerSandboxProvider needs sandbox mode "container", not "${profile.sandbox.mode}"`,
      );
    }
    this.profile = profile;
    this.engine = dockerEngine(options.docker);
    this.docker = this.engine.cli;
    const repo = options.repository ? `repo-${options.repository.id}` : undefined;
    const suffix = [options.agent, repo, options.instance].filter(Boolean).join("-");
    this.names = options.existing
      ? { container: options.existing, volume: `${options.existing}-workspace` }
      : sandboxNames(profile.name, suffix || undefined);
    this.#options = options;
  }

  get containerName(): string {
    return this.names.container;
  }

  /** "shared": the profile's development sandbox; "pool" and "run": one run's own container. */
  get kind(): SandboxStatus["kind"] {
    if (this.#options.existing) return "run";
    return this.#options.instance ? this.#options.pooled ? "pool" : "run" : "shared";
  }

  #wasRunning = false;

  /**
   * Whether the last `ensureRunning` found the container up and current as it was, without
   * starting, creating or replacing it: what was started in it meanwhile (a run's relay, say)
   * reached this very container.
   */
  get wasRunning(): boolean {
    return this.#wasRunning;
  }

  /** Labels every object of this sandbox carries. */
  labels(configHash?: string): Record<string, string> {
    return {
      [LABEL.owner]: OWNER,
      [LABEL.profile]: this.profile.name,
      [LABEL.kind]: this.kind,
      ...(this.#options.repository ? { [LABEL.repo]: this.#options.repository.key } : {}),
      ...(configHash ? { [LABEL.configHash]: configHash } : {}),
    };
  }

  /** Environment set in the container: `environment.set` plus passthrough values from the host. */
  containerEnv(): Record<string, string> {
    const env: Record<string, string> = {};
    const hostEnv = this.#options.hostEnv ?? ((name: string) => Deno.env.get(name));
    for (const name of this.profile.sandbox.environment.passthrough) {
      const value = hostEnv(name);
      if (value !== undefined) env[name] = value;
    }
    assertNoSecrets(`sandbox "${this.names.container}"`, {
      env: { ...env, ...this.profile.sandbox.environment.set },
      envKind: "container environment",
    });
    // resolveProfile() warned of them already; a profile made another way loses them here too.
    return withoutRefusedEnv({ ...env, ...this.profile.sandbox.environment.set }, (name) => name)
      .env;
  }

  /**
   * The `docker create` argv (after `docker`) for this profile, the variables its docker client
   * needs (values passed by name, off the command line), and the hash of both that labels the
   * container. Everything that shapes the container is in them, so the hash covers it all.
   */
  async runArgs(): Promise<{ args: string[]; env: Record<string, string>; configHash: string }> {
    const { resources } = this.profile;
    const image = await this.#imageTag();
    // tmpfs pages count against the memory limit and cannot be swapped or reclaimed: /tmp and
    // home together stay within half of it, so filling both still leaves room to run commands.
    const tmpfsSize = tmpfsBytes(resources.memoryBytes);
    const env = runEnvByName(this.containerEnv());
    const body = [
      "--hostname",
      // A hostname has at most 63 characters; a run's container name may have more.
      this.names.container.length <= 63
        ? this.names.container
        : `sandbox-${this.#options.instance}`.slice(0, 63),
      "--user",
      SANDBOX_USER,
      "--cap-drop",
      "ALL",
      "--security-opt",
      "no-new-privileges",
      "--read-only",
      "--tmpfs",
      `/tmp:rw,nosuid,nodev,size=${tmpfsSize}`,
      "--tmpfs",
      `${SANDBOX_HOME}:rw,nosuid,nodev,size=${tmpfsSize},uid=${SANDBOX_UID},gid=${SANDBOX_UID},mode=0700`,
      "--mount",
      `type=volume,src=${this.names.volume},dst=${WORKSPACE_DIR}`,
      ...(this.#options.cacheVolume
        ? ["--mount", `type=volume,src=${this.#options.cacheVolume},dst=${CACHE_DIR},readonly`]
        : []),
      "--memory",
      String(resources.memoryBytes),
      "--memory-swap",
      String(resources.memoryBytes),
      "--cpus",
      String(resources.cpus),
      "--pids-limit",
      String(resources.pids),
      // Isolated modes have no network at all, only `lo`: the proxies are reached through the
      // relay on the exec stream, names resolve on the host (in the egress proxy), and a lookup
      // inside fails at once (no route to any resolver), so DNS cannot carry data out either.
      "--network",
      this.profile.sandbox.network.mode === "full" ? "bridge" : "none",
      "--restart",
      "no",
      // The image's health check runs a command every 30 s: in a pooled container waiting to be
      // claimed that is CPU spent for nothing (a claim probes the container itself). Kept for the
      // development sandbox, whose health `sandbox ls` shows.
      ...(this.#options.instance ? ["--no-healthcheck"] : []),
      ...env.args,
      // The image's own command, `sandbox-exec --init` as pid 1 (instead of Docker's --init: an
      // init the sandbox user cannot ptrace): it readies the worker's cache, then reaps orphans.
      image,
    ];
    // Of the configuration, not of this container: its own names are left out, so that the hash of
    // a pooled container says whether it was made as a run would make one now.
    const shape = body.map((arg) => arg.split(this.names.container).join("NAME"));
    const configHash = (await sha256Hex(`${shape.join("\0")}\0${JSON.stringify(env.clientEnv)}`))
      .slice(0, 16);
    return {
      args: [
        "create",
        "--name",
        this.names.container,
        ...labelArgs(this.labels(configHash)),
        ...body,
      ],
      env: env.clientEnv,
      configHash,
    };
  }

  /**
   * Whether the container has the host's socket directory mounted (made with it, not without),
   * from where this version keeps it (a container made when it was elsewhere gets no waiting
   * processes there; its sessions' relays take the stream).
   */
  async hasProxyMount(signal?: AbortSignal): Promise<boolean> {
    const mount = (await this.#inspect(signal))?.Mounts?.find((m) =>
      m.Destination === PROXY_MOUNT_PATH
    );
    if (!mount) return false;
    const expected = await proxyMountSource(this.names.container);
    return mount.Source === expected ||
      mount.Source === await Deno.realPath(expected).catch(() => expected);
  }

  async #inspect(signal?: AbortSignal): Promise<ContainerInspect | undefined> {
    try {
      return await unless(
        ["not-found"],
        () => this.engine.inspectContainer(this.names.container, signal),
      );
    } catch (error) {
      throw sandboxErrorOf(
        error,
        "docker_failed",
        `Cannot inspect sandbox "${this.names.container}"`,
      );
    }
  }

  /** Remove container `id` (never its volumes); one already gone is removed. */
  async #removeById(id: string, signal?: AbortSignal): Promise<void> {
    await unless(["not-found"], () => this.engine.removeContainer(id, { signal }));
  }

  async ensureRunning(options: EnsureRunningOptions = {}): Promise<SandboxStatus> {
    const { signal } = options;
    // No docker call at all for a configuration that would put a secret in the container.
    this.containerEnv();
    // The container is asked about while its expected configuration is worked out.
    const first = this.#inspect(signal);
    // Awaited in the first pass; should runArgs fail first, its failure is the one raised.
    first.catch(() => {});
    const run = await this.runArgs();
    const deadline = Date.now() + CONCURRENT_START_WAIT_MS;
    // Each pass moves one step (create, start, replace); a bounded number of passes turns an
    // engine that keeps undoing our steps into an error instead of a spin.
    for (let pass = 0;; pass++) {
      signal?.throwIfAborted();
      if (pass === ENSURE_MAX_PASSES) {
        throw new SandboxError(
          "docker_failed",
          `Cannot start sandbox "${this.names.container}": it keeps changing under us`,
          {
            detail:
              "Another process may be removing or recreating it; check docker ps and docker events",
          },
        );
      }
      const found = pass === 0 ? await first : await this.#inspect(signal);
      const step = await this.#ensureStep(found, run.configHash, options, deadline);
      if (step === "continue") continue;
      if (step !== "create") {
        this.#wasRunning = pass === 0;
        return step;
      }
      await this.#createContainer(run, deadline, signal);
    }
  }

  /**
   * One step of `ensureRunning` for the container as `found`: its status when it is up and
   * current, "continue" after waiting, starting or removing it, "create" when there is none.
   */
  async #ensureStep(
    found: ContainerInspect | undefined,
    configHash: string,
    options: EnsureRunningOptions,
    deadline: number,
  ): Promise<SandboxStatus | "continue" | "create"> {
    const { signal } = options;
    if (!found) return "create";
    const current = found.Config.Labels?.[LABEL.configHash] === configHash &&
      !(options.checkImage && await this.#imageOutdated(found));
    if (current && found.State.Running) {
      // Running is not enough: a container whose memory is all held (by tmpfs files, say)
      // cannot start a command any more. Replace it; the workspace volume survives.
      // A failing health check alone may be a slow machine: the probe decides.
      const wedged = (options.probe || found.State.Health?.Status === "unhealthy") &&
        !await this.#probe(signal);
      if (!wedged) return this.#toStatus(found, configHash);
      this.#options.onProgress?.(
        `Replacing sandbox ${this.names.container}: it cannot run commands`,
      );
      await this.#removeById(found.Id, signal);
      return "continue";
    }
    if (current && found.State.Status === "created" && Date.now() < deadline) {
      // Another process has just created it and is about to start it, or start failed.
      await delay(200);
      return "continue";
    }
    if (current && await this.#restart(found, signal)) return "continue";
    // Stale or broken: remove by id, so a container a concurrent process just created under
    // the same name is never the one removed.
    const why = current ? "it could not be restarted" : "its configuration changed";
    this.#options.onProgress?.(`Replacing sandbox ${this.names.container}: ${why}`);
    await this.#removeById(found.Id, signal);
    return "continue";
  }

  /** Start a stopped container; false when the engine refuses (it is then replaced). */
  async #restart(found: ContainerInspect, signal?: AbortSignal): Promise<boolean> {
    // Its mount's source must exist for it to start (the state directory may have been cleared).
    if (found.Mounts?.some((m) => m.Destination === PROXY_MOUNT_PATH)) {
      // Without it the start fails and the container is replaced: nothing is lost by going on.
      await prepareProxyMountSource(this.names.container).catch(() => {});
    }
    try {
      await this.engine.startContainer(found.Id, signal);
      return true;
    } catch (error) {
      if (isEngineError(error, "engine-unreachable")) {
        throw sandboxErrorOf(error, "docker_failed", "");
      }
      if (isEngineError(error)) return false;
      throw error;
    }
  }

  /**
   * Create and start the container. Creation of the profile's shared
   * container is serialised on this host (volume, container); the caller inspects again after.
   * A run's own container has a name no one else uses: runs that start together create theirs at
   * the same time (an image build is serialised by itself, see image.ts).
   */
  async #createContainer(
    run: { args: string[]; env: Record<string, string> },
    deadline: number,
    signal?: AbortSignal,
  ): Promise<void> {
    const created = this.#options.instance
      ? await this.#runContainer(run, signal)
      : await withHostLock(`container-${this.names.container}`, async () => {
        if (await this.#inspect(signal)) return { exitCode: 0, stderr: "", exists: true };
        return await this.#runContainer(run, signal);
      });
    if (created.exitCode === 0) return;
    if (created.exists && Date.now() < deadline) {
      // A concurrent `up` won the race for the name: use its container.
      await delay(100);
      return;
    }
    throw new CommandExitError(
      "docker_failed",
      `Cannot start sandbox "${this.names.container}"`,
      { argv: run.args, exitCode: created.exitCode, stderrTail: created.stderr },
    );
  }

  /**
   * The container made and started, with the proxies' socket mount where the engine may bind it;
   * `exists` when it could not be made because a container of that name exists (a concurrent
   * creator won).
   */
  async #runContainer(
    run: { args: string[]; env: Record<string, string> },
    signal?: AbortSignal,
  ): Promise<{ exitCode: number; stderr: string; exists: boolean }> {
    const { args, env } = run;
    await this.#prepare(signal);
    const mount = await this.#proxyMountArgs();
    if (mount.length > 0) {
      // Not part of the configuration (hash): an accelerator whose absence changes no rule.
      const mounted = await this.#createAndStart([...args.slice(0, -1), ...mount, args.at(-1)!], {
        env,
        signal,
      });
      if (mounted.exitCode === 0 || mounted.exists) return mounted;
      // The engine could not bind it (not this machine's filesystem after all): without it.
      this.#mountRefused = true;
    }
    return await this.#createAndStart(args, { env, signal });
  }

  /**
   * `docker create` (the CLI: see engine.ts), then the start through the port. A container that
   * was made but does not start is removed by its id, so nothing half-made stays behind.
   */
  async #createAndStart(
    argv: string[],
    options: { env: Record<string, string>; signal?: AbortSignal },
  ): Promise<{ exitCode: number; stderr: string; exists: boolean }> {
    // Not cut short by `signal`: a create the engine has received goes on without its client and
    // would leave a container no one removes. It is quick (#prepare made the image); an interrupt
    // is seen once it has settled, and what it made is removed.
    const created = await this.docker.run(argv, { env: options.env });
    if (created.exitCode !== 0) {
      // Refused before anything was made: because the name is taken, or for another reason.
      const exists = await this.#inspect(options.signal) !== undefined;
      return { exitCode: created.exitCode, stderr: created.stderr, exists };
    }
    // `docker create` prints the new container's id; by name if it printed nothing else.
    const id = created.stdout.trim().split("\n").at(-1) || this.names.container;
    if (options.signal?.aborted) {
      await this.#removeById(id);
      options.signal.throwIfAborted();
    }
    try {
      await this.engine.startContainer(id, options.signal);
      return { exitCode: 0, stderr: "", exists: false };
    } catch (error) {
      if (!isEngineError(error) || error.kind === "engine-unreachable") {
        throw sandboxErrorOf(
          error,
          "docker_failed",
          `Cannot start sandbox "${this.names.container}"`,
        );
      }
      await this.#removeById(id, options.signal);
      return { exitCode: 125, stderr: error.engineMessage, exists: false };
    }
  }

  /** The image containers are created from: the sandbox image, or an agent's layer on it. */
  imageTag(): Promise<string> {
    return this.#imageTag();
  }

  /** The id of the image containers are created from now, or undefined when it is missing. */
  async imageId(signal?: AbortSignal): Promise<string | undefined> {
    const tag = await this.#imageTag();
    return (await unless(["image-missing"], () => this.engine.inspectImage(tag, signal)))?.Id;
  }

  /** The image a run's container starts from before any snapshot (what a snapshot is built on). */
  runImageTag(): Promise<string> {
    return imageTagFor(this.profile.sandbox.image);
  }

  async #imageTag(): Promise<string> {
    const base = await imageTagFor(this.profile.sandbox.image);
    // A run's container starts from the profile's snapshot (snapshot.ts) while it was built on
    // the image the run would use now.
    if (this.kind !== "shared" && !this.#options.agent) {
      const snapshot = await readSnapshot(this.profile.name);
      if (snapshot?.base === base) return snapshot.tag;
    }
    // An agent CLI's layer: its modules are loaded only for such a sandbox (~3 ms of every other start).
    if (!this.#options.agent) return base;
    const { agentImageTagFor } = await import("../agents/agent_image.ts");
    return await agentImageTagFor(base, this.#options.agent);
  }

  #mountRefused = false;

  /** `--mount` of the proxies' socket directory, or nothing (see `proxyMount`). */
  async #proxyMountArgs(): Promise<string[]> {
    if (this.#options.proxyMount === false || this.#mountRefused) return [];
    if (!await engineMayShareFilesystem(this.docker)) return [];
    // No source directory (the state directory not writable, say): no mount, the stream carries all.
    const source = await prepareProxyMountSource(this.names.container).catch(() => undefined);
    return source ? ["--mount", `type=bind,src=${source},dst=${PROXY_MOUNT_PATH},readonly`] : [];
  }

  /**
   * Whether a command can start in the container: twice in a row, each time a command that starts
   * two more (a pipeline). Processes that hold every pid and take back any that comes free (a
   * fork bomb; or what the suite's wedge test leaves) can let one lucky fork in when a runtime
   * retires a thread: seen in CI, where one probe of `true` passed a wedged container. Two
   * pipelines in a row they do not; a healthy container starts them in milliseconds.
   */
  async #probe(signal?: AbortSignal): Promise<boolean> {
    for (let round = 0; round < PROBE_ROUNDS; round++) {
      if (round > 0) await delay(PROBE_GAP_MS);
      const result = await this.docker.run(
        [
          "exec",
          "--user",
          SANDBOX_USER,
          this.names.container,
          SANDBOX_EXEC,
          "probe",
          "sh",
          "-c",
          "true | true",
        ],
        { signal, timeoutMs: PROBE_TIMEOUT_MS },
      );
      signal?.throwIfAborted();
      if (result.exitCode !== 0) return false;
    }
    return true;
  }

  async #imageOutdated(found: ContainerInspect): Promise<boolean> {
    const tag = await this.#imageTag();
    const image = await unless(["image-missing"], () => this.engine.inspectImage(tag));
    return image?.Id !== found.Image;
  }

  /** Image and volume, each created only when missing and safe under races. */
  async #prepare(signal?: AbortSignal): Promise<void> {
    const base = await ensureImage(this.docker, this.profile.sandbox.image, {
      signal,
      onProgress: this.#options.onProgress,
    });
    if (this.#options.agent) {
      const { ensureAgentImage } = await import("../agents/agent_image.ts");
      await ensureAgentImage(this.docker, base.tag, this.#options.agent, {
        signal,
        onProgress: this.#options.onProgress,
      });
    }
    const image = await this.#imageTag();
    if (
      image.startsWith(`${SNAPSHOT_REPOSITORY}:`) &&
      !await unless(["image-missing"], () => this.engine.inspectImage(image, signal))
    ) {
      throw new SandboxError(
        "image_build_failed",
        `The snapshot "${image}" of profile "${this.profile.name}" is missing`,
        {
          detail:
            `Take a new one with: ${cliName()} snapshot -p ${this.profile.name}, or drop it with: ${cliName()} snapshot --drop -p ${this.profile.name}`,
        },
      );
    }
    await this.#ensureVolume(signal);
    // Created here, labelled (a mount would make it unlabelled, out of teardown's sight).
    if (this.#options.cacheVolume) {
      const cache = this.#options.cacheVolume;
      const labels = {
        [LABEL.owner]: OWNER,
        [LABEL.profile]: this.profile.name,
        [LABEL.kind]: "cache",
      };
      await this.#createVolumeIfMissing(cache, labels, signal);
    }
  }

  /**
   * The workspace volume, with a kernel quota of `resources.disk` where the engine's storage has
   * project quotas (the local driver's `size` option: xfs mounted with pquota); elsewhere a plain
   * volume, whose size `watchDisk` enforces instead.
   */
  async #ensureVolume(signal?: AbortSignal): Promise<void> {
    const name = this.names.volume;
    if (await this.#volumeExists(name, signal)) return;
    // The creates are not cut short by `signal` (as a container's create): one the engine has
    // received goes on without its client, and a volume made after its run's cleanup stays.
    const quota = { size: String(this.profile.resources.diskBytes) };
    const made = await this.engine.createVolume(name, this.labels(), quota).then(
      () => true,
      (error) => {
        if (!isEngineError(error) || error.kind === "engine-unreachable") {
          throw sandboxErrorOf(error, "docker_failed", `Cannot create volume "${name}"`);
        }
        // Refused: storage without project quotas (the usual reason), or the name taken meanwhile.
        // Either way a plain volume, or the one that exists, follows; watchDisk enforces the size.
        return false;
      },
    );
    if (!made) await this.#createVolumeIfMissing(name, this.labels());
    signal?.throwIfAborted();
  }

  /** The workspace volume's kernel quota in bytes, or undefined when it has none. */
  async workspaceQuota(signal?: AbortSignal): Promise<number | undefined> {
    const volume = await unless(
      ["not-found"],
      () => this.engine.inspectVolume(this.names.volume, signal),
    );
    const size = volume?.Options?.size;
    return size && /^\d+$/.test(size) ? Number(size) : undefined;
  }

  /**
   * Whether volume `name` exists. Two under one name (created concurrently from another host)
   * are made one first: the one with the lowest id stays, which every process picks alike.
   */
  async #volumeExists(name: string, signal?: AbortSignal): Promise<boolean> {
    try {
      return await unless(["not-found"], () => this.engine.inspectVolume(name, signal)) !==
        undefined;
    } catch (error) {
      if (!isEngineError(error, "refused", "conflict")) throw error;
      const listed = await this.docker.ok(
        ["volume", "ls", "--filter", `name=${name}`, "--format", "{{.Name}}"],
        "docker_failed",
        "Cannot list volumes",
        { signal },
      );
      if (listed.split("\n").filter((line) => line === name).length < 2) {
        throw sandboxErrorOf(error, "docker_failed", `Cannot inspect volume "${name}"`);
      }
      await this.#dedupe("volume", name, signal);
      return true;
    }
  }

  async #createVolumeIfMissing(
    name: string,
    labels: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<void> {
    if (await this.#volumeExists(name, signal)) return;
    try {
      await this.engine.createVolume(name, labels, {}, signal);
    } catch (error) {
      // Made meanwhile by a concurrent process: as good as made here.
      if (isEngineError(error) && error.kind !== "engine-unreachable") {
        if (await this.#volumeExists(name, signal)) return;
      }
      throw sandboxErrorOf(error, "docker_failed", `Cannot create volume "${name}"`);
    }
  }

  /**
   * Two objects under one name (created concurrently from another host): keep the one with the
   * lowest id, which every process picks alike, and remove the rest.
   */
  async #dedupe(kind: string, name: string, signal?: AbortSignal): Promise<void> {
    const listed = await this.docker.ok(
      [kind, "ls", "--no-trunc", "--filter", `name=${name}`, "--format", "{{.ID}} {{.Name}}"],
      "docker_failed",
      `Cannot list ${kind}s`,
      { signal },
    );
    const ids = listed.split("\n").map((l) => l.split(" ")).filter(([, n]) => n === name).map((
      [id],
    ) => id).sort();
    for (const id of ids.slice(1)) await this.docker.run([kind, "rm", id], { signal });
  }

  /** A command may run: not empty, and no known secret in its variables or arguments. */
  #checkCommand(argv: readonly string[], options: ExecOptions): void {
    if (argv.length === 0) throw new TypeError("Cannot run an empty command");
    assertNoSecrets(`sandbox "${this.names.container}"`, {
      env: options.env,
      envKind: "exec environment",
      argv,
    });
  }

  #execArgs(
    argv: readonly string[],
    id: string,
    options: ExecOptions,
  ): { args: string[]; env: Record<string, string> } {
    this.#checkCommand(argv, options);
    // By name: the values (the session token among them) stay off every command line.
    const env = execEnvByName(options.env ?? {});
    return {
      args: [
        "exec",
        ...(options.stdin !== undefined ? ["--interactive"] : []),
        "--user",
        SANDBOX_USER,
        ...(options.cwd ? ["--workdir", options.cwd] : []),
        ...env.args,
        this.names.container,
        SANDBOX_EXEC,
        id,
        ...argv,
      ],
      env: env.clientEnv,
    };
  }

  execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
    const id = execId(options);
    const { args, env } = this.#execArgs(argv, id, options);
    const child = this.docker.spawn(args, {
      env,
      stdin: options.stdin,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      onStderrLine: options.onStderrLine,
    });
    return this.#streamOf(child, id, options.timeoutMs);
  }

  #streamOf(child: Child, id: string, timeoutMs: number | undefined): ExecStream {
    return execStreamOf(child, async (stoppedEarly) => {
      const ended = await child.finished;
      if (ended.timedOut || ended.aborted || stoppedEarly) await this.#killTree(id);
      if (ended.timedOut) {
        throw new SandboxError(
          "timeout",
          `Command timed out after ${timeoutMs} ms in sandbox "${this.names.container}"`,
        );
      }
      if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
      throwIfExecFailed(ended, this.names.container);
      const oomKilled = ended.exitCode === 137 && await this.#wasOomKilled(id);
      return {
        exitCode: ended.exitCode,
        durationMs: ended.durationMs,
        timedOut: false,
        oomKilled,
        stderrTail: ended.stderrTail,
      };
    });
  }

  execBytes(argv: readonly string[], options: ExecOptions = {}): ExecBytes {
    const id = execId(options);
    const { args, env } = this.#execArgs(argv, id, options);
    const child = this.docker.spawn(args, {
      env,
      stdin: options.stdin,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      onStderrLine: options.onStderrLine,
    });
    let stopped = false;
    const outcome = (async () => {
      const ended = await child.finished;
      if (ended.timedOut || ended.aborted || stopped) await this.#killTree(id);
      if (ended.timedOut) {
        throw new SandboxError(
          "timeout",
          `Command timed out after ${options.timeoutMs} ms in sandbox "${this.names.container}"`,
        );
      }
      if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
      throwIfExecFailed(ended, this.names.container);
      const oomKilled = ended.exitCode === 137 && !stopped && await this.#wasOomKilled(id);
      return {
        exitCode: ended.exitCode,
        durationMs: ended.durationMs,
        timedOut: false,
        oomKilled,
        stderrTail: ended.stderrTail,
      };
    })();
    outcome.catch(() => {}); // the caller awaits `outcome`; this only keeps an unread one handled
    return {
      stdout: child.stdout,
      outcome,
      stop: async () => {
        stopped = true;
        child.kill();
        // Stopped on purpose: how it ended is of no interest to the one who stopped it.
        await outcome.catch(() => {});
      },
    };
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    const id = execId(options);
    const { args, env } = this.#execArgs(argv, id, options);
    const result = await this.docker.run(args, {
      env,
      stdin: options.stdin,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      onStderrLine: options.onStderrLine,
    });
    if (result.timedOut || result.aborted) await this.#killTree(id);
    if (result.aborted) throw new SandboxError("interrupted", "Command interrupted");
    if (!result.timedOut) {
      throwIfExecFailed(result, this.names.container);
    }
    return {
      exitCode: result.timedOut ? EXIT_TIMEOUT : result.exitCode,
      stdout: result.stdout,
      stderr: result.stderr,
      durationMs: result.durationMs,
      timedOut: result.timedOut,
      oomKilled: result.exitCode === 137 && await this.#wasOomKilled(id),
    };
  }

  /**
   * End the process tree of exec `id` (one started under the exec wrapper with that id). A relay's
   * (`relay-…`) runs as its own uid, which only that uid can signal (root in the container has no
   * capabilities): it is stopped as that uid.
   */
  stopExec(id: string): Promise<void> {
    if (id.startsWith(RELAY_EXEC_PREFIX)) return this.#stopInside(["--kill", id], RELAY_USER);
    return this.#killTree(id);
  }

  /**
   * Enforce `resources.disk` on the workspace while something runs in the sandbox. With a kernel
   * quota of that size on the volume there is nothing to do; otherwise the container's init
   * reports the workspace's size on the container's log, which this follows, and the returned
   * signal aborts (a `disk_limit` error) when it passes the limit while growing, or when the
   * reports stop (disk_watch.ts). Stop the commands with that signal; close the watch when done.
   */
  watchDisk(options: { onAbort?: (reason: SandboxError) => void } = {}): DiskWatch {
    const limitBytes = this.profile.resources.diskBytes;
    const began = Date.now();
    // Started in the background: the first command need not wait for it.
    return startDiskWatch(async () => {
      const quota = await this.workspaceQuota();
      if (quota !== undefined && quota <= limitBytes) return undefined;
      // Every report since a little before the watch began (init reports at least every 5 s), by
      // the engine's timestamps: those from before it are the size the command started with,
      // whenever this follower attaches, and the ones after it are the command's doing.
      const since = ((began - DISK_REPORT_LOOKBACK_MS) / 1000).toFixed(3);
      const follower = this.docker.spawn([
        "logs",
        "--follow",
        "--timestamps",
        "--since",
        since,
        this.names.container,
      ]);
      return {
        lines: () => datedReports(follower.lines(), began),
        finished: follower.finished,
        kill: (graceMs?: number) => follower.kill(graceMs),
      };
    }, {
      limitBytes,
      sandbox: this.names.container,
      profile: this.profile.name,
      onAbort: options.onAbort,
    });
  }

  /**
   * Kill every process in the container that belongs to no live exec (see scripts/sandbox-exec):
   * what a command left behind after killing its own wrapper, for one. Runs and `sandbox exec`
   * call it when they end.
   */
  async sweep(): Promise<void> {
    await this.#stopInside(["--sweep"]);
  }

  /** Kill exec `id`'s whole process tree inside the container, then sweep. */
  async #killTree(id: string): Promise<void> {
    await this.#stopInside(["--kill", id]);
  }

  /**
   * Run `sandbox-exec ARGS` (a kill or a sweep). A fork bomb can hold every pid, so that even
   * this cannot start: retry briefly, then restart the container.
   */
  async #stopInside(args: string[], user = SANDBOX_USER): Promise<void> {
    for (let attempt = 0; attempt < 10; attempt++) {
      const result = await this.docker.run(
        ["exec", "--user", user, this.names.container, SANDBOX_EXEC, ...args],
        { timeoutMs: 15_000 },
      );
      // Done, or nothing left to stop (the container gone or stopped).
      if (result.exitCode === 0 || isEngineError(result.failure, "not-found", "not-running")) {
        return;
      }
      await delay(100 * (attempt + 1));
    }
    this.#options.onProgress?.(
      `Cannot stop a command in sandbox ${this.names.container} (no free process slots): restarting it`,
    );
    await this.docker.run(["restart", "--time", "1", this.names.container]);
  }

  /** Did the memory cgroup's oom_kill count rise while exec `id` ran? */
  /** Whether the memory limit killed a process since exec `id` began (its wrapper noted the count). */
  execOomKilled(id: string): Promise<boolean> {
    return this.#wasOomKilled(id);
  }

  async #wasOomKilled(id: string): Promise<boolean> {
    const result = await this.docker.run(
      ["exec", "--user", SANDBOX_USER, this.names.container, SANDBOX_EXEC, "--oom", id],
      { timeoutMs: 10_000 },
    );
    const [before, now] = result.stdout.trim().split(/\s+/).map(Number);
    return result.exitCode === 0 && now > before;
  }

  /**
   * `CONTAINER sandbox-exec ID ARGV` for the tool's own file transfers: under the wrapper like
   * every command, so that a sweep never takes them for leftovers.
   */
  #wrapped(...argv: string[]): string[] {
    return [this.names.container, SANDBOX_EXEC, crypto.randomUUID(), ...argv];
  }

  async readFile(path: string, options: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const child = this.docker.spawn(
      ["exec", "--user", SANDBOX_USER, ...this.#wrapped(...readFileArgv(path))],
      { signal: options.signal },
    );
    const [bytes, outcome] = await Promise.all([
      new Response(child.stdout).bytes(),
      child.finished,
    ]);
    if (outcome.exitCode !== 0) {
      throwIfExecFailed(outcome, this.names.container);
      if (outcome.exitCode === NO_SUCH_FILE_EXIT) {
        throw fileNotFound(path, `sandbox "${this.names.container}"`);
      }
      throw new CommandExitError(
        "exec_failed",
        `Cannot read "${path}" in sandbox "${this.names.container}"`,
        outcome,
      );
    }
    return bytes;
  }

  async writeFile(
    path: string,
    data: Uint8Array | string,
    options: { mode?: number; signal?: AbortSignal } = {},
  ): Promise<void> {
    assertNoSecrets(`sandbox "${this.names.container}"`, { file: { path, data } });
    const mode = (options.mode ?? 0o600).toString(8);
    const script = 'umask 077; mkdir -p "$(dirname "$1")" && cat >"$1" && chmod "$2" "$1"';
    const result = await this.docker.run(
      [
        "exec",
        "--interactive",
        "--user",
        SANDBOX_USER,
        ...this.#wrapped("sh", "-c", script, "sh", path, mode),
      ],
      { stdin: data, signal: options.signal },
    );
    if (result.exitCode !== 0) {
      throwIfExecFailed(result, this.names.container);
      throw new CommandExitError(
        "exec_failed",
        `Cannot write "${path}" in sandbox "${this.names.container}"`,
        result,
      );
    }
  }

  /** A tar stream through `docker exec`: works on tmpfs and volumes alike, owned by the sandbox user. */
  async copyIn(
    hostPath: string,
    sandboxPath: string,
    options: { signal?: AbortSignal } = {},
  ): Promise<void> {
    const { dir, base } = splitPath(hostPath);
    const tar = spawn(["tar", "-C", dir, "-c", "--", base], { signal: options.signal });
    const script = 'mkdir -p "$1" && tar -x -C "$1" --no-same-owner';
    const { dir: targetDir, base: targetBase } = splitPath(sandboxPath);
    const untar = this.docker.spawn(
      [
        "exec",
        "--interactive",
        "--user",
        SANDBOX_USER,
        ...this.#wrapped(
          "sh",
          "-c",
          `${script} && { [ "$2" = "$3" ] || mv -- "$1/$2" "$1/$3"; }`,
          "sh",
          targetDir,
          base,
          targetBase,
        ),
      ],
      { stdin: tar.stdout, signal: options.signal },
    );
    const [packed, unpacked] = await Promise.all([
      tar.finished,
      untar.finished,
      new Response(untar.stdout).text(),
    ]);
    if (packed.exitCode !== 0) {
      throw new CommandExitError("exec_failed", `Cannot read "${hostPath}" on the host`, packed);
    }
    if (unpacked.exitCode !== 0) {
      throwIfExecFailed(unpacked, this.names.container);
      throw new CommandExitError(
        "exec_failed",
        `Cannot copy into "${sandboxPath}" in sandbox "${this.names.container}"`,
        unpacked,
      );
    }
  }

  /**
   * The reverse of `copyIn`. The archive is the sandbox's to write (the agent can stop our `tar -c`
   * and write into its stdout), so the host reads it with its own strict extractor
   * (lib/tar_extract.ts), never `tar -x`: regular files, directories, symbolic links and hard
   * links within the copy only, no device, FIFO, absolute or `..` name, nothing written through a
   * link, no setuid/setgid/sticky bit, owned by the invoking user; a refused member fails the copy
   * naming it, and nothing is written. What the sandbox sends may not fill the host's disk either:
   * files are archived sparse (a hole costs the workspace nothing, so a 1 TB file of holes fits in
   * any `resources.disk`, and it stays a hole on the host), and the stream is cut off past twice
   * `resources.disk` — more than the workspace can hold, headers included — and the copy refused.
   */
  async copyOut(
    sandboxPath: string,
    hostPath: string,
    options: { signal?: AbortSignal } = {},
  ): Promise<void> {
    const { dir, base } = splitPath(sandboxPath);
    const limitBytes = 2 * this.profile.resources.diskBytes;
    const tooLarge = new AbortController();
    const refused = new AbortController();
    const signal = AbortSignal.any([
      tooLarge.signal,
      refused.signal,
      ...(options.signal ? [options.signal] : []),
    ]);
    const pack = this.docker.spawn(
      [
        "exec",
        "--user",
        SANDBOX_USER,
        ...this.#wrapped(
          "sh",
          "-c",
          `[ -e "$1/$2" ] || exit ${NO_SUCH_FILE_EXIT}; exec tar -C "$1" --sparse -c -- "$2"`,
          "sh",
          dir,
          base,
        ),
      ],
      { signal },
    );
    const capped = cappedStream(pack.stdout, limitBytes, () => tooLarge.abort());
    const { dir: targetDir, base: targetBase } = splitPath(hostPath);
    const what = `Cannot copy "${sandboxPath}" out of sandbox "${this.names.container}"`;
    const staging = await Deno.makeTempDir({ dir: targetDir, prefix: ".sandbox-copy-" });
    try {
      const [packed, failure] = await Promise.all([
        pack.finished,
        extractTar(capped, staging, { what, top: base }).then(() => undefined, (error: unknown) => {
          // The sender may be blocked on a full pipe: end it.
          refused.abort();
          return error;
        }),
      ]);
      if (tooLarge.signal.aborted) {
        throw new SandboxError(
          "exec_failed",
          `${what}: it is larger than ${
            formatBytes(limitBytes)
          }, twice resources.disk of profile "${this.profile.name}"`,
          {
            detail:
              "Nothing was written. A workspace cannot hold that much: the file is sparse or was still growing",
          },
        );
      }
      if (options.signal?.aborted) throw new SandboxError("interrupted", `${what}: interrupted`);
      // A packer that failed on its own explains a cut archive; one we ended for a refused member does not.
      if (packed.exitCode !== 0 && !(packed.aborted && failure)) {
        throwIfExecFailed(packed, this.names.container);
        if (packed.exitCode === NO_SUCH_FILE_EXIT) {
          throw fileNotFound(sandboxPath, `sandbox "${this.names.container}"`);
        }
        throw new CommandExitError(
          "exec_failed",
          `Cannot read "${sandboxPath}" in sandbox "${this.names.container}"`,
          packed,
        );
      }
      if (failure) throw failure;
      await Deno.rename(`${staging}/${base}`, `${targetDir}/${targetBase}`);
    } finally {
      // A temporary directory left behind costs disk space only; the copy's outcome stands.
      await Deno.remove(staging, { recursive: true }).catch(() => {});
    }
  }

  async stats(options: { signal?: AbortSignal } = {}): Promise<SandboxStats> {
    const found = await this.#inspect(options.signal);
    if (!found) throw notFound(this.names.container);
    const [stats] = await dockerStats(this.docker, [found], options.signal);
    return stats;
  }

  async status(options: { signal?: AbortSignal } = {}): Promise<SandboxStatus> {
    const found = await this.#inspect(options.signal);
    if (!found) {
      return {
        profile: this.profile.name,
        name: this.names.container,
        id: "",
        image: "",
        state: "missing",
        health: "unknown",
        createdAt: "",
        startedAt: null,
        stoppedAt: null,
        workspacePath: WORKSPACE_DIR,
        current: false,
        kind: this.kind,
        repo: this.#options.repository?.key ?? null,
      };
    }
    return this.#toStatus(found, (await this.runArgs()).configHash);
  }

  #toStatus(found: ContainerInspect, configHash: string): SandboxStatus {
    return {
      ...inspectToStatus(found),
      current: found.Config.Labels?.[LABEL.configHash] === configHash,
    };
  }

  /** `docker stop`: the container and its workspace stay; `start` (or `up`, or a run) resumes it. */
  async stop(options: { signal?: AbortSignal; timeoutS?: number } = {}): Promise<SandboxStatus> {
    const result = await this.docker.run([
      "stop",
      "--time",
      String(options.timeoutS ?? 10),
      this.names.container,
    ], { signal: options.signal });
    if (result.exitCode !== 0) {
      if (!await this.#inspect(options.signal)) throw notFound(this.names.container);
      throw new CommandExitError(
        "docker_failed",
        `Cannot stop sandbox "${this.names.container}"`,
        result,
      );
    }
    return await this.status(options);
  }

  /** `docker start` of the existing container, as it is (`ensureRunning` also creates or replaces). */
  async start(options: { signal?: AbortSignal } = {}): Promise<SandboxStatus> {
    const found = await this.#inspect(options.signal);
    if (!found) throw notFound(this.names.container);
    if (!found.State.Running) {
      try {
        await this.engine.startContainer(found.Id, options.signal);
      } catch (error) {
        throw sandboxErrorOf(
          error,
          "docker_failed",
          `Cannot start sandbox "${this.names.container}"`,
        );
      }
    }
    return await this.status(options);
  }

  async healthCheck(options: { signal?: AbortSignal } = {}): Promise<boolean> {
    // A probe that cannot even be made is a failed health check, which is the answer asked for.
    return await this.#probe(options.signal).catch(() => false);
  }

  /**
   * Remove this container and its workspace volume in a process of its own, and return at once:
   * a run with a container of its own does not make its user wait for the removal (~0.2 s), which
   * happens even when this process exits right after. Should it never start (this process killed
   * first), the container and volume keep their owner labels: `teardown --all` removes them.
   */
  teardownDetached(): void {
    spawnDetached([
      "sh",
      "-c",
      '"$1" rm --force "$2" >/dev/null 2>&1; "$1" volume rm "$3" >/dev/null 2>&1',
      "sh",
      this.docker.program,
      this.names.container,
      this.names.volume,
    ]);
  }

  /** Whether the container exists and runs (one inspect). */
  async isRunning(signal?: AbortSignal): Promise<boolean> {
    return (await this.#inspect(signal))?.State.Running === true;
  }

  /** The hash of the configuration this provider makes containers with (see `runArgs`). */
  async configHash(): Promise<string> {
    return (await this.runArgs()).configHash;
  }

  async teardown(
    options: { volumes?: boolean; signal?: AbortSignal } = {},
  ): Promise<TeardownReport> {
    const report: TeardownReport = { containers: [], networks: [], volumes: [] };
    try {
      await this.engine.removeContainer(this.names.container, { signal: options.signal });
      report.containers.push(this.names.container);
    } catch (error) {
      if (!isEngineError(error, "not-found")) {
        throw sandboxErrorOf(
          error,
          "docker_failed",
          `Cannot remove sandbox "${this.names.container}"`,
        );
      }
    }
    // The container is gone: so is what the host kept for its mount (sockets, a spare relay's record).
    await removeProxyMountSource(this.names.container);
    if (options.volumes) {
      // A volume still in use (by a container of another process) stays; it is not reported.
      const removed = await this.engine.removeVolume(this.names.volume, { signal: options.signal })
        .then(() => true, (error) => {
          if (isEngineError(error)) return false;
          throw error;
        });
      if (removed) report.volumes.push(this.names.volume);
    }
    if (!this.#options.instance) {
      report.networks = await removeLegacyNetworks(this.docker, this.profile.name, options.signal);
    }
    return report;
  }
}

/** Size of each of the /tmp and home tmpfs mounts: a quarter of the memory limit (see runArgs). */
export function tmpfsBytes(memoryBytes: number): number {
  return Math.max(1024 ** 2, Math.floor(memoryBytes / 4 / 4096) * 4096);
}

/** How far back a disk watch reads the container's log: init reports at least every 5 s. */
const DISK_REPORT_LOOKBACK_MS = 6_000;

/**
 * Init's `du KIB` reports on the container's log (`docker logs --timestamps`), as disk_watch.ts
 * reads them: `base KIB` when made before `began`, `du KIB` after.
 */
async function* datedReports(lines: AsyncGenerator<string>, began: number): AsyncGenerator<string> {
  for await (const line of lines) {
    const [stamp, kind, kib] = line.split(" ");
    const at = Date.parse(stamp);
    if (kind !== "du" || Number.isNaN(at)) continue;
    yield `${at < began ? "base" : "du"} ${kib}`;
  }
}

/** An exec's id in the container (the wrapper's): a run's own are named after it (see ExecOptions.runId). */
function execId(options: ExecOptions): string {
  return options.runId ? `worker-${options.runId}-${crypto.randomUUID()}` : crypto.randomUUID();
}

function notFound(name: string): SandboxError {
  return new SandboxError("container_not_found", `Sandbox "${name}" does not exist`, {
    detail: `Start it with: ${cliName()} start`,
  });
}

/**
 * Raise the engine's failure of an exec (container gone or stopped, the command's process never
 * started, the engine unreachable); the command's own exit code, whatever it is, raises nothing.
 */
function throwIfExecFailed(outcome: ExecOutcome, container: string): void {
  const failure = outcome.failure;
  if (!failure) return;
  if (failure.kind === "not-found") throw notFound(container);
  if (failure.kind === "not-running") {
    throw new SandboxError("invalid_state", `Sandbox "${container}" is not running`, {
      detail: `Start it with: ${cliName()} start`,
    });
  }
  if (failure.kind === "engine-unreachable") throw daemonDown(failure.engineMessage);
  throw new CommandExitError("exec_failed", `Cannot run the command in sandbox "${container}"`, {
    argv: [],
    exitCode: outcome.exitCode,
    stderrTail: outcome.stderrTail || failure.engineMessage,
  });
}

function splitPath(path: string): { dir: string; base: string } {
  const trimmed = path.replace(/\/+$/, "") || "/";
  const slash = trimmed.lastIndexOf("/");
  if (slash === -1) return { dir: ".", base: trimmed };
  return { dir: trimmed.slice(0, slash) || "/", base: trimmed.slice(slash + 1) };
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

const STATES = new Set<SandboxState>(["running", "paused", "restarting", "dead", "created"]);

function inspectToStatus(found: ContainerInspect): Omit<SandboxStatus, "current"> {
  const labels = found.Config.Labels ?? {};
  const state = STATES.has(found.State.Status as SandboxState)
    ? found.State.Status as SandboxState
    : "stopped";
  const health = (found.State.Health?.Status ?? "unknown") as SandboxHealth;
  return {
    profile: labels[LABEL.profile] ?? "",
    name: found.Name.replace(/^\//, ""),
    id: found.Id.slice(0, 12),
    image: found.Config.Image,
    state,
    health: ["healthy", "unhealthy", "starting"].includes(health) ? health : "unknown",
    createdAt: found.Created,
    startedAt: dockerTime(found.State.StartedAt),
    stoppedAt: found.State.Running ? null : dockerTime(found.State.FinishedAt),
    workspacePath: WORKSPACE_DIR,
    kind: labels[LABEL.kind] === "run" ? "run" : labels[LABEL.kind] === "pool" ? "pool" : "shared",
    repo: labels[LABEL.repo] ?? null,
  };
}

/** docker's timestamps, with its zero time ("0001-01-01T00:00:00Z": never happened) as null. */
function dockerTime(text: string | undefined): string | null {
  return !text || text.startsWith("0001-01-01") ? null : text;
}

/** Every sandbox container this tool owns (by label), on the engine `docker` reaches. */
export async function listSandboxes(
  docker: DockerCli,
  signal?: AbortSignal,
): Promise<SandboxStatus[]> {
  const found = await inspectOwned(docker, signal);
  return found.map((c) => ({ ...inspectToStatus(c), current: true }));
}

async function inspectOwned(docker: DockerCli, signal?: AbortSignal): Promise<ContainerInspect[]> {
  const ids = (await docker.ok(
    ["ps", "--all", "--quiet", "--filter", OWNER_FILTER],
    "docker_failed",
    "Cannot list sandboxes",
    { signal },
  ))
    .split("\n").filter(Boolean);
  if (ids.length === 0) return [];
  const result = await docker.run(["container", "inspect", ...ids], { signal });
  // A container removed between `ps` and `inspect` is simply not listed.
  const parsed = result.stdout.trim() ? JSON.parse(result.stdout) as ContainerInspect[] : [];
  return parsed;
}

/** Live resource use of every running sandbox this tool owns. */
export async function statsAll(docker: DockerCli, signal?: AbortSignal): Promise<SandboxStats[]> {
  const running = (await inspectOwned(docker, signal)).filter((c) => c.State.Running);
  return await dockerStats(docker, running, signal);
}

async function dockerStats(
  docker: DockerCli,
  containers: ContainerInspect[],
  signal?: AbortSignal,
): Promise<SandboxStats[]> {
  if (containers.length === 0) return [];
  const out = await docker.ok(
    [
      "stats",
      "--no-stream",
      "--no-trunc",
      "--format",
      "{{json .}}",
      ...containers.map((c) => c.Id),
    ],
    "docker_failed",
    "Cannot read sandbox stats",
    { signal },
  );
  const byId = new Map(containers.map((c) => [c.Id, c]));
  return out.split("\n").filter(Boolean).map((line) => {
    const row = JSON.parse(line) as {
      ID: string;
      Container: string;
      CPUPerc: string;
      MemUsage: string;
      PIDs: string;
    };
    const inspect = byId.get(row.ID) ??
      containers.find((c) => c.Id.startsWith(row.ID) || row.ID.startsWith(c.Id));
    const [used, limit] = row.MemUsage.split("/").map((s) => parseDockerSize(s.trim()));
    return {
      profile: inspect?.Config.Labels?.[LABEL.profile] ?? "",
      name: inspect?.Name.replace(/^\//, "") ?? row.Container,
      memoryBytes: used,
      memoryLimitBytes: inspect?.HostConfig.Memory || limit,
      cpuPercent: Number.parseFloat(row.CPUPerc) || 0,
      pids: Number.parseInt(row.PIDs) || 0,
      pidsLimit: inspect?.HostConfig.PidsLimit ?? 0,
    };
  });
}

/** docker's human sizes: "1.5MiB", "512kB", "2GB", "0B". */
export function parseDockerSize(text: string): number {
  const match = /^([\d.]+)\s*([KMGT]i?)?B$/i.exec(text);
  if (!match) return 0;
  const prefix = (match[2] ?? "").toUpperCase();
  const binary = prefix.endsWith("I");
  const power = " KMGT".indexOf(prefix[0] ?? " ");
  return Math.round(Number(match[1]) * (binary ? 1024 : 1000) ** Math.max(power, 0));
}

/** Older versions gave each profile a network (and, as root, a firewall chain on its bridge). */
async function removeLegacyNetworks(
  docker: DockerCli,
  profile: string,
  signal?: AbortSignal,
): Promise<string[]> {
  const removed: string[] = [];
  const networks = await docker.run(
    [
      "network",
      "ls",
      "--filter",
      OWNER_FILTER,
      "--filter",
      `label=${LABEL.profile}=${profile}`,
      "--format",
      "{{.Name}}",
    ],
    { signal },
  );
  for (const network of networks.stdout.split("\n").filter(Boolean)) {
    const result = await docker.run(["network", "rm", network], { signal });
    if (result.exitCode === 0) removed.push(network);
  }
  if (removed.length > 0) await removeLegacyFirewall();
  return removed;
}

/**
 * Remove every container of one profile (its shared one, one per repository, per-run ones) and
 * with `volumes` their workspace volumes; by label, so nothing else is touched.
 */
export async function teardownProfile(
  docker: DockerCli,
  profile: string,
  options: { volumes?: boolean; signal?: AbortSignal } = {},
): Promise<TeardownReport> {
  const filters = ["--filter", OWNER_FILTER, "--filter", `label=${LABEL.profile}=${profile}`];
  const report: TeardownReport = { containers: [], networks: [], volumes: [] };
  const list = async (args: string[], what: string) =>
    (await docker.ok(args, "docker_failed", `Cannot list ${what}`, options)).split("\n").filter(
      Boolean,
    );
  // One by one: an object removed meanwhile by someone else is simply not reported.
  const engine = dockerEngine(docker.program);
  const remove = async (kind: "container" | "volume", name: string) => {
    try {
      if (kind === "container") await engine.removeContainer(name, options);
      else await engine.removeVolume(name, options);
      return true;
    } catch (error) {
      if (isEngineError(error, "not-found")) return false;
      throw sandboxErrorOf(
        error,
        "docker_failed",
        `Cannot remove "${name}" of profile "${profile}"`,
      );
    }
  };
  const format = `{{.Names}} {{.Label "${LABEL.kind}"}}`;
  for (
    const [name, kind] of (await list(["ps", "--all", ...filters, "--format", format], "sandboxes"))
      .map((line) => line.split(" "))
  ) {
    if (await remove("container", name)) report.containers.push(name);
    // A run's workspace goes with its container, always.
    if (kind === "pool" || kind === "run") {
      if (await remove("volume", `${name}-workspace`)) {
        report.volumes.push(`${name}-workspace`);
      }
    }
    // With the container, what the host kept of it (its mount's sockets, its pool records).
    await Promise.all([removeProxyMountSource(name), forget(name)]);
  }
  if (options.volumes) {
    for (
      const name of await list(["volume", "ls", ...filters, "--format", "{{.Name}}"], "volumes")
    ) {
      if (await remove("volume", name)) report.volumes.push(name);
    }
  }
  report.networks = await removeLegacyNetworks(docker, profile, options.signal);
  return report;
}

/**
 * Remove every container, network and volume this tool owns (by label), and nothing else; with
 * `scope` (`KEY=VALUE`), only those that also carry that label.
 */
export async function teardownAll(
  docker: DockerCli,
  signal?: AbortSignal,
  scope?: string,
): Promise<TeardownReport> {
  const filters = ["--filter", OWNER_FILTER, ...(scope ? ["--filter", `label=${scope}`] : [])];
  const list = async (kind: "container" | "network" | "volume") => {
    const args = kind === "container"
      ? ["ps", "--all", ...filters, "--format", "{{.Names}}"]
      : [kind, "ls", ...filters, "--format", "{{.Name}}"];
    return (await docker.ok(args, "docker_failed", `Cannot list ${kind}s`, { signal })).split("\n")
      .filter(Boolean);
  };
  const report: TeardownReport = { containers: [], networks: [], volumes: [] };
  const containers = await list("container");
  if (containers.length > 0) {
    await docker.ok(
      ["rm", "--force", ...containers],
      "docker_failed",
      "Cannot remove sandbox containers",
      { signal },
    );
    report.containers = containers;
    for (const name of containers) await Promise.all([removeProxyMountSource(name), forget(name)]);
  }
  for (const network of await list("network")) {
    const result = await docker.run(["network", "rm", network], { signal });
    if (result.exitCode === 0) report.networks.push(network);
  }
  const volumes = await list("volume");
  if (volumes.length > 0) {
    await docker.ok(
      ["volume", "rm", "--force", ...volumes],
      "docker_failed",
      "Cannot remove sandbox volumes",
      { signal },
    );
    report.volumes = volumes;
  }
  return report;
}

/** `stream`, ended once more than `limitBytes` went through it; `onOver` is called then. */
function cappedStream(
  stream: ReadableStream<Uint8Array>,
  limitBytes: number,
  onOver: () => void,
): ReadableStream<Uint8Array> {
  let received = 0;
  return stream.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        received += chunk.byteLength;
        if (received > limitBytes) {
          onOver();
          controller.terminate();
          return;
        }
        controller.enqueue(chunk);
      },
    }),
  );
}
