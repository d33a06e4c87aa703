/**
 * `sandbox doctor` on a profile in mode devcontainer checks the sandbox a run of it would really
 * get: the repository's devcontainer image (built from its committed Dockerfile) with the sandbox
 * layer on top, hardened as in mode container — not the profile's default image: the image it
 * names and ran is one built for the repository, holding what its Dockerfile wrote. A repository
 * without a devcontainer is refused as a user mistake before anything starts.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { assertDocker, dockerTest, explain } from "../_helpers.ts";
import { DevcontainerFixture } from "../_devcontainer_fixture.ts";

console.error("security: doctor (devcontainer) tests starting");

interface Report {
  mode: string;
  image: string | null;
  devcontainer?: { config: string; image: string };
  checks: { id: string; status: string }[];
  broken: string[];
}

async function imageId(ref: string): Promise<string> {
  const result = await run(["docker", "image", "inspect", "--format", "{{.Id}}", ref]);
  assert.equal(result.exitCode, 0, result.stderr);
  return result.stdout.trim();
}

Deno.test({
  name:
    "doctor on a devcontainer profile attacks a sandbox of the repository's devcontainer image, every defence HELD, exit 0",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const mark = `doctor-dc-${crypto.randomUUID()}`;
    await using fixture = await DevcontainerFixture.create("doc-dc", "http://127.0.0.1:9/v1", {
      ".devcontainer/devcontainer.json": `{ "build": { "dockerfile": "Dockerfile" } }\n`,
      ".devcontainer/Dockerfile": `FROM sandbox-base:bookworm\nRUN echo ${mark} > /etc/dc-mark\n`,
    });
    const result = await fixture.cli([
      "doctor",
      "-p",
      fixture.profile,
      "--json",
      "--repo",
      fixture.repo,
    ]);
    let report: Report | undefined;
    try {
      report = JSON.parse(result.stdout);
    } catch {
      assert.fail(`doctor printed no JSON report\n${explain(result)}`);
    }
    assert.equal(result.exitCode, 0, explain(result));
    assert.equal(report!.mode, "devcontainer");
    assert.deepEqual(report!.broken, []);
    for (const check of report!.checks) {
      assert.equal(check.status, check.id === "git_grant" ? "not_applicable" : "held", check.id);
    }
    assert.equal(report!.devcontainer?.config, ".devcontainer/devcontainer.json");
    // The image the doctor's sandbox ran was built for this repository, on its devcontainer image.
    const built = await fixture.images();
    assert.ok(report!.image, explain(result));
    assert.ok(
      built.includes(await imageId(report!.image!)),
      `${report!.image} is not this repository's`,
    );
    assert.ok(built.includes(await imageId(report!.devcontainer!.image)));
    const marked = await run([
      "docker",
      "run",
      "--rm",
      "--entrypoint",
      "cat",
      report!.image!,
      "/etc/dc-mark",
    ]);
    assert.equal(marked.stdout.trim(), mark, "the sandbox image is not the devcontainer's");
  },
});

Deno.test({
  name:
    "doctor on a devcontainer image without curl says the network defences are NOT APPLICABLE (the attack could not run), never BROKEN or HELD",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await DevcontainerFixture.create(
      "doc-dc-nocurl",
      "http://127.0.0.1:9/v1",
      {
        ".devcontainer/devcontainer.json": `{ "build": { "dockerfile": "Dockerfile" } }\n`,
        ".devcontainer/Dockerfile": `FROM sandbox-base:bookworm\nRUN rm /usr/bin/curl\n`,
      },
    );
    const result = await fixture.cli([
      "doctor",
      "-p",
      fixture.profile,
      "--json",
      "--repo",
      fixture.repo,
    ]);
    let report: Report | undefined;
    try {
      report = JSON.parse(result.stdout);
    } catch {
      assert.fail(`doctor printed no JSON report\n${explain(result)}`);
    }
    assert.equal(result.exitCode, 0, explain(result));
    const status = Object.fromEntries(report!.checks.map((c) => [c.id, c.status]));
    assert.deepEqual(status, {
      key: "held",
      host_service: "not_applicable",
      egress_allowlist: "not_applicable",
      address_guard: "not_applicable",
      escalation: "held",
      survivor: "held",
      disk: "held",
      git_grant: "not_applicable",
    }, explain(result));
  },
});

Deno.test({
  name:
    "doctor on a devcontainer profile whose repository has no devcontainer.json is a user mistake (exit 2), nothing started",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using fixture = await DevcontainerFixture.create(
      "doc-dc-norepo",
      "http://127.0.0.1:9/v1",
      {
        "README.md": "no devcontainer here\n",
      },
    );
    const result = await fixture.cli(["doctor", "-p", fixture.profile, "--repo", fixture.repo]);
    assert.equal(result.exitCode, 2, explain(result));
    assert.match(result.stderr, /^sandbox: /m);
    const left = await run([
      "docker",
      "ps",
      "-aq",
      "--filter",
      `label=dev.sandbox.profile=${fixture.profile}`,
    ]);
    assert.equal(left.stdout.trim(), "");
  },
});
