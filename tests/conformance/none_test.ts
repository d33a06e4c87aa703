/**
 * The provider contract (_contract.ts) against mode none (lib/sandbox/host_provider.ts): commands
 * on this machine. It is not isolated and says so, so the isolation tests are not registered for
 * it: a timeout stops the command but not what it started in a session of its own, an acquire
 * sees what an earlier one left, and there is nothing to release. It declares none of the
 * isolation items held, and the contract checks that each is indeed not.
 */
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { profileFrom, uniqueProfile } from "../_helpers.ts";
import { type ConformanceSubject, providerContract } from "./_contract.ts";
import { loopback, PIDS_YAML } from "./_holds.ts";

async function openNone(): Promise<ConformanceSubject> {
  const name = uniqueProfile("conformance");
  const profile = profileFrom(
    `profiles:\n  ${name}:\n    sandbox: {mode: none, ${PIDS_YAML}}\n`,
    name,
  );
  const dirs: string[] = [];
  return {
    lifecycle: await sandboxLifecycle(profile),
    profile,
    hostAddress: loopback,
    async scratch() {
      const dir = await Deno.makeTempDir({ prefix: "sandbox-conformance-" });
      dirs.push(dir);
      return dir;
    },
    async [Symbol.asyncDispose]() {
      for (const dir of dirs) await Deno.remove(dir, { recursive: true });
    },
  };
}

const HOST = "commands run on this machine, as this process's user";

providerContract({
  name: "none",
  isolated: false,
  holds: {
    pidsLimit: { not: `${HOST}: no cgroup, no process limit` },
    noNetwork: { not: `${HOST}: this machine's network` },
    relay: { not: `${HOST}: the proxies are reached directly` },
    keyAbsent: { not: `${HOST}: the process holding the key is theirs to read` },
  },
  open: openNone,
});
