/**
 * The agent CLIs' pinned npm tarballs for this machine's architecture, fetched into the tool's npm
 * cache (`npm_tarball.ts`) and checked against their pinned integrity: what the agents' image
 * layers and mode local unpack. `scripts/provision.sh` runs it, so that the tests find them there
 * and reach no registry themselves. A tarball already cached and whole is not fetched again.
 */
import { hostArchitecture } from "../lib/agents/host_agent.ts";
import { fetchTarball } from "../lib/agents/npm_tarball.ts";
import { AGENT_PACKAGES } from "../lib/agents/packages.ts";

const arch = hostArchitecture();
if (arch === undefined) {
  console.error(`provision: no pinned agent CLI build for architecture "${Deno.build.arch}"`);
} else {
  for (const pkg of Object.values(AGENT_PACKAGES)) {
    const path = await fetchTarball(pkg.tarballs[arch], {
      onProgress: (line) => console.error(`provision: ${line}`),
    });
    console.error(`provision: ${pkg.name} ${pkg.version} (${arch}) in ${path}`);
  }
}
