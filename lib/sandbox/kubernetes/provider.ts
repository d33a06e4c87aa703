/**
 * `KubernetesSandboxProvider`: one sandbox pod's operations (provider.ts `SandboxProvider`), every
 * one of them over the API server: commands through pod exec (pod_exec.ts), files as `cat` and
 * `tar` streams over exec, status from the pod object. A pod cannot be stopped and started again:
 * `stop` is refused, `teardown` deletes it.
 */
import type { V1Pod } from "@kubernetes/client-node";
import { fileNotFound, SandboxError } from "../../errors.ts";
import { NO_SUCH_FILE_EXIT, readFileArgv } from "../provider.ts";
import { assertNoSecrets } from "../../secret_guard.ts";
import { execBytesOf, execStreamOf } from "../exec_stream.ts";
import { spawn } from "../../process.ts";
import { extractTar } from "../../tar_extract.ts";
import type {
  ExecBytes,
  ExecOptions,
  ExecResult,
  ExecStream,
  ExecStreamOutcome,
  SandboxProvider,
  SandboxState,
  SandboxStats,
  SandboxStatus,
  TeardownReport,
} from "../provider.ts";
import type { Child } from "../../process.ts";
import { type Cluster, clusterError, isNotFound } from "./cluster.ts";
import { podSpawn, preludeArgv } from "./pod_exec.ts";
import { LABELS, SANDBOX_CONTAINER, WORKSPACE_DIR } from "./pod_spec.ts";

function outcomeOf(ended: Awaited<Child["finished"]>, timeoutMs?: number): ExecStreamOutcome {
  if (ended.timedOut) throw new SandboxError("timeout", `Command timed out after ${timeoutMs} ms`);
  if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
  return {
    exitCode: ended.exitCode,
    durationMs: ended.durationMs,
    timedOut: false,
    oomKilled: ended.exitCode === 137,
    stderrTail: ended.stderrTail,
  };
}

export class KubernetesSandboxProvider implements SandboxProvider {
  constructor(
    readonly cluster: Cluster,
    readonly profile: string,
    readonly podName: string,
  ) {}

  get containerName(): string {
    return this.podName;
  }

  /** `argv` in `container` under the wrapper, as a child (the relay uses the relay container). */
  spawn(
    argv: readonly string[],
    options: ExecOptions & { container?: string; id?: string } = {},
  ): Child {
    if (argv.length === 0) throw new TypeError("Cannot run an empty command");
    // No secret this process knows goes into a pod, on an exec's argv or in its environment.
    assertNoSecrets(`pod "${this.podName}"`, {
      env: options.env,
      envKind: "exec environment",
      argv,
    });
    const container = options.container ?? SANDBOX_CONTAINER;
    const id = options.id ??
      (options.runId ? `worker-${options.runId}-${crypto.randomUUID()}` : crypto.randomUUID());
    return podSpawn(this.cluster, preludeArgv(id, argv, options.cwd), {
      pod: this.podName,
      container,
      id,
      env: options.env,
      stdin: options.stdin,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      onStderrLine: options.onStderrLine,
      stopInside: () => this.stopExec(id, container),
    });
  }

  /** End exec `id`'s whole tree in `container` (the wrapper's `--kill`, as that container's uid). */
  async stopExec(id: string, container = SANDBOX_CONTAINER): Promise<void> {
    const child = podSpawn(this.cluster, preludeArgv("", ["sandbox-exec", "--kill", id]), {
      pod: this.podName,
      container,
      id: "",
      timeoutMs: 30_000,
      stopInside: () => Promise.resolve(),
    });
    await child.stdout.cancel();
    await child.finished;
  }

  async ensureRunning(): Promise<SandboxStatus> {
    return await this.status();
  }

  stop(): Promise<SandboxStatus> {
    return Promise.reject(
      new SandboxError("unsupported", "A Kubernetes sandbox cannot be stopped, only removed", {
        detail: "Its pod ends with the run (or with `sandbox down`)",
      }),
    );
  }

  async start(): Promise<SandboxStatus> {
    return await this.status();
  }

  execStream(argv: readonly string[], options: ExecOptions = {}): ExecStream {
    const child = this.spawn(argv, options);
    return execStreamOf(child, async () => outcomeOf(await child.finished, options.timeoutMs));
  }

  execBytes(argv: readonly string[], options: ExecOptions = {}): ExecBytes {
    const child = this.spawn(argv, options);
    const outcome = child.finished.then((ended) => outcomeOf(ended, options.timeoutMs));
    return execBytesOf(child, outcome);
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    const child = this.spawn(argv, options);
    const [stdout, ended] = await Promise.all([
      new Response(child.stdout).text(),
      child.finished,
    ]);
    // stderr: its last 8 KiB (the tail the exec keeps).
    if (ended.aborted) throw new SandboxError("interrupted", "Command interrupted");
    return {
      exitCode: ended.exitCode,
      stdout,
      stderr: ended.stderrTail,
      durationMs: ended.durationMs,
      timedOut: ended.timedOut,
      oomKilled: !ended.timedOut && ended.exitCode === 137,
    };
  }

