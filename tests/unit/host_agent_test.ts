/**
 * An agent CLI's files on the host for mode local (lib/agents/host_agent.ts): the pinned tarball,
 * from a fake registry on 127.0.0.1, unpacked once into a read-only directory named by its
 * content; runs at the same time get the one whole directory; a tarball neither cached nor
 * reachable fails with exit 125 saying what to bring and where.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  ensureHostAgent,
  hostAgentName,
  hostArchitecture,
  pruneHostAgents,
} from "../../lib/agents/host_agent.ts";
import { cachedTarballName } from "../../lib/agents/npm_tarball.ts";
import type { AgentPackage, PlatformTarball } from "../../lib/agents/packages.ts";
import { exitCodeFor, SandboxError } from "../../lib/errors.ts";
import { run } from "../../lib/process.ts";
import { tempDir } from "../_helpers.ts";

/** A temporary directory whose read-only contents are made writable before it is removed. */
async function workDir(): Promise<{ path: string } & AsyncDisposable> {
  const dir = await tempDir("sandbox-host-agent-");
  return {
    path: dir.path,
    [Symbol.asyncDispose]: async () => {
      await run(["chmod", "-R", "u+w", "--", dir.path]);
      await dir[Symbol.asyncDispose]();
    },
  };
}

/** A package whose tarball holds `package/bin/agent` (or not, `withProgram: false`). */
async function fakePackage(
  dir: string,
  withProgram = true,
): Promise<{ pkg: AgentPackage; bytes: Uint8Array<ArrayBuffer> }> {
  await Deno.mkdir(`${dir}/src/package/bin`, { recursive: true });
  const file = withProgram ? "agent" : "other";
  await Deno.writeTextFile(`${dir}/src/package/bin/${file}`, "#!/bin/sh\necho agent\n", {
    mode: 0o755,
  });
  const made = await run(["tar", "-czf", `${dir}/pkg.tgz`, "-C", `${dir}/src`, "package"]);
  assert.equal(made.exitCode, 0, made.stderr);
  const bytes = await Deno.readFile(`${dir}/pkg.tgz`);
  const tarball: PlatformTarball = {
    spec: "@x/agent@1.0.0",
    path: "@x/agent/-/agent-1.0.0.tgz",
    integrity: `sha512-${createHash("sha512").update(bytes).digest("base64")}`,
    root: "package",
  };
  const pkg: AgentPackage = {
    agent: "codex",
    name: "@x/agent",
    version: "1.0.0",
    tarballs: { amd64: tarball, arm64: tarball },
    entrypoint: "bin/agent",
  };
  return { pkg, bytes };
}

