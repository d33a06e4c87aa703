/**
 * Pushing the sandbox image (and the agent CLI layers built on it) to a registry a cluster can pull
 * from: each local tag `NAME:TAG` is tagged `REGISTRY/NAME:TAG` and pushed with the `docker` CLI,
 * whose credentials (`docker login`) and insecure-registry settings apply.
 *
 * The registry is checked before anything is built or pushed: a name without a host part would send
 * the image to Docker Hub, so it is refused. A push that fails says whether the registry could not be
 * reached or refused the push, in one line.
 */
import type { DockerCli } from "./docker.ts";
import { CommandExitError, SandboxError } from "../errors.ts";
import { ensureImage, type ProgressPhase } from "./image.ts";
import { agentImageTagFor } from "../agents/agent_image.ts";
import { AGENT_CLIS } from "../agents/packages.ts";

export interface PushOptions {
  /** Phase lines for stderr: what is pushed, then how long it took. */
  onProgress?: (line: string, phase?: ProgressPhase) => void;
  signal?: AbortSignal;
}

export interface PushedImage {
  /** The local tag pushed, e.g. `sandbox-runtime:<hash>`. */
  image: string;
  /** Where it went: `REGISTRY/sandbox-runtime:<hash>`, the value for `kubernetes.image`. */
  reference: string;
  /** The manifest digest the registry stored (`sha256:…`). */
  digest: string;
}

const LABEL_PART = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?";
const HOST = `(?:${LABEL_PART}(?:\\.${LABEL_PART})*|\\[[0-9A-Fa-f:.]+\\])`;
const PATH_PART = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
const REGISTRY = new RegExp(`^(${HOST})(?::([0-9]{1,5}))?((?:/${PATH_PART})*)$`);

/**
 * `host[:port][/path]`, checked: the normalized registry (no trailing slash), or a usage error
 * naming what is wrong with it. The host must look like one (a dot, a port, or `localhost`), as
 * `docker` tells a registry from a Docker Hub user by exactly that.
 */
export function parseRegistry(registry: string): string {
  const value = registry.trim().replace(/\/+$/, "");
  const bad = (why: string) =>
    new SandboxError("usage", `--registry "${registry}" is not a registry: ${why}`);
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(value)) {
    throw bad("give it without a scheme, as host[:port][/path]");
  }
  const match = REGISTRY.exec(value);
  if (!match) throw bad("expected host[:port][/path] (path in lowercase letters, digits, . _ -)");
  const [, host, port] = match;
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65535)) {
    throw bad(`port ${port} is out of range`);
  }
  if (port === undefined && !host.includes(".") && !host.startsWith("[") && host !== "localhost") {
    throw bad(
      `"${host}" names no registry host (docker would push to Docker Hub); add its domain or port`,
    );
  }
  return value;
}

/** `REGISTRY/NAME:TAG` for a local `NAME:TAG`. */
export function pushedReference(registry: string, image: string): string {
  return `${registry}/${image}`;
}

/** Tags `image` under `registry` and pushes it; the reference and the digest the registry stored. */
export async function pushImage(
  docker: DockerCli,
  image: string,
  registry: string,
  options: PushOptions = {},
): Promise<PushedImage> {
  const reference = pushedReference(registry, image);
  const started = performance.now();
  const existed = (await docker.run(["image", "inspect", "--format", "{{.Id}}", reference]))
    .exitCode === 0;
  await docker.ok(["tag", image, reference], "docker_failed", `Cannot tag ${image}`, {
    signal: options.signal,
  });
  options.onProgress?.(`Pushing ${image} to ${reference}`, "begin");
  const result = await docker.run(["push", reference], { signal: options.signal });
  if (result.aborted) throw new SandboxError("interrupted", `Pushing ${reference} was interrupted`);
  if (result.exitCode !== 0) {
    // The tag made for this push goes with it (the image keeps its own tag: `rmi` only untags).
    if (!existed) await docker.run(["rmi", reference]);
    throw pushFailure(registry, reference, result);
  }
  const digest = /digest: (sha256:[0-9a-f]{64})/.exec(result.stdout)?.[1];
  if (!digest) {
    throw new SandboxError("docker_failed", `Pushed ${reference}, but docker named no digest`, {
      detail: result.stdout.trim().split("\n").slice(-3).join("\n"),
    });
  }
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  options.onProgress?.(`Pushed ${reference} (${digest}) in ${seconds}s`, "end");
  return { image, reference, digest };
}

/*
 * The push goes through the `docker` CLI, and its failure is told from the CLI's stderr, because
 * the Engine API's push (`POST /images/{name}/push`) takes the registry's credentials in an
 * `X-Registry-Auth` header: the caller must resolve them itself from ~/.docker/config.json and its
 * credential helpers (`credsStore`, `credHelpers`), which the CLI does and we would have to copy.
 * The API's `errorDetail` would be typed, but the words that tell unreachable from refused are the
 * registry's either way; the patterns below match those words, not an imitation of CLI output.
 */
const UNREACHABLE =
  /connection refused|no such host|i\/o timeout|no route to host|network is unreachable|connection reset|server gave HTTP response to HTTPS client|tls: |x509: /i;
const REFUSED =
  /unauthorized|authentication required|denied|forbidden|no basic auth credentials|401|403/i;

/** Why a push failed, in one line a person can act on. */
function pushFailure(
  registry: string,
  reference: string,
  result: { stderr: string; argv: readonly string[]; exitCode: number; stderrTail: string },
): SandboxError {
  const answer = result.stderr.trim().split("\n").filter(Boolean).at(-1) ?? "";
  const init = { argv: result.argv, exitCode: result.exitCode, stderrTail: "" };
  if (UNREACHABLE.test(result.stderr)) {
    return new CommandExitError(
      "docker_failed",
      `Registry ${registry} is unreachable from the engine (${answer}): check its address and ` +
        `port, and that the engine trusts it (plain HTTP off 127.0.0.0/8 needs insecure-registries)`,
      init,
    );
  }
  if (REFUSED.test(result.stderr)) {
    return new CommandExitError(
      "docker_failed",
      `Registry ${registry} refused the push of ${reference} (${answer}): log in with: docker login ${registry}`,
      init,
    );
  }
  return new CommandExitError("docker_failed", `Cannot push ${reference}: ${answer}`, init);
}

/**
 * The profile's sandbox image (built first when missing or stale) and every agent CLI layer already
 * built on it, pushed to `registry` in that order (the sandbox image first).
 */
export async function pushProfileImages(
  docker: DockerCli,
  baseImage: string,
  registry: string,
  options: PushOptions = {},
): Promise<PushedImage[]> {
  const target = parseRegistry(registry);
  const sandbox = await ensureImage(docker, baseImage, options);
  const images = [sandbox.tag];
  for (const agent of AGENT_CLIS) {
    const layer = await agentImageTagFor(sandbox.tag, agent);
    const found = await docker.run(["image", "inspect", "--format", "{{.Id}}", layer], {
      signal: options.signal,
    });
    if (found.exitCode === 0) images.push(layer);
  }
  const pushed: PushedImage[] = [];
  for (const image of images) pushed.push(await pushImage(docker, image, target, options));
  return pushed;
}