  async readFile(path: string, options: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const child = this.spawn(readFileArgv(path), options);
    const [bytes, ended] = await Promise.all([
      new Response(child.stdout).arrayBuffer(),
      child.finished,
    ]);
    if (ended.exitCode === NO_SUCH_FILE_EXIT) throw fileNotFound(path, `pod "${this.podName}"`);
    if (ended.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot read "${path}" in pod "${this.podName}": ${ended.stderrTail.trim()}`,
      );
    }
    return new Uint8Array(bytes);
  }

  async writeFile(
    path: string,
    data: Uint8Array | string,
    options: { mode?: number; signal?: AbortSignal } = {},
  ): Promise<void> {
    assertNoSecrets(`pod "${this.podName}"`, { file: { path, data } });
    const mode = (options.mode ?? 0o600).toString(8);
    const result = await this.exec(
      ["sh", "-c", 'umask 077 && mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"']
        .concat("sh", path, mode),
      { stdin: data, signal: options.signal },
    );
    if (result.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot write "${path}" in pod "${this.podName}": ${result.stderr.trim()}`,
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
    const tar = spawn(["tar", "-c", "-C", hostPath, "."], { signal: options.signal });
    const result = await this.exec(
      ["sh", "-c", 'mkdir -p "$1" && tar -x --no-same-owner --no-same-permissions -C "$1"', "sh"]
        .concat(sandboxPath),
      { stdin: tar.stdout, signal: options.signal },
    );
    const packed = await tar.finished;
    if (packed.exitCode !== 0 || result.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot copy "${hostPath}" into pod "${this.podName}": ${
          (packed.stderrTail || result.stderr).trim()
        }`,
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
      await Deno.writeFile(hostPath, await this.readFile(sandboxPath, options), { mode: 0o600 });
      return;
    }
    await Deno.mkdir(hostPath, { recursive: true });
    // Its entries by name (no "./", which names the destination itself).
    const child = this.spawn([
      "sh",
      "-c",
      `find "$1" -mindepth 1 -maxdepth 1 -printf '%P\\0' | tar -c -C "$1" --null -T -`,
      "sh",
      sandboxPath,
    ], options);
    // What comes out of a sandbox is the agent's: extracted by the strict extractor only.
    await extractTar(child.stdout, hostPath, {
      what: `Cannot copy "${sandboxPath}" out of pod "${this.podName}"`,
    });
    const ended = await child.finished;
    if (ended.exitCode !== 0) {
      throw new SandboxError(
        "exec_failed",
        `Cannot copy "${sandboxPath}" out of pod "${this.podName}": ${ended.stderrTail.trim()}`,
      );
    }
  }

  /** Memory and processes from the sandbox container's own cgroup; no CPU figure. */
  async stats(options: { signal?: AbortSignal } = {}): Promise<SandboxStats> {
    const read = await this.exec([
      "cat",
      "/sys/fs/cgroup/memory.current",
      "/sys/fs/cgroup/memory.max",
      "/sys/fs/cgroup/pids.current",
      "/sys/fs/cgroup/pids.max",
    ], options);
    const [memory, memoryMax, pids, pidsMax] = read.stdout.trim().split("\n").map((line) =>
      /^\d+$/.test(line) ? Number(line) : 0
    );
    return {
      profile: this.profile,
      name: this.podName,
      memoryBytes: memory ?? 0,
      memoryLimitBytes: memoryMax ?? 0,
      cpuPercent: 0,
      pids: pids ?? 0,
      pidsLimit: pidsMax ?? 0,
    };
  }

  async status(): Promise<SandboxStatus> {
    let pod: V1Pod | undefined;
    try {
      pod = await this.cluster.core.readNamespacedPod({
        name: this.podName,
        namespace: this.cluster.namespace,
      });
    } catch (error) {
      if (!isNotFound(error)) throw clusterError(this.cluster, `read pod "${this.podName}"`, error);
    }
    return podStatus(this.profile, this.podName, pod);
  }

  async healthCheck(options: { signal?: AbortSignal } = {}): Promise<boolean> {
    // An API server that cannot be reached answers the same as a pod that cannot run: not healthy.
    const result = await this.exec(["true"], { ...options, timeoutMs: 30_000 }).catch(() =>
      undefined
    );
    return result?.exitCode === 0;
  }

  async teardown(): Promise<TeardownReport> {
    const removed = await deletePod(this.cluster, this.podName);
    return { containers: removed ? [this.podName] : [], networks: [], volumes: [] };
  }
}

/** Delete pod `name` at once; false when it was already gone. */
export async function deletePod(cluster: Cluster, name: string): Promise<boolean> {
  try {
    await cluster.core.deleteNamespacedPod({
      name,
      namespace: cluster.namespace,
      gracePeriodSeconds: 0,
    });
    return true;
  } catch (error) {
    if (isNotFound(error)) return false;
    throw clusterError(cluster, `delete pod "${name}"`, error);
  }
}

const PHASES: Record<string, SandboxState> = {
  Pending: "created",
  Running: "running",
  Succeeded: "stopped",
  Failed: "dead",
};

/** A pod (or its absence) as the seam's `SandboxStatus`. */
export function podStatus(profile: string, name: string, pod: V1Pod | undefined): SandboxStatus {
  const running = pod?.status?.containerStatuses?.find((c) => c.name === SANDBOX_CONTAINER);
  const labels = pod?.metadata?.labels ?? {};
  return {
    profile,
    name,
    id: pod?.metadata?.uid ?? "",
    image: pod?.spec?.containers?.[0]?.image ?? "",
    state: pod ? PHASES[pod.status?.phase ?? ""] ?? "created" : "missing",
    health: running?.ready ? "healthy" : pod ? "starting" : "unknown",
    createdAt: pod?.metadata?.creationTimestamp
      ? new Date(pod.metadata.creationTimestamp).toISOString()
      : "",
    startedAt: pod?.status?.startTime ? new Date(pod.status.startTime).toISOString() : null,
    stoppedAt: null,
    workspacePath: WORKSPACE_DIR,
    current: true,
    // A pooled pod: ours labelled ready, or agent-sandbox's warm one (no state, no claim yet).
    kind: labels[LABELS.state] === "ready" ||
        (!labels[LABELS.state] && !labels["agents.x-k8s.io/claim-uid"])
      ? "pool"
      : "run",
    repo: null,
  };
}
