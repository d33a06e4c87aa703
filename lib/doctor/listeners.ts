/**
 * The host services `sandbox doctor` attacks: an HTTP listener on the host's loopback (the egress
 * twin and the address guard's target, and the sandbox's own loopback must not lead to it), and one
 * on the gateway address of the engine's default bridge when that address is this host's (a local
 * engine): what a container with a network would reach. Each answers a nonce, so an answer is
 * known to come from here. They listen only while the doctor runs.
 */
import type { DockerCli } from "../sandbox/docker.ts";
import { randomHex } from "../hash.ts";

export interface HostListeners extends AsyncDisposable {
  readonly nonce: string;
  readonly loopbackPort: number;
  /** `address:port` of the listener on the bridge's gateway, when there is one. */
  readonly gatewayTarget: string | undefined;
  /** Targets the sandbox tries to reach directly. */
  readonly hostTargets: string[];
  close(): Promise<void>;
}

function listen(hostname: string, nonce: string): Deno.HttpServer<Deno.NetAddr> {
  return Deno.serve({ hostname, port: 0, onListen: () => {} }, () => new Response(`${nonce}\n`));
}

/** What `docker network inspect bridge` says of where this host is on the default bridge. */
export interface BridgeInspect {
  IPAM?: { Config?: { Subnet?: string; Gateway?: string }[] | null };
  Options?: Record<string, string> | null;
}

/**
 * This host's address on the engine's default bridge: the gateway the engine reports, or, when it
 * reports none (an engine that found its bridge's interface, docker0, already addressed leaves
 * the gateway out), that interface's IPv4 address. Undefined when neither is this host's.
 */
export function bridgeHostAddress(
  bridge: BridgeInspect,
  interfaces: Deno.NetworkInterfaceInfo[] = Deno.networkInterfaces(),
): string | undefined {
  const ipv4 = interfaces.filter((each) => each.family === "IPv4");
  const reported = (bridge.IPAM?.Config ?? []).map((config) => config.Gateway);
  const gateway = reported.find((address) => ipv4.some((each) => each.address === address));
  if (gateway) return gateway;
  const name = bridge.Options?.["com.docker.network.bridge.name"];
  return name === undefined ? undefined : ipv4.find((each) => each.name === name)?.address;
}

/** This host's address on the default bridge, when the engine has one this host owns. */
async function bridgeGateway(docker: DockerCli, signal?: AbortSignal): Promise<string | undefined> {
  const result = await docker.run(
    ["network", "inspect", "bridge", "--format", "{{json .}}"],
    { signal, timeoutMs: 30_000 },
  );
  if (result.exitCode !== 0) return undefined;
  return bridgeHostAddress(JSON.parse(result.stdout) as BridgeInspect);
}

export async function startListeners(
  docker: DockerCli,
  signal?: AbortSignal,
): Promise<HostListeners> {
  const nonce = `doctor-nonce-${randomHex(8)}`;
  const servers: Deno.HttpServer<Deno.NetAddr>[] = [listen("127.0.0.1", nonce)];
  const gateway = await bridgeGateway(docker, signal);
  let gatewayTarget: string | undefined;
  if (gateway) {
    const server = listen(gateway, nonce);
    servers.push(server);
    gatewayTarget = `${gateway}:${server.addr.port}`;
  }
  const loopbackPort = servers[0].addr.port;
  const close = async () => void await Promise.all(servers.map((s) => s.shutdown()));
  return {
    nonce,
    loopbackPort,
    gatewayTarget,
    hostTargets: [`127.0.0.1:${loopbackPort}`, ...(gatewayTarget ? [gatewayTarget] : [])],
    close,
    [Symbol.asyncDispose]: close,
  };
}

/**
 * The twin of "reach a host service": the same request from an ordinary container of the same
 * image on the default bridge, as the sandbox user. Its answer, or why there is none.
 */
export async function ordinaryReach(
  docker: DockerCli,
  image: string,
  target: string,
  signal?: AbortSignal,
): Promise<string> {
  const result = await docker.run([
    "run",
    "--rm",
    "--network",
    "bridge",
    "--user",
    "10001:10001",
    "--entrypoint",
    "curl",
    image,
    "-sS",
    "-m",
    "5",
    `http://${target}/`,
  ], { signal, timeoutMs: 60_000 });
  return (result.stdout + result.stderr).trim().slice(0, 200);
}
