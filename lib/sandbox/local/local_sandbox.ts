/**
 * `LocalSandbox`: one sandbox of mode local (bwrap.ts says how it is built), as a
 * `SandboxProvider`. It is made for one run (`createLocalSandbox`) and destroyed after it
 * (`destroy`): the holder is killed (which ends every process of the sandbox: they all live in its
 * pid namespace), the cgroup emptied and removed, and the sandbox's directories deleted.
 *
 * Files move through commands in the sandbox (cat, tar), never by host file operations on its
 * directories: the agent writes them, and a link it planted there must resolve inside the sandbox,
 * not on the host. What comes out as a tar is extracted by the host's strict reader.
 */
import type { Profile } from "../../config.ts";
import { fileNotFound, SandboxError } from "../../errors.ts";
import { NO_SUCH_FILE_EXIT, readFileArgv } from "../provider.ts";
import { userStateDir } from "../../paths.ts";
import {
  type ChildProcess,
  isSameProcessAlive,
  type ProcessOutcome,
  processStartTicks,
  run,
  spawn,
  type SpawnOptions,
} from "../../process.ts";
import { assertNoSecrets } from "../../secret_guard.ts";
import { extractTar } from "../../tar_extract.ts";
import { execBytesOf, execStreamOf } from "../exec_stream.ts";
import type {
  ExecBytes,
  ExecOptions,
  ExecResult,
  ExecStream,
  ExecStreamOutcome,
  SandboxProvider,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
} from "../provider.ts";
import {
  HOLDER_READY,
  holderArgv,
  type HostPrograms,
  LOCAL_PATH,
  LOCAL_PATHS,
  LOCAL_UID,
  localPrograms,
  type LocalTools,
  localTools,
  type SandboxDirs,
  systemArgs,
  withoutInheritedFds,
} from "./bwrap.ts";
import { landlockRules, landlockSupport } from "./landlock.ts";
import { type HostCommand, launcherCommand } from "./launcher.ts";
import { applyLimits, type LocalLimits } from "./limits.ts";
import { SANDBOX_DENO_DIR, seedDenoCache } from "./deno_cache.ts";
import { sharedFiles } from "./shared_files.ts";

/** Where local sandboxes' directories are: `<state>/local/<name>`. */
export function localSandboxesDir(): string {
  return `${userStateDir()}/local`;
}

/** Whether the process that made the sandbox at `root` (its `owner` file) still runs. */
export async function sandboxOwnerAlive(root: string): Promise<boolean> {
  const owner = await Deno.readTextFile(`${root}/owner`).catch(() => undefined);
  const [pid, ticks] = (owner ?? "0 0").trim().split(" ").map(Number);
  return pid > 0 && await isSameProcessAlive(pid, ticks || undefined);
}

/**
 * The names of the local sandboxes whose maker still runs: live sandboxes, which bind host files
 * (bundles, agent files) into each command they start, so those files must stay while they live.
 */
export async function liveLocalSandboxes(): Promise<string[]> {
  const dir = localSandboxesDir();
  const entries = await Array.fromAsync(Deno.readDir(dir)).catch(() => []);
  const live: string[] = [];
  for (const entry of entries) {
    if (await sandboxOwnerAlive(`${dir}/${entry.name}`)) live.push(entry.name);
  }
  return live.sort();
}

/** The environment every command starts from, but for a warmed Deno cache's `DENO_DIR`. */
const BASE_ENV: Record<string, string> = {
  PATH: LOCAL_PATH,
  HOME: LOCAL_PATHS.home,
  TMPDIR: LOCAL_PATHS.tmp,
  LANG: "C.UTF-8",
  USER: "sandbox",
  DENO_NO_UPDATE_CHECK: "1",
};

export interface LocalSandboxOptions {
  /** Programs and the object cache bound in read-only. */
  programs: HostPrograms;
  /**
   * Host directories (made, 0700, by the caller) to use as the sandbox's workspace and home
   * instead of empty ones of its own: they are kept at destroy (a profile's development
   * sandbox, dev_sandbox.ts). Its /tmp is still its own.
   */
  kept?: { workspace: string; home: string };
  /**
   * A warmed Deno cache (deno_cache.ts) to copy into the sandbox's fresh /tmp, and use there
   * (`DENO_DIR`): a run's worker then starts without compiling its bundle.
   */
  denoCache?: string;
  signal?: AbortSignal;
}

