/**
 * The provider contract (_contract.ts) against mode devcontainer: a repository of the test's own
 * whose devcontainer is built offline from sandbox-base:bookworm, opened (lib/sandbox/devcontainer/),
 * and its runs' sandboxes made by Docker's lifecycle on that image (_docker_subject.ts).
 * Everything holds, as in mode container: the devcontainer changes the image, not the hardening.
 */
import { openDevcontainer } from "../../lib/sandbox/devcontainer/provider.ts";
import { SOURCE_LABEL } from "../../lib/sandbox/devcontainer/image.ts";
import type { Profile } from "../../lib/config.ts";
import { dockerTest } from "../_helpers.ts";
import { commitFiles, git } from "../_devcontainer_fixture.ts";
import { providerContract } from "./_contract.ts";
import { openDockerSubject, type Opened } from "./_docker_subject.ts";
import { PIDS_YAML } from "./_holds.ts";

/** The images this process builds are its own (their content differs by it). */
const MARK = crypto.randomUUID().slice(0, 8);

/** The process's repository, made and committed once: its devcontainer is built by the first open. */
let repository: Promise<string> | undefined;

async function makeRepository(): Promise<string> {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "sandbox-conformance-dc-" }));
  // Synchronous: the end of the process is the end of the last test that opened the
  // devcontainer. The sandbox's layer on the devcontainer image first (listed newest first).
  globalThis.addEventListener("unload", () => {
    const label = `label=${SOURCE_LABEL}=${dir}/repo`;
    const listed = new Deno.Command("docker", { args: ["images", "-q", "--filter", label] })
      .outputSync();
    const ids = new TextDecoder().decode(listed.stdout).split("\n").filter(Boolean);
    for (const id of new Set(ids)) {
      new Deno.Command("docker", { args: ["image", "rm", "--force", id], stderr: "null" })
        .outputSync();
    }
    Deno.removeSync(dir, { recursive: true });
  });
  const repo = `${dir}/repo`;
  await Deno.mkdir(repo);
  await git(repo, "init", "-q", "-b", "main");
  await commitFiles(repo, {
    ".devcontainer/devcontainer.json": `{ "build": { "dockerfile": "Dockerfile" } }\n`,
    ".devcontainer/Dockerfile":
      `FROM sandbox-base:bookworm\nRUN echo "conformance ${MARK}" > /etc/dc-conformance\n`,
  }, "a devcontainer");
  return repo;
}

/** The profile the repository's devcontainer opens to (built by the first test, then reused). */
async function openRepository(profile: Profile): Promise<Opened> {
  repository ??= makeRepository();
  const devcontainer = await openDevcontainer(profile, { repo: await repository });
  return { profile: devcontainer.profile };
}

providerContract({
  name: "devcontainer",
  isolated: true,
  holds: { pidsLimit: true, noNetwork: true, relay: true, keyAbsent: true },
  testOptions: dockerTest(),
  open: () => openDockerSubject(`{mode: devcontainer, pool: 1, ${PIDS_YAML}}`, openRepository),
});
