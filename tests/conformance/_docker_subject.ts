/**
 * A conformance subject over Docker's lifecycle (mode container, and mode devcontainer, whose
 * opened devcontainer is a mode-container profile on its own image): a state directory and a
 * profile of the test's own, the warm pool of `sandbox.pool: 1` (so that acquires claim pooled
 * containers), and what a container leaves (its container, volumes, socket directory, records).
 */
import type { Profile } from "../../lib/config.ts";
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { proxyMountSource } from "../../lib/sandbox/proxy_mount.ts";
import { assertDocker, docker, profileFrom, removeProfile, uniqueProfile } from "../_helpers.ts";
import type { ConformanceSubject } from "./_contract.ts";
import { bridgeGateway } from "./_holds.ts";

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

/** What opening a profile for Docker's lifecycle gave: the profile it uses, and its undoing. */
export interface Opened {
  profile: Profile;
  close?(): Promise<void>;
}

/**
 * A subject whose profile's `sandbox:` is `sandboxYaml` (a YAML flow mapping), made ready for
 * Docker's lifecycle by `open` (mode container needs nothing).
 */
export async function openDockerSubject(
  sandboxYaml: string,
  open: (profile: Profile) => Promise<Opened> = (profile) => Promise.resolve({ profile }),
): Promise<ConformanceSubject> {
  assertDocker();
  const state = await Deno.makeTempDir({ prefix: "sandbox-conformance-state-" });
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state);
  const name = uniqueProfile("conformance");
  const opened = await open(
    profileFrom(`profiles:\n  ${name}:\n    sandbox: ${sandboxYaml}\n`, name),
  );
  return {
    lifecycle: await sandboxLifecycle(opened.profile),
    profile: opened.profile,
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
      await opened.close?.();
      if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
      else Deno.env.set("XDG_STATE_HOME", previous);
      await Deno.remove(state, { recursive: true });
    },
  };
}
