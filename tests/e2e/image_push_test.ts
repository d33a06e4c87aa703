/**
 * `sandbox image push` against a real registry: Debian's `docker-registry`, started by the test on a
 * loopback port with its own configuration and storage (the engine pushes plain HTTP to 127.0.0.0/8
 * without configuration). What was pushed is read back from the registry's own API: the catalog, the
 * tags, and the manifest's digest, which must be the local image's. Bad registries give their exit
 * code and one line. The test removes only what it made: its registry process and storage, and the
 * exact tags the push created.
 */
import assert from "node:assert/strict";
import { spawn } from "../../lib/process.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  runCli,
  tempDir,
  writeConfig,
} from "../_helpers.ts";

const REGISTRY_BINARY = "/usr/bin/docker-registry";

interface Pushed {
  image: string;
  reference: string;
  digest: string;
}

/** A port nothing listens on (taken from the kernel, then released). */
function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** The registry, serving on loopback from `dir`; stopped (the process only) on dispose. */
async function startRegistry(dir: string): Promise<AsyncDisposable & { address: string }> {
  const port = freePort();
  const config = `${dir}/registry.yml`;
  await Deno.writeTextFile(
    config,
    `version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: ${dir}/store\n` +
      `http:\n  addr: 127.0.0.1:${port}\n`,
  );
  const child = spawn([REGISTRY_BINARY, "serve", config]);
  const address = `127.0.0.1:${port}`;
  // Ready when its API answers; the catalog of an empty registry is an empty list.
  for (let attempt = 0;; attempt++) {
    const answer = await fetch(`http://${address}/v2/`).catch((error) => error as Error);
    if (answer instanceof Response) {
      await answer.body?.cancel();
      break;
    }
    if (attempt > 200) throw new Error(`the registry did not come up on ${address}: ${answer}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return {
    address,
    async [Symbol.asyncDispose]() {
      child.kill();
      await child.finished;
    },
  };
}

async function registryJson(address: string, path: string): Promise<Record<string, string[]>> {
  const response = await fetch(`http://${address}/v2/${path}`);
  assert.equal(response.status, 200, `GET /v2/${path}`);
  return await response.json();
}

/** The digest the registry serves for `name:tag`'s manifest. */
async function manifestDigest(address: string, name: string, tag: string): Promise<string> {
  const response = await fetch(`http://${address}/v2/${name}/manifests/${tag}`, {
    method: "HEAD",
    headers: {
      accept: "application/vnd.docker.distribution.manifest.v2+json, " +
        "application/vnd.oci.image.manifest.v1+json",
    },
  });
  assert.equal(response.status, 200, `HEAD ${name}:${tag}`);
  return response.headers.get("docker-content-digest") ?? "";
}

Deno.test({
  name: "image push puts the sandbox image and its built agent layers in the registry, by digest",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir("sandbox-push-");
    await using registry = await startRegistry(dir.path);
    const config = await writeConfig(dir.path, "profiles:\n  pushed: {}\n");
    const target = `${registry.address}/push-test`;
    const result = await runCli(["image", "push", "--registry", target, "-p", "pushed", "--json"], {
      config,
    });
    const output = result.exitCode === 0 ? JSON.parse(result.stdout) : undefined;
    const pushed: Pushed[] = output?.images ?? [];
    try {
      assert.equal(result.exitCode, 0, explain(result));
      assert.match(pushed[0].image, /^sandbox-runtime:[0-9a-f]+$/);
      assert.match(result.stderr, /Pushed .*sandbox-runtime/, "progress goes to stderr");
      const catalog = await registryJson(registry.address, "_catalog");
      for (const each of pushed) {
        assert.equal(each.reference, `${target}/${each.image}`);
        const [name, tag] = each.image.split(":");
        assert.ok(catalog.repositories.includes(`push-test/${name}`), JSON.stringify(catalog));
        const tags = await registryJson(registry.address, `push-test/${name}/tags/list`);
        assert.ok(tags.tags.includes(tag), JSON.stringify(tags));
        assert.equal(await manifestDigest(registry.address, `push-test/${name}`, tag), each.digest);
        // The local image is the one pushed: the engine recorded the same digest for it.
        const repoDigests = JSON.parse(
          await docker("image", "inspect", "--format", "{{json .RepoDigests}}", each.image),
        );
        assert.ok(repoDigests.includes(`${target}/${name}@${each.digest}`), repoDigests.join());
      }
    } finally {
      for (const each of pushed) await docker("rmi", each.reference);
    }
  },
});

/** The local tags under `address/`. */
async function tagsUnder(address: string): Promise<string[]> {
  return (await docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}"))
    .split("\n").filter((tag) => tag.startsWith(`${address}/`));
}

Deno.test({
  name: "image push to a registry nobody listens on exits 125 with one line naming it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir("sandbox-push-");
    const config = await writeConfig(dir.path, "profiles:\n  pushed: {}\n");
    const address = `127.0.0.1:${freePort()}`;
    const result = await runCli(["image", "push", "--registry", address, "-p", "pushed"], {
      config,
    });
    try {
      assert.equal(result.exitCode, 125, explain(result));
      const errors = result.stderr.split("\n").filter((line) => line.startsWith("sandbox: error"));
      assert.equal(errors.length, 1, explain(result));
      assert.match(errors[0], new RegExp(`Registry ${address} is unreachable`));
      assert.doesNotMatch(result.stderr, /^\s+at /m, "no stack trace");
      assert.equal(result.stdout, "");
      assert.deepEqual(await tagsUnder(address), [], "the failed push removes the tag it made");
    } finally {
      // Should the tool have left it: the tag the attempt made, `ADDRESS/sandbox-runtime:<hash>`.
      for (const tag of await tagsUnder(address)) await docker("rmi", tag);
    }
  },
});

Deno.test("image push refuses a malformed registry with exit 2 and one line", async () => {
  await using dir = await tempDir("sandbox-push-");
  const config = await writeConfig(dir.path, "profiles:\n  pushed: {}\n");
  for (const registry of ["http://127.0.0.1:5000", "Bad Host!", "team", "127.0.0.1:99999"]) {
    const result = await runCli(["image", "push", "--registry", registry, "-p", "pushed"], {
      config,
    });
    assert.equal(result.exitCode, 2, explain(result));
    const lines = result.stderr.trimEnd().split("\n");
    assert.equal(lines.length, 1, explain(result));
    assert.match(lines[0], /^sandbox: .*--registry ".*" is not a registry: /);
  }
});
