/**
 * The agent layer's package and image: a pinned tarball is fetched from a registry (a fake one on
 * 127.0.0.1 here), checked against its integrity before it is kept or used, and cached; a layer
 * that exists with the right content is used as is; a missing layer that cannot be built because
 * the registry is out of reach fails with an infrastructure error saying what is missing and how
 * to build it elsewhere. Docker is a fake script recording its argv.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  agentImageTagFor,
  agentLayerContentHash,
  ensureAgentImage,
} from "../../lib/agents/agent_image.ts";
import {
  cachedTarballName,
  displayRegistry,
  fetchTarball,
  npmRegistry,
  RegistryError,
} from "../../lib/agents/npm_tarball.ts";
import { AGENT_PACKAGES, type PlatformTarball } from "../../lib/agents/packages.ts";
import { exitCodeFor, SandboxError } from "../../lib/errors.ts";
import { run } from "../../lib/process.ts";
import { DockerCli } from "../../lib/sandbox/docker.ts";
import { tempDir } from "../_helpers.ts";
import { fakeDocker } from "./_fake_docker.ts";

/** A gzipped npm-style tarball (`package/...`) made with tar, and its integrity. */
async function makeTarball(
  dir: string,
): Promise<{ bytes: Uint8Array<ArrayBuffer>; integrity: string }> {
  await Deno.mkdir(`${dir}/src/package/bin`, { recursive: true });
  await Deno.writeTextFile(`${dir}/src/package/bin/agent`, "#!/bin/sh\necho agent\n");
  const made = await run(["tar", "-czf", `${dir}/pkg.tgz`, "-C", `${dir}/src`, "package"]);
  assert.equal(made.exitCode, 0, made.stderr);
  const bytes = await Deno.readFile(`${dir}/pkg.tgz`);
  return { bytes, integrity: `sha512-${createHash("sha512").update(bytes).digest("base64")}` };
}