/** Make a sandbox named `name` for `profile`: its directories, limits and holder. */
export async function createLocalSandbox(
  profile: Profile,
  name: string,
  options: LocalSandboxOptions,
): Promise<LocalSandbox> {
  const tools = await localPrograms();
  const root = `${localSandboxesDir()}/${name}`;
  await Deno.mkdir(localSandboxesDir(), { recursive: true, mode: 0o700 });
  await Deno.mkdir(root, { mode: 0o700 });
  const dirs: SandboxDirs = {
    root,
    files: await sharedFiles(),
    workspace: options.kept?.workspace ?? `${root}/workspace`,
    home: options.kept?.home ?? `${root}/home`,
    tmp: `${root}/tmp`,
    // Short (a Unix socket's path has at most 107 bytes; the state directory can be deep): a
    // directory of its own in the temporary directory, 0700, named in `proxy-dir` for the reaper.
    proxy: await Deno.makeTempDir({ prefix: "sandbox-local-" }),
  };
  await Deno.writeTextFile(`${root}/proxy-dir`, `${dirs.proxy}\n`);
  for (const dir of options.kept ? [dirs.tmp] : [dirs.workspace, dirs.home, dirs.tmp]) {
    await Deno.mkdir(dir, { mode: 0o700 });
  }
  const env = options.denoCache ? { ...BASE_ENV, DENO_DIR: SANDBOX_DENO_DIR } : BASE_ENV;
  // Who made it: a sandbox whose owner is gone is an orphan (lifecycle.ts reapOrphans).
  await Deno.writeTextFile(
    `${root}/owner`,
    `${Deno.pid} ${await processStartTicks(Deno.pid) ?? 0}\n`,
  );
  const limits = await applyLimits(name, profile);
  const landlock = await landlockSupport();
  const sandbox = new LocalSandbox(
    profile,
    name,
    dirs,
    tools,
    options.programs,
    limits,
    landlock,
    env,
  );
  try {
    // Before the holder starts: nothing has run in the sandbox, nothing in its /tmp but this copy.
    if (options.denoCache) await seedDenoCache(options.denoCache, `${dirs.tmp}/deno-dir`);
    await sandbox.start(options);
  } catch (error) {
    await sandbox.destroy();
    // Said when this machine refuses user namespaces (asked only now: the probe costs a bwrap).
    await localTools();
    throw error;
  }
  return sandbox;
}

/**
 * Wait until the holder has named its init's pid (bwrap's `--info-fd` JSON, on stdout) and its
 * command has said it runs (`ready`: `HOLDER_READY` on stderr): only then are its namespaces
 * complete. The init's host pid. The rest of stdout is read to its end, never closed: bwrap writes
 * more of its JSON after the pid, and a closed pipe killed it there (SIGPIPE), leaving its child
 * waiting forever for id maps that never came — the holder that "did not come up".
 */
async function holderUp(holder: ChildProcess, ready: Promise<void>): Promise<number> {
  const reader = holder.stdout.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let pid: number | undefined;
  while (pid === undefined) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
    const found = /"child-pid"\s*:\s*(\d+)/.exec(text);
    if (found) pid = Number(found[1]);
  }
  if (pid !== undefined) {
    void drain(reader);
    const up = await Promise.race([ready.then(() => true), holder.finished.then(() => false)]);
    if (up) return pid;
  }
  const ended = await holder.finished;
  throw new SandboxError(
    "exec_failed",
    `Cannot start the local sandbox: its holder did not come up: bwrap exited ${ended.exitCode}: ${ended.stderrTail.trim()}`,
  );
}

