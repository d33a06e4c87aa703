/**
 * The provider contract (_contract.ts) against sandbox mode local (lib/sandbox/local/): bubblewrap
 * sandboxes made for each acquire, in a state directory and under a profile of the test's own.
 */
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { profileFrom, uniqueProfile } from "../_helpers.ts";
import { assertLocal, localTest } from "../_local.ts";
import { type ConformanceSubject, providerContract } from "./_contract.ts";
import { loopback, PIDS_YAML } from "./_holds.ts";

async function openLocal(): Promise<ConformanceSubject> {
  assertLocal();
  const state = await Deno.makeTempDir({ prefix: "sandbox-conformance-state-" });
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state);
  const name = uniqueProfile("conformance");
  const profile = profileFrom(
    `profiles:\n  ${name}:\n    sandbox: {mode: local, ${PIDS_YAML}}\n`,
    name,
  );
  return {
    lifecycle: await sandboxLifecycle(profile),
    profile,
    // Its network namespace has a loopback of its own: this machine's is what it must not reach.
    hostAddress: loopback,
    scratch: () => Promise.resolve("/workspace"),
    writable: ["/workspace", "/tmp", "/home/sandbox"],
    async traces(sandbox) {
      const dir = `${state}/sandbox/local/${sandbox}`;
      const cgroups = ["memory", "pids", "cpu"].map((c) =>
        `/sys/fs/cgroup/${c}/sandbox-local/${sandbox}`
      )
        .concat(`/sys/fs/cgroup/sandbox-local/${sandbox}`);
      const found: string[] = [];
      for (const path of [dir, ...cgroups]) {
        if (await Deno.lstat(path).then(() => true, () => false)) found.push(path);
      }
      return found;
    },
    async [Symbol.asyncDispose]() {
      if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
      else Deno.env.set("XDG_STATE_HOME", previous);
      await Deno.remove(state, { recursive: true });
    },
  };
}

providerContract({
  name: "local",
  isolated: true,
  holds: { pidsLimit: true, noNetwork: true, relay: true, keyAbsent: true },
  testOptions: localTest(),
  open: openLocal,
});