/** A registry on 127.0.0.1 serving `bytes` at `path`; it counts requests. */
function fakeRegistry(path: string, bytes: Uint8Array<ArrayBuffer>) {
  let requests = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    requests++;
    return new URL(req.url).pathname === `/${path}`
      ? new Response(bytes)
      : new Response("not found", { status: 404 });
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    get requests() {
      return requests;
    },
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

Deno.test("ensureHostAgent() unpacks the pinned tarball once into a read-only directory named by its content; the next call reads nothing", async () => {
  await using dir = await workDir();
  const { pkg, bytes } = await fakePackage(dir.path);
  await using registry = fakeRegistry(pkg.tarballs.amd64.path, bytes);
  const progress: string[] = [];
  const options = {
    package: pkg,
    registry: registry.url,
    cacheDir: `${dir.path}/npm`,
    agentsDir: `${dir.path}/agents`,
    onProgress: (line: string) => progress.push(line),
  };
  const path = await ensureHostAgent("codex", options);
  assert.equal(path, `${dir.path}/agents/${await hostAgentName(pkg, hostArchitecture()!)}`);
  assert.match(path, /\/codex-1\.0\.0-(amd64|arm64)-[0-9a-f]{12}$/);
  assert.equal(await Deno.readTextFile(`${path}/bin/agent`), "#!/bin/sh\necho agent\n");
  for (const name of ["", "/bin", "/bin/agent"]) {
    const mode = (await Deno.stat(`${path}${name}`)).mode! & 0o777;
    assert.equal(mode & 0o222, 0, `"${name || "."}" is writable (${mode.toString(8)})`);
  }
  assert.equal(((await Deno.stat(`${path}/bin/agent`)).mode! & 0o111) !== 0, true, "executable");
  assert.ok(
    progress.some((line) => line.startsWith("Unpacking @x/agent@1.0.0 into ")),
    progress.join("\n"),
  );
  assert.equal(registry.requests, 1);

  // The tarball gone from the npm cache: the unpacked directory is enough.
  await Deno.remove(`${dir.path}/npm/${cachedTarballName(pkg.tarballs.amd64)}`);
  progress.length = 0;
  assert.equal(await ensureHostAgent("codex", options), path);
  assert.deepEqual(progress, [], "nothing was fetched or unpacked");
  assert.equal(registry.requests, 1);
});

Deno.test("ensureHostAgent() called by runs at the same time gives each the one whole directory and leaves no partial one", async () => {
  await using dir = await workDir();
  const { pkg, bytes } = await fakePackage(dir.path);
  await using registry = fakeRegistry(pkg.tarballs.amd64.path, bytes);
  // The tarball in the cache first: concurrent downloads are fetchTarball's affair, not this one's.
  const options = {
    package: pkg,
    registry: registry.url,
    cacheDir: `${dir.path}/npm`,
    agentsDir: `${dir.path}/agents`,
  };
  await Deno.mkdir(options.cacheDir);
  await Deno.writeFile(`${options.cacheDir}/${cachedTarballName(pkg.tarballs.amd64)}`, bytes);
  const paths = await Promise.all(
    Array.from({ length: 4 }, () => ensureHostAgent("codex", options)),
  );
  assert.equal(new Set(paths).size, 1, paths.join("\n"));
  const entries = await Array.fromAsync(Deno.readDir(options.agentsDir), (e) => e.name);
  assert.deepEqual(entries, [paths[0].slice(paths[0].lastIndexOf("/") + 1)]);
  assert.equal(await Deno.readTextFile(`${paths[0]}/bin/agent`), "#!/bin/sh\necho agent\n");
  assert.equal(registry.requests, 0);
});

Deno.test("ensureHostAgent() with a tarball neither cached nor reachable stops with exit 125, naming the file to bring and where", async () => {
  await using dir = await workDir();
  const { pkg } = await fakePackage(dir.path);
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const registry = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
  listener.close();
  const cacheDir = `${dir.path}/npm`;
  const error = await ensureHostAgent("codex", {
    package: pkg,
    registry,
    cacheDir,
    agentsDir: `${dir.path}/agents`,
  }).then(() => undefined, (e) => e);
  assert.ok(error instanceof SandboxError, String(error));
  assert.equal(exitCodeFor(error), 125);
  assert.match(
    error.message,
    new RegExp(
      `^Cannot install codex for sandbox mode local: cannot download @x/agent@1\\.0\\.0 from ${registry}: `,
    ),
  );
  assert.match(error.detail ?? "", /npm pack @x\/agent@1\.0\.0/);
  assert.ok(
    error.detail?.includes(`copy x-agent-1.0.0.tgz into ${cacheDir}/`),
    String(error.detail),
  );
  assert.deepEqual(await Array.fromAsync(Deno.readDir(`${dir.path}/agents`)).catch(() => []), []);
});

Deno.test("ensureHostAgent() refuses a tarball without the agent's program and keeps nothing of it", async () => {
  await using dir = await workDir();
  const { pkg, bytes } = await fakePackage(dir.path, false);
  await using registry = fakeRegistry(pkg.tarballs.amd64.path, bytes);
  await assert.rejects(
    ensureHostAgent("codex", {
      package: pkg,
      registry: registry.url,
      cacheDir: `${dir.path}/npm`,
      agentsDir: `${dir.path}/agents`,
    }),
    (error: unknown) =>
      error instanceof SandboxError && error.code === "image_build_failed" &&
      error.message.endsWith('@x/agent@1.0.0 has no "bin/agent"'),
  );
  assert.deepEqual(await Array.fromAsync(Deno.readDir(`${dir.path}/agents`)), []);
});

Deno.test("pruneHostAgents() removes agent files no current pin names and partial unpacks of processes gone, keeps the current ones and a live unpack, and a dry run removes nothing", async () => {
  await using dir = await workDir();
  const { pkg, bytes } = await fakePackage(dir.path);
  await using registry = fakeRegistry(pkg.tarballs.amd64.path, bytes);
  const agentsDir = `${dir.path}/agents`;
  const current = await ensureHostAgent("codex", {
    package: pkg,
    registry: registry.url,
    cacheDir: `${dir.path}/npm`,
    agentsDir,
  });
  const currentName = current.slice(agentsDir.length + 1);
  const old = "codex-0.1.0-amd64-0123456789ab";
  await Deno.mkdir(`${agentsDir}/${old}/bin`, { recursive: true });
  await Deno.writeTextFile(`${agentsDir}/${old}/bin/codex`, "12345");
  // Made read-only, as an unpack leaves it: the prune must still remove it.
  assert.equal((await run(["chmod", "-R", "a-w", `${agentsDir}/${old}`])).exitCode, 0);
  // A pid no process has (above the kernel's pid_max), and this test's own.
  const deadUnpack = `${currentName}.99999999-abcdef12.partial`;
  const liveUnpack = `${currentName}.${Deno.pid}-abcdef12.partial`;
  for (const name of [deadUnpack, liveUnpack]) await Deno.mkdir(`${agentsDir}/${name}`);
  const names = async () =>
    (await Array.fromAsync(Deno.readDir(agentsDir))).map((e) => e.name).sort();

  const dry = await pruneHostAgents({ agentsDir, packages: [pkg], dryRun: true });
  assert.deepEqual(
    dry.removed.sort((a, b) => a.name.localeCompare(b.name)),
    [{ name: old, bytes: 5 }, { name: deadUnpack, bytes: 0 }].sort((a, b) =>
      a.name.localeCompare(b.name)
    ),
  );
  assert.deepEqual(await names(), [currentName, deadUnpack, liveUnpack, old].sort());

  const done = await pruneHostAgents({ agentsDir, packages: [pkg] });
  assert.equal(done.removed.length, 2);
  assert.deepEqual(await names(), [currentName, liveUnpack].sort());
  assert.equal(await Deno.readTextFile(`${current}/bin/agent`), "#!/bin/sh\necho agent\n");
  // No directory at all: nothing to prune, no error.
  assert.deepEqual(await pruneHostAgents({ agentsDir: `${dir.path}/none` }), { removed: [] });
});
