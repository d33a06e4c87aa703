/**
 * What older versions left on the host and no version creates any more: `SBX-<bridge>` iptables
 * chains (with their jumps from INPUT) that kept sandboxes on per-profile Docker networks away
 * from host ports. Sandboxes have no network at all, so nothing needs them.
 *
 * Best effort and never required: only a root process can see them, so for anyone else (and
 * where iptables is missing) this does nothing. A chain whose bridge still exists is left alone:
 * a process of an older version may still be using it.
 */
import { withHostLock } from "../lock.ts";
import { run } from "../process.ts";
import { pathExists } from "../paths.ts";

const CHAIN_PREFIX = "SBX-";

/** Remove the legacy chains of bridges that no longer exist; the names of those removed. */
export async function removeLegacyFirewall(program = "iptables"): Promise<string[]> {
  if (Deno.uid() !== 0) return [];
  const iptables = async (args: string[]) => {
    try {
      return await run([program, "-w", ...args], { timeoutMs: 30_000 });
    } catch {
      return undefined; // iptables is not installed
    }
  };
  const listed = await iptables(["-S"]);
  if (listed?.exitCode !== 0) return [];
  const chains = listed.stdout.split("\n").filter((l) => l.startsWith(`-N ${CHAIN_PREFIX}`)).map((
    l,
  ) => l.slice(3).trim());
  if (chains.length === 0) return [];
  const removed: string[] = [];
  await withHostLock("firewall", async () => {
    const input = (await iptables(["-S", "INPUT"]))?.stdout ?? "";
    for (const chain of chains) {
      if (await pathExists(`/sys/class/net/${chain.slice(CHAIN_PREFIX.length)}`)) continue;
      for (const line of input.split("\n").filter((l) => l.endsWith(`-j ${chain}`))) {
        await iptables(["-D", ...line.replace(/^-A /, "").split(" ")]);
      }
      await iptables(["-F", chain]);
      if ((await iptables(["-X", chain]))?.exitCode === 0) removed.push(chain);
    }
  });
  return removed;
}
