/**
 * The provider contract (_contract.ts) against the Docker implementation (mode container): its
 * lifecycle over the warm pool (`sandbox.pool: 1`, so that acquires claim pooled containers),
 * in a state directory and under a profile of the test's own.
 */
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { proxyMountSource } from "../../lib/sandbox/proxy_mount.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  profileFrom,
  removeProfile,
  uniqueProfile,
} from "../_helpers.ts";
import { type ConformanceSubject, providerContract } from "./_contract.ts";
import { bridgeGateway, PIDS_YAML } from "./_holds.ts";

console.error("conformance: docker provider tests starting");

/** The files under `dir` (recursively) whose name starts with `prefix`. */
async function filesNamed(dir: string, prefix: string): Promise<string[]> {
  const found: string[] = [];
  try {
    for await (const entry of Deno.readDir(dir)) {
      const path = `${dir}/${entry.name}`;
      if (entry.name.startsWith(prefix)) found.push(path);
      if (entry.isDirectory) found.push(...await filesNamed(path, prefix));
    }
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  return found;
}

async function exists(path: string): Promise<boolean> {
  return await Deno.lstat(path).then(() => true, () => false);
}

async function openDocker(): Promise<ConformanceSubject> {
  assertDocker();
  const state = await Deno.makeTempDir({ prefix: "sandbox-conformance-state-" });
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state);
  const name = uniqueProfile("conformance");
  const profile = profileFrom(
    `profiles:\n  ${name}:\n    sandbox: {pool: 1, ${PIDS_YAML}}\n`,
    name,
  );
  return {
    lifecycle: await sandboxLifecycle(profile),
    profile,
    hostAddress: bridgeGateway,
    scratch: () => Promise.resolve("/workspace"),
    writable: ["/workspace", "/tmp", "/home/sandbox"],
    async traces(container) {
      const label = `label=dev.sandbox.profile=${name}`;
      const lines = (text: string) => text.split("\n").filter(Boolean);
      const containers = lines(
        await docker("ps", "-a", "--filter", label, "--format", "{{.Names}}"),
      ).filter((each) => each === container).map((each) => `container ${each}`);
      const volumes = lines(
        await docker("volume", "ls", "--filter", label, "--format", "{{.Name}}"),
      ).filter((each) => each.startsWith(container)).map((each) => `volume ${each}`);
      const mount = await proxyMountSource(container);
      return [
        ...containers,
        ...volumes,
        ...(await exists(mount) ? [`socket directory ${mount}`] : []),
        ...(await filesNamed(state, container)).map((path) => `record ${path}`),
      ];
    },
    async [Symbol.asyncDispose]() {
      // Whatever a failed test left of this profile: its containers and volumes, by label.
      await removeProfile(name);
      // The parent of this state directory's mounted socket directories (its own, by hash).
      const parent = (await proxyMountSource("conformance")).replace(/\/[^/]*$/, "");
      await Deno.remove(parent, { recursive: true }).catch((error) => {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      });
      if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
      else Deno.env.set("XDG_STATE_HOME", previous);
      await Deno.remove(state, { recursive: true });
    },
  };
}

providerContract({
  name: "docker",
  isolated: true,
  holds: { pidsLimit: true, noNetwork: true, relay: true, keyAbsent: true },
  testOptions: dockerTest(),
  open: openDocker,
});
