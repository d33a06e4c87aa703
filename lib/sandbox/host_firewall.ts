/**
 * The host side of network isolation: what a sandbox may reach on the host itself.
 *
 * An `--internal` Docker network has no route out, but the host's own address on that network
 * (the gateway) is reachable, and with it every host service listening on all interfaces. So each
 * sandbox bridge gets an INPUT chain that accepts only the ports of the proxies serving it and
 * rejects the rest. Rules are tagged with the owning process id; rules of dead processes and chains
 * of removed bridges are pruned. This needs root: without it, isolation fails closed.
 */
import { SandboxError } from "../errors.ts";
import { withHostLock } from "../lock.ts";
import { isProcessAlive, run } from "../process.ts";

const CHAIN_PREFIX = "SBX-";
const TAG_PREFIX = "sandbox-pid-";

export interface FirewallOpening extends AsyncDisposable {
  close(): Promise<void>;
}

export interface BridgeIsolation {
  /** Host interface of the sandbox network, e.g. "br-0123456789ab". */
  bridge: string;
  /** The host's address on that network, where the proxies listen. */
  gateway: string;
  /** TCP ports on `gateway` the sandbox may reach. */
  ports: number[];
  /** Which program manages iptables (tests may point it elsewhere). */
  iptables?: string;
}

/** Can this process manage the host firewall? */
export async function firewallAvailable(iptables = "iptables"): Promise<boolean> {
  if (Deno.uid() !== 0) return false;
  try {
    return (await run([iptables, "-w", "-L", "INPUT", "-n"], { timeoutMs: 10_000 })).exitCode === 0;
  } catch {
    return false;
  }
}

async function iptables(program: string, args: string[]): Promise<{ ok: boolean; stdout: string; stderr: string }> {
  const result = await run([program, "-w", ...args], { timeoutMs: 30_000 });
  return { ok: result.exitCode === 0, stdout: result.stdout, stderr: result.stderr };
}

async function must(program: string, args: string[]): Promise<void> {
  const result = await iptables(program, args);
  if (!result.ok) {
    throw new SandboxError("docker_failed", `Cannot update the host firewall: iptables ${args.join(" ")}`, {
      detail: result.stderr.trim(),
    });
  }
}

/**
 * Let the sandbox behind `bridge` reach `gateway` on `ports`, and nothing else on the host, until
 * the returned opening is closed.
 */
export async function openProxyPorts(isolation: BridgeIsolation): Promise<FirewallOpening> {
  const program = isolation.iptables ?? "iptables";
  if (!await firewallAvailable(program)) {
    throw new SandboxError(
      "unsupported",
      `Cannot isolate sandbox network "${isolation.bridge}" from host services: managing the host firewall (iptables) needs root`,
      { detail: "Run sandbox as root, or choose network mode full (no isolation) for this profile" },
    );
  }
  const chain = `${CHAIN_PREFIX}${isolation.bridge}`;
  const tag = `${TAG_PREFIX}${Deno.pid}`;
  const rules = isolation.ports.map((port) => [
    "-p", "tcp", "-d", `${isolation.gateway}/32`, "-m", "tcp", "--dport", String(port),
    "-m", "comment", "--comment", tag, "-j", "ACCEPT",
  ]);
  await withHostLock("firewall", async () => {
    if (!(await iptables(program, ["-S", chain])).ok) {
      await must(program, ["-N", chain]);
      await must(program, ["-A", chain, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"]);
      await must(program, ["-A", chain, "-j", "DROP"]);
    }
    if (!(await iptables(program, ["-C", "INPUT", "-i", isolation.bridge, "-j", chain])).ok) {
      await must(program, ["-I", "INPUT", "1", "-i", isolation.bridge, "-j", chain]);
    }
    await pruneDeadRules(program, chain);
    for (const rule of rules) await must(program, ["-I", chain, "1", ...rule]);
  });
  let closed: Promise<void> | undefined;
  const close = () =>
    closed ??= (async () => {
      for (const rule of rules) await iptables(program, ["-D", chain, ...rule]);
    })();
  return { close, [Symbol.asyncDispose]: close };
}

/** Delete the ACCEPT rules left by processes that no longer exist (crashed runs). */
async function pruneDeadRules(program: string, chain: string): Promise<void> {
  const listed = await iptables(program, ["-S", chain]);
  for (const line of listed.stdout.split("\n")) {
    const match = new RegExp(`--comment "?${TAG_PREFIX}(\\d+)"?`).exec(line);
    if (!match || await isProcessAlive(Number(match[1]))) continue;
    await iptables(program, ["-D", ...line.replace(/^-A /, "").replaceAll('"', "").split(" ")]);
  }
}


/** Remove the chains (and INPUT jumps) of sandbox bridges that no longer exist. Best effort. */
export async function pruneFirewall(program = "iptables"): Promise<string[]> {
  if (!await firewallAvailable(program)) return [];
  const removed: string[] = [];
  await withHostLock("firewall", async () => {
    const input = await iptables(program, ["-S", "INPUT"]);
    const chains = (await iptables(program, ["-S"])).stdout.split("\n")
      .filter((l) => l.startsWith(`-N ${CHAIN_PREFIX}`)).map((l) => l.slice(3).trim());
    for (const chain of chains) {
      const bridge = chain.slice(CHAIN_PREFIX.length);
      if (await exists(`/sys/class/net/${bridge}`)) continue;
      for (const line of input.stdout.split("\n").filter((l) => l.endsWith(`-j ${chain}`))) {
        await iptables(program, ["-D", ...line.replace(/^-A /, "").split(" ")]);
      }
      await iptables(program, ["-F", chain]);
      if ((await iptables(program, ["-X", chain])).ok) removed.push(chain);
    }
  });
  return removed;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}
