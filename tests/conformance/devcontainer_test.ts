/**
 * The provider contract (_contract.ts) against mode devcontainer: a repository of the test's own
 * whose devcontainer is built offline from sandbox-base:bookworm, opened (lib/sandbox/devcontainer/),
 * and its runs' sandboxes made by Docker's lifecycle on that image (_docker_subject.ts).
 * Everything holds, as in mode container: the devcontainer changes the image, not the hardening.
 */
import { run } from "../../lib/process.ts";
import { openDevcontainer } from "../../lib/sandbox/devcontainer/provider.ts";
import { SOURCE_LABEL } from "../../lib/sandbox/devcontainer/image.ts";
import type { Profile } from "../../lib/config.ts";
import { docker, dockerTest } from "../_helpers.ts";
import { commitFiles, git } from "../_devcontainer_fixture.ts";
import { providerContract } from "./_contract.ts";
import { openDockerSubject, type Opened } from "./_docker_subject.ts";
import { PIDS_YAML } from "./_holds.ts";

console.error("conformance: devcontainer provider tests starting");

/** The images this process builds are its own (their content differs by it). */
const MARK = crypto.randomUUID().slice(0, 8);

/** A repository whose devcontainer is built from a Dockerfile, and the profile it opens to. */
async function openRepository(profile: Profile): Promise<Opened> {
  const dir = await Deno.makeTempDir({ prefix: "sandbox-conformance-dc-" });
  try {
    const repo = `${await Deno.realPath(dir)}/repo`;
    await Deno.mkdir(repo);
    await git(repo, "init", "-q", "-b", "main");
    await commitFiles(repo, {
      ".devcontainer/devcontainer.json": `{ "build": { "dockerfile": "Dockerfile" } }\n`,
      ".devcontainer/Dockerfile":
        `FROM sandbox-base:bookworm\nRUN echo "conformance ${MARK}" > /etc/dc-conformance\n`,
    }, "a devcontainer");
    const devcontainer = await openDevcontainer(profile, { repo });
    return {
      profile: devcontainer.profile,
      async close() {
        // The sandbox's layer on the devcontainer image first (newest first), then that image.
        const label = `label=${SOURCE_LABEL}=${repo}`;
        const images = (await docker("images", "-q", "--filter", label)).split("\n");
        for (const id of images.filter(Boolean)) {
          await run(["docker", "image", "rm", "--force", id]);
        }
        await Deno.remove(dir, { recursive: true });
      },
    };
  } catch (error) {
    await Deno.remove(dir, { recursive: true });
    throw error;
  }
}

providerContract({
  name: "devcontainer",
  isolated: true,
  holds: { pidsLimit: true, noNetwork: true, relay: true, keyAbsent: true },
  testOptions: dockerTest(),
  open: () => openDockerSubject(`{mode: devcontainer, pool: 1, ${PIDS_YAML}}`, openRepository),
});
