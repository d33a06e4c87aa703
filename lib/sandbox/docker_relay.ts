/**
 * The Docker implementation of the seam's relay transport (provider.ts): the relay started with
 * `docker exec` under the exec wrapper, as the relay's own uid, and the container's mounted
 * socket directory (proxy_mount.ts) where it has one. Chosen by providers.ts.
 */
import { relayArgv, type RelayProcess, spawnRelayProcess } from "../proxy/relay_host.ts";
import { execEnvByName } from "./docker_env.ts";
import { type DockerSandboxProvider, RELAY_USER } from "./docker_provider.ts";
import { prepareProxyMountSource, PROXY_MOUNT_PATH } from "./proxy_mount.ts";
import type { SandboxRelayTransport } from "./provider.ts";

/** The relay transport of `provider`'s container. */
export class DockerRelayTransport implements SandboxRelayTransport {
  constructor(readonly provider: DockerSandboxProvider) {}

  get sandboxName(): string {
    return this.provider.containerName;
  }

  launchRelay(relayArgs: readonly string[], runId?: string | null): RelayProcess {
    const provider = this.provider;
    // A run's relay is named after the run (its exec id, in traces and `ps`).
    const id = runId ? `relay-${runId}-${crypto.randomUUID()}` : `relay-${crypto.randomUUID()}`;
    return spawnRelayProcess([
      provider.docker.program,
      "exec",
      "--interactive",
      "--user",
      RELAY_USER,
      // (Its Deno cache is the image's, read-only: scripts/sandbox-exec.)
      provider.containerName,
      "sandbox-exec",
      id,
      ...relayArgv(relayArgs),
    ], {
      kill: () => provider.stopExec(id),
      // As every docker call: through the engine's API where it may (lib/sandbox/docker.ts).
      spawn: (argv, options) => provider.docker.spawn(argv.slice(1), options),
    });
  }

  async startDetachedRelay(
    id: string,
    relayArgs: readonly string[],
    env: Record<string, string>,
  ): Promise<{ exec?: string } | undefined> {
    // Values by name from the client's environment, never on a command line (`ps`).
    const byName = execEnvByName(env);
    const started = await this.provider.docker.run([
      "exec",
      "--detach",
      "--user",
      RELAY_USER,
      ...byName.args,
      this.provider.containerName,
      "sandbox-exec",
      id,
      ...relayArgv(relayArgs),
    ], { env: byName.clientEnv, timeoutMs: 30_000 }).catch(() => undefined);
    // A relay that cannot be started is reported as none: the caller goes without it.
    if (!started || started.exitCode !== 0) return undefined;
    const exec = started.stdout.trim();
    return /^[0-9a-f]{64}$/.test(exec) ? { exec } : {};
  }

  stopRelay(id: string): Promise<void> {
    return this.provider.stopExec(id);
  }

  async socketMount(
    options: { confirm?: boolean; signal?: AbortSignal } = {},
  ): Promise<{ host: string; sandbox: string } | undefined> {
    // An inspect that fails says nothing about the mount: treated as none (the stream still works).
    if (options.confirm && !await this.provider.hasProxyMount(options.signal).catch(() => false)) {
      return undefined;
    }
    // A directory that cannot be made (a path too long, /tmp not ours) leaves the stream.
    const host = await prepareProxyMountSource(this.provider.containerName).catch(() => undefined);
    return host === undefined ? undefined : { host, sandbox: PROXY_MOUNT_PATH };
  }
}
