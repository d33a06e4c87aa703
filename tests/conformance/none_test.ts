/**
 * The provider contract (_contract.ts) against mode none (lib/sandbox/host_provider.ts): commands
 * on this machine. It is not isolated and says so, so the isolation tests are not registered for
 * it: a timeout stops the command but not what it started in a session of its own, an acquire
 * sees what an earlier one left, and there is nothing to release.
 */
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { profileFrom, uniqueProfile } from "../_helpers.ts";
import { type ConformanceSubject, providerContract } from "./_contract.ts";

async function openNone(): Promise<ConformanceSubject> {
  const name = uniqueProfile("conformance");
  const profile = profileFrom(`profiles:\n  ${name}:\n    sandbox: {mode: none}\n`, name);
  const dirs: string[] = [];
  return {
    lifecycle: await sandboxLifecycle(profile),
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

providerContract({ name: "none", isolated: false, open: openNone });