/** Read a stream to its end, discarding what it says (the holder's stdout: it ends with the holder). */
async function drain(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<void> {
  try {
    while (!(await reader.read()).done) {
      // Discarded: the rest of bwrap's JSON; the holder's command says nothing more.
    }
  } catch {
    // The pipe failed with the holder's end: nothing more to read.
  }
}

/** The host pids of process `pid`'s children (none once it is gone). */
async function childrenOf(pid: number): Promise<number[]> {
  // A process that is gone has no children: an unreadable file says so.
  const text = await Deno.readTextFile(`/proc/${pid}/task/${pid}/children`).catch(() => "");
  return text.split(" ").filter(Boolean).map(Number);
}

export class LocalSandbox implements SandboxProvider {
  readonly createdAt = new Date().toISOString();
  #holder?: ChildProcess;
  #holderPid = 0;
  /** When the holder's init started (clock ticks since boot): its pid is its only while it lives. */
  #holderStart = 0;
  /** The holder has exited (its sandbox is over, whatever ended it). */
  #holderEnded = false;
  /** The holder's own command (the lifeline's reader): the one child of its init that is no orphan. */
  #holderCommandPid = 0;
  /** The holder's stdin: closed at destroy, it ends the holder (as this process's death would). */
  #lifeline?: ReadableStreamDefaultController<Uint8Array>;
  #system: readonly string[] = [];
  #destroyed = false;
  /** Commands running now: stopped at destroy (their tree dies with the holder either way). */
  readonly #running = new Set<ChildProcess>();

  constructor(
    readonly profile: Profile,
    readonly containerName: string,
    readonly dirs: SandboxDirs,
    readonly tools: LocalTools,
    readonly programs: HostPrograms,
    readonly limits: LocalLimits,
    /** The kernel's Landlock ABI, applied to every command; or why Landlock is absent here. */
    readonly landlock: { abi: number } | { absent: string },
    /** The environment every command starts from (the caller's variables are added). */
    readonly env: Readonly<Record<string, string>> = BASE_ENV,
  ) {}

  /** The host pid of the holder's init (0 before start): every process of the sandbox is under it. */
  get holderPid(): number {
    return this.#holderPid;
  }

  /** When the holder's init started (clock ticks since boot; 0 before start). */
  get holderStart(): number {
    return this.#holderStart;
  }

  /** Start the holder (once). */
  async start(_options: { signal?: AbortSignal } = {}): Promise<SandboxStatus> {
    if (this.#holder) return await this.status();
    this.#system = await systemArgs();
    // Its stdin: a pipe this process never writes nor closes (holderCommand says why).
    let ready!: () => void;
    const said = new Promise<void>((resolve) => ready = resolve);
    const argv = holderArgv(this.tools, this.#system, this.dirs, this.programs);
    const holder = spawn(withoutInheritedFds(argv), {
      clearEnv: true,
      stdin: new ReadableStream<Uint8Array>({ start: (c) => this.#lifeline = c }),
      onStderrLine: (line) => line === HOLDER_READY && ready(),
    });
    this.#holder = holder;
    holder.finished.finally(() => this.#holderEnded = true).catch(() => {}); // only bookkeeping
    this.#holderPid = await holderUp(holder, said);
    this.#holderStart = await processStartTicks(this.#holderPid) ?? 0;
    // The init's one child: the command that has just said it runs.
    const [command] = await childrenOf(this.#holderPid);
    this.#holderCommandPid = command ?? 0;
    return await this.status();
  }

  ensureRunning(): Promise<SandboxStatus> {
    return this.start();
  }

  stop(): Promise<SandboxStatus> {
    return Promise.reject(
      new SandboxError("usage", "A local sandbox lives for one run: it cannot be stopped and kept"),
    );
  }

  /** The host process that runs `argv` in the sandbox with exactly the environment `env` (launcher.ts). */
  commandFor(
    argv: readonly string[],
    cwd?: string,
    env: Readonly<Record<string, string>> = this.env,
  ): HostCommand {
    if (!this.#holder || this.#destroyed || this.#holderEnded) {
      throw new SandboxError(
        this.#destroyed ? "container_not_found" : "invalid_state",
        `Local sandbox "${this.containerName}" is not running`,
      );
    }
    return launcherCommand({
      perl: this.tools.perl,
      holder: { pid: this.#holderPid, startTicks: this.#holderStart },
      uid: LOCAL_UID,
      seccompFile: `${this.dirs.files}/seccomp.bpf`,
      cgroupJoins: this.limits.cgroupJoins,
      rlimits: this.limits.rlimits,
      // Made inside the sandbox's mount namespace, on the paths as the sandbox sees them.
      landlock: "abi" in this.landlock ? landlockRules(this.landlock.abi) : undefined,
      cwd: cwd ?? LOCAL_PATHS.workspace,
      env,
      argv,
    });
  }

  /** A command in the sandbox, from the base environment plus `options.env` (nothing of the host's). */
  spawnInside(argv: readonly string[], options: ExecOptions | SpawnOptions = {}): ChildProcess {
    assertNoSecrets(`local sandbox "${this.containerName}"`, {
      env: options.env,
      envKind: "environment",
      argv,
    });
    const command = this.commandFor(argv, options.cwd, { ...this.env, ...options.env });
    const child = spawn(command.argv, {
      ...options,
      cwd: undefined,
      env: command.env,
      clearEnv: true,
    });
    this.#running.add(child);
    child.finished.finally(() => this.#running.delete(child)).catch(() => {}); // only bookkeeping
    return child;
  }

  /**
   * Kill every process of the sandbox that belongs to no live command, until none is left. A
   * command's first process in the sandbox has its parent outside it (the launcher, on the host): what
   * a stopped command leaves behind — its whole tree, `setsid` or double-forked — is reparented to
   * the holder's init, whose only child of its own is the holder's command.
   */
  async #sweep(): Promise<void> {
    for (let attempt = 0; attempt < 500; attempt++) {
      const orphans = (await childrenOf(this.#holderPid)).filter((pid) =>
        pid !== this.#holderCommandPid
      );
      if (orphans.length === 0) return;
      for (const pid of orphans) {
        try {
          Deno.kill(pid, "SIGKILL");
        } catch {
          // Exited between the read and the kill: nothing to end.
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  /** A command's end; one that was stopped (timeout, abort, kill) leaves nothing behind. */
  async #ended(child: ChildProcess): Promise<ProcessOutcome> {
    const ended = await child.finished;
    if (ended.timedOut || ended.aborted || ended.signal !== null) await this.#sweep();
    return ended;
  }

  async #finish(
    child: ChildProcess,
    options: ExecOptions,
    oomBefore: number,
  ): Promise<ExecStreamOutcome> {
    const ended = await this.#ended(child);
    if (ended.timedOut) {
      throw new SandboxError("timeout", `Command timed out after ${options.timeoutMs} ms`);
    }
    if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
    return {
      exitCode: ended.exitCode,
      durationMs: ended.durationMs,
      timedOut: false,
      oomKilled: (await this.limits.oomKills()) > oomBefore,
      stderrTail: ended.stderrTail,
    };
  }

  execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
    const child = this.spawnInside(argv, options);
    const oom = this.limits.oomKills();
    return execStreamOf(child, async () => await this.#finish(child, options, await oom));
  }

  execBytes(argv: readonly string[], options: ExecOptions = {}): ExecBytes {
    const child = this.spawnInside(argv, options);
    const outcome = this.limits.oomKills().then((before) => this.#finish(child, options, before));
    return execBytesOf(child, outcome);
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    const before = await this.limits.oomKills();
    const child = this.spawnInside(argv, options);
    let stderr = "";
    const [stdout, ended] = await Promise.all([
      new Response(child.stdout).text(),
      this.#ended(child),
    ]);
    stderr = ended.stderrTail;
    if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
    return {
      exitCode: ended.timedOut ? 124 : ended.exitCode,
      stdout,
      stderr,
      durationMs: ended.durationMs,
      timedOut: ended.timedOut,
      oomKilled: (await this.limits.oomKills()) > before,
    };
  }

  async readFile(path: string, options: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const bytes = this.execBytes(readFileArgv(path), options);
    const data = new Uint8Array(await new Response(bytes.stdout).arrayBuffer());
    const outcome = await bytes.outcome;
    if (outcome.exitCode === NO_SUCH_FILE_EXIT) {
      throw fileNotFound(path, `local sandbox "${this.containerName}"`);
    }
    if (outcome.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot read "${path}" in the sandbox: ${outcome.stderrTail.trim()}`,
      );
    }
    return data;
  }

  async writeFile(
    path: string,
    data: Uint8Array | string,
    options: { mode?: number; signal?: AbortSignal } = {},
  ): Promise<void> {
    assertNoSecrets(`local sandbox "${this.containerName}"`, { file: { path, data } });
    const mode = (options.mode ?? 0o600).toString(8);
    const result = await this.exec([
      "sh",
      "-c",
      'mkdir -p -- "$(dirname -- "$1")" && umask 077 && cat >"$1" && chmod "$2" -- "$1"',
      "sh",
      path,
      mode,
    ], { stdin: data, signal: options.signal });
    if (result.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot write "${path}" in the sandbox: ${result.stderr.trim()}`,
      );
    }
  }

  async copyIn(
    hostPath: string,
    sandboxPath: string,
    options: { signal?: AbortSignal } = {},
  ): Promise<void> {
    const info = await Deno.stat(hostPath);
    if (!info.isDirectory) {
      return await this.writeFile(sandboxPath, await Deno.readFile(hostPath), {
        mode: (info.mode ?? 0o600) & 0o777,
        signal: options.signal,
      });
    }
    // The archive is read whole, then sent as bytes (the host path is the user's own choice).
    const tar = spawn(["tar", "-C", hostPath, "-cf", "-", "."], { signal: options.signal });
    const archive = new Uint8Array(await new Response(tar.stdout).arrayBuffer());
    const result = await this.exec(
      ["sh", "-c", 'mkdir -p -- "$1" && tar -xf - -C "$1" --no-same-owner', "sh", sandboxPath],
      { stdin: archive, signal: options.signal },
    );
    const packed = await tar.finished;
    if (packed.exitCode !== 0 || result.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot copy "${hostPath}" into the sandbox: ${(packed.stderrTail + result.stderr).trim()}`,
      );
    }
  }

  async copyOut(
    sandboxPath: string,
    hostPath: string,
    options: { signal?: AbortSignal } = {},
  ): Promise<void> {
    const isDir = await this.exec(["test", "-d", sandboxPath], options);
    if (isDir.exitCode !== 0) {
      return await Deno.writeFile(hostPath, await this.readFile(sandboxPath, options), {
        mode: 0o600,
      });
    }
    await Deno.mkdir(hostPath, { recursive: true });
    // The directory's entries, not "." itself: the extractor refuses a member naming its root.
    const tar = this.execBytes([
      "sh",
      "-c",
      'cd -- "$1" && find . -mindepth 1 -maxdepth 1 -print0 | tar -cf - --null -T -',
      "sh",
      sandboxPath,
    ], options);
    await extractTar(tar.stdout, hostPath, {
      what: `Cannot copy "${sandboxPath}" out of sandbox "${this.containerName}"`,
    });
    const outcome = await tar.outcome;
    if (outcome.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot copy "${sandboxPath}" out: ${outcome.stderrTail.trim()}`,
      );
    }
  }

  async stats(): Promise<SandboxStats> {
    return {
      profile: this.profile.name,
      name: this.containerName,
      ...await this.limits.usage(),
      memoryLimitBytes: this.limits.kind === "rlimit" ? 0 : this.profile.resources.memoryBytes,
      cpuPercent: 0,
      pidsLimit: this.profile.resources.pids,
    };
  }

  status(): Promise<SandboxStatus> {
    const running = this.#holder !== undefined && !this.#destroyed;
    return Promise.resolve({
      profile: this.profile.name,
      name: this.containerName,
      id: this.containerName,
      image: "",
      state: running ? "running" : "missing",
      health: "unknown",
      createdAt: this.createdAt,
      startedAt: this.createdAt,
      stoppedAt: null,
      workspacePath: LOCAL_PATHS.workspace,
      current: true,
      kind: "run",
      repo: null,
    });
  }

  async healthCheck(): Promise<boolean> {
    return await this.exec(["true"], { timeoutMs: 30_000 }).then(
      (r) => r.exitCode === 0,
      () => false,
    );
  }

  async teardown(): Promise<TeardownReport> {
    await this.destroy();
    return { containers: [this.containerName], networks: [], volumes: [] };
  }

  /** End every process of the sandbox and remove all of it. */
  async destroy(): Promise<void> {
    this.#destroyed = true;
    // The holder's death ends its pid namespace, and with it every command's (nested in it).
    this.#lifeline?.close();
    this.#lifeline = undefined;
    this.#holder?.kill(0);
    // Its init too, by pid: one killed before bwrap set its parent-death signal waits forever.
    if (this.#holderPid > 0) {
      try {
        Deno.kill(this.#holderPid, "SIGKILL");
      } catch {
        // Already gone with the holder: nothing to end.
      }
    }
    for (const child of this.#running) child.kill(0);
    await this.#holder?.finished;
    await Promise.all([...this.#running].map((child) => child.finished));
    await this.limits.remove();
    await removeSandboxDir(this.dirs.root);
  }
}

/**
 * Remove a sandbox's directory, whatever modes the agent left on what it made there, and its
 * proxies' socket directory (named in its `proxy-dir`, made by this tool under the temporary
 * directory: the name is checked before anything is removed).
 */
export async function removeSandboxDir(root: string): Promise<void> {
  const proxy = (await Deno.readTextFile(`${root}/proxy-dir`).catch(() => "")).trim();
  if (/^\/[^\n]*\/sandbox-local-[^/]+$/.test(proxy)) {
    await Deno.remove(proxy, { recursive: true }).catch((error) => {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    });
  }
  const remove = () =>
    Deno.remove(root, { recursive: true }).catch((error) => {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    });
  try {
    await remove();
  } catch (error) {
    if (!(error instanceof Deno.errors.PermissionDenied)) throw error;
    // A directory the agent made unwritable or unreadable: its modes are mended, then it goes.
    // chmod -R changes no link's target: it does not follow links met in the walk.
    await run(["chmod", "-R", "u+rwX", "--", root]);
    await remove();
  }
}