/** A registry on 127.0.0.1 serving `body` at one path; it counts requests. */
function fakeRegistry(path: string, body: () => Uint8Array<ArrayBuffer> | null) {
  let requests = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    requests++;
    const bytes = body();
    if (new URL(req.url).pathname !== `/${path}` || bytes === null) {
      return new Response("not found", { status: 404 });
    }
    return new Response(bytes);
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    get requests() {
      return requests;
    },
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

/** A loopback URL where nothing listens (the port was free a moment ago). */
function deadRegistry(): string {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return `http://127.0.0.1:${port}`;
}

Deno.test("fetchTarball() downloads a pinned tarball once, checks it, and serves it from the cache after", async () => {
  await using dir = await tempDir("sandbox-npm-");
  const { bytes, integrity } = await makeTarball(dir.path);
  const tarball: PlatformTarball = {
    spec: "@x/agent-linux-x64@1.0.0",
    path: "@x/agent-linux-x64/-/agent-linux-x64-1.0.0.tgz",
    integrity,
    root: "package",
  };
  await using registry = fakeRegistry(tarball.path, () => bytes);
  const cacheDir = `${dir.path}/cache`;
  const path = await fetchTarball(tarball, { registry: registry.url, cacheDir });
  assert.equal(path, `${cacheDir}/${cachedTarballName(tarball)}`);
  assert.equal(
    cachedTarballName(tarball),
    "x-agent-linux-x64-1.0.0.tgz",
    "the name npm pack gives it",
  );
  assert.deepEqual(await Deno.readFile(path), bytes);
  assert.equal(registry.requests, 1);
  assert.equal(await fetchTarball(tarball, { registry: registry.url, cacheDir }), path);
  assert.equal(registry.requests, 1, "the second fetch came from the cache");

  // A cache file that no longer matches its pin (tampered, truncated) is fetched again.
  await Deno.writeTextFile(path, "tampered");
  assert.equal(await fetchTarball(tarball, { registry: registry.url, cacheDir }), path);
  assert.equal(registry.requests, 2);
  assert.deepEqual(await Deno.readFile(path), bytes);
});

Deno.test("fetchTarball() refuses a tarball that does not match its pin, and keeps nothing of it", async () => {
  await using dir = await tempDir("sandbox-npm-");
  const { bytes, integrity } = await makeTarball(dir.path);
  const tarball: PlatformTarball = {
    spec: "@x/agent@1.0.0",
    path: "@x/agent/-/agent-1.0.0.tgz",
    integrity,
    root: "package",
  };
  const altered = new Uint8Array(bytes);
  altered[altered.length - 1] ^= 0xff;
  await using registry = fakeRegistry(tarball.path, () => altered);
  const cacheDir = `${dir.path}/cache`;
  await assert.rejects(
    fetchTarball(tarball, { registry: registry.url, cacheDir }),
    (error: unknown) =>
      error instanceof SandboxError && !(error instanceof RegistryError) &&
      error.code === "image_build_failed" &&
      /does not match its pinned integrity/.test(error.message),
  );
  assert.deepEqual(
    [...Deno.readDirSync(cacheDir)],
    [],
    "no file, partial or whole, is left in the cache",
  );
});

Deno.test("fetchTarball() says which registry could not serve which package", async (t) => {
  await using dir = await tempDir("sandbox-npm-");
  const tarball: PlatformTarball = {
    spec: "@x/agent@1.0.0",
    path: "@x/agent/-/agent-1.0.0.tgz",
    integrity: "sha512-none",
    root: "package",
  };
  await t.step("nothing listens", async () => {
    const registry = deadRegistry();
    await assert.rejects(
      fetchTarball(tarball, { registry, cacheDir: `${dir.path}/a` }),
      (error: unknown) =>
        error instanceof RegistryError &&
        error.message.startsWith(`Cannot download @x/agent@1.0.0 from ${registry}: `),
    );
  });
  await t.step("the registry answers 404", async () => {
    await using registry = fakeRegistry(tarball.path, () => null);
    await assert.rejects(
      fetchTarball(tarball, { registry: registry.url, cacheDir: `${dir.path}/b` }),
      (error: unknown) => error instanceof RegistryError && /HTTP 404$/.test(error.message),
    );
  });
});

Deno.test("npmRegistry() follows npm_config_registry, and messages never show a mirror's credentials", () => {
  assert.equal(npmRegistry(() => undefined), "https://registry.npmjs.org");
  assert.equal(
    npmRegistry((n) => n === "npm_config_registry" ? "https://mirror.example/npm/" : undefined),
    "https://mirror.example/npm",
  );
  assert.equal(
    displayRegistry("https://user:s3cret@mirror.example/npm"),
    "https://mirror.example/npm",
  );
});

const BASE = "sandbox-runtime:0123456789abcdef";

Deno.test("ensureAgentImage() uses a layer that exists with the right content: no download, no build", async () => {
  const tag = await agentImageTagFor(BASE, "claude-code");
  const hash = await agentLayerContentHash(BASE, "claude-code", "sha256:base");
  await using docker = await fakeDocker(`
if [ "$1 $2" = "image inspect" ] && [ "$5" = "${BASE}" ]; then echo "sha256:base amd64"; exit 0; fi
if [ "$1 $2" = "image inspect" ] && [ "$5" = "${tag}" ]; then echo "${hash}"; exit 0; fi
exit 1`);
  await using dir = await tempDir("sandbox-npm-");
  const info = await ensureAgentImage(new DockerCli(docker.program), BASE, "claude-code", {
    registry: deadRegistry(),
    cacheDir: dir.path,
  });
  assert.deepEqual(info, {
    tag,
    agent: "claude-code",
    base: BASE,
    version: AGENT_PACKAGES["claude-code"].version,
    built: false,
  });
  assert.deepEqual(await docker.callsStartingWith("build"), []);
  assert.match(tag, /^sandbox-agent:claude-code-[0-9a-f]{16}$/);
  assert.notEqual(
    tag,
    await agentImageTagFor("sandbox-runtime:fedcba9876543210", "claude-code"),
    "another sandbox image, another layer",
  );
});

Deno.test("ensureAgentImage() without the layer and without the registry fails with 125, naming what is missing and how to get it", async () => {
  const tag = await agentImageTagFor(BASE, "codex");
  await using docker = await fakeDocker(`
if [ "$1 $2" = "image inspect" ] && [ "$5" = "${BASE}" ]; then echo "sha256:base amd64"; exit 0; fi
[ "$1" = version ] && exit 0  # the engine is there: the layer is what is missing
echo "Error: No such image: $5" >&2; exit 1`);
  await using dir = await tempDir("sandbox-npm-");
  const registry = deadRegistry();
  const error = await ensureAgentImage(new DockerCli(docker.program), BASE, "codex", {
    registry,
    cacheDir: dir.path,
  }).then(
    () => assert.fail("the build should have failed"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof SandboxError, String(error));
  assert.equal(error.code, "image_build_failed");
  assert.equal(exitCodeFor(error), 125);
  assert.match(
    error.message,
    new RegExp(
      `^Cannot build the missing codex image "${tag}": cannot download @openai/codex@0\\.169\\.0-linux-x64 from ${registry}: `,
    ),
  );
  const file = cachedTarballName(AGENT_PACKAGES.codex.tarballs.amd64);
  assert.equal(file, "openai-codex-0.169.0-linux-x64.tgz", "the file npm pack makes of it");
  for (
    const hint of [
      "sandbox image build --agent codex",
      `docker save ${tag} | gzip > codex-image.tar.gz`,
      "docker load -i codex-image.tar.gz",
      `npm pack @openai/codex@0.169.0-linux-x64`,
      `copy ${file} into ${dir.path}/`,
      "npm_config_registry",
    ]
  ) {
    assert.ok(
      error.detail?.includes(hint),
      `the help lacks ${JSON.stringify(hint)}:\n${error.detail}`,
    );
  }
  assert.deepEqual(await docker.callsStartingWith("build"), [], "nothing was built");
});

Deno.test("ensureAgentImage() refuses a base of an architecture it has no binary for", async () => {
  await using docker = await fakeDocker(`echo "sha256:base s390x"; exit 0`);
  await assert.rejects(
    ensureAgentImage(new DockerCli(docker.program), BASE, "codex", { registry: deadRegistry() }),
    (error: unknown) =>
      error instanceof SandboxError && /has no build for architecture "s390x"/.test(error.message),
  );
});
