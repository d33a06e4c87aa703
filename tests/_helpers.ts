/** Shared test helpers: the CLI as a subprocess, temporary configs, and the Docker gate. */
import { run, type RunResult, spawn, type SpawnOptions } from "../lib/process.ts";
import { PROXY_MOUNT_PATH } from "../lib/sandbox/proxy_mount.ts";
import { parseConfig, type Profile, resolveProfile } from "../lib/config.ts";

export const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
export const CLI = `${ROOT}/cli.ts`;

/**
 * Is a Docker engine reachable? Integration tests use this as their gate: without an engine they
 * are skipped on a developer machine, but under CI (`CI` set) they fail loudly instead.
 */
export const DOCKER_AVAILABLE: boolean = await (async () => {
  try {
    return (await run(["docker", "info", "--format", "{{.ServerVersion}}"], { timeoutMs: 20_000 }))
      .exitCode === 0;
  } catch {
    return false;
  }
})();
export const IN_CI = Boolean(Deno.env.get("CI"));

/** Options for a test that needs Docker. */
export function dockerTest(): { ignore: boolean } {
  return { ignore: !DOCKER_AVAILABLE && !IN_CI };
}

/** Fail with a clear message when CI runs a Docker test without an engine. */
export function assertDocker(): void {
  if (!DOCKER_AVAILABLE) {
    throw new Error(
      "CI is set but no Docker engine is reachable: run scripts/provision.sh (docker info failed)",
    );
  }
}

/** A temporary directory removed on dispose. */
export async function tempDir(
  prefix = "sandbox-test-",
): Promise<AsyncDisposable & { path: string }> {
  const path = await Deno.makeTempDir({ prefix });
  recordMade("tmp", path);
  return {
    path,
    async [Symbol.asyncDispose]() {
      await Deno.remove(path, { recursive: true }).catch(() => {});
    },
  };
}

/** A unique, valid profile name for one test. */
export function uniqueProfile(prefix: string): string {
  const profile = `${prefix}-${crypto.randomUUID().slice(0, 8)}`;
  recordMade("profile", profile);
  return profile;
}

/**
 * Under the test command, each profile and temporary directory the tests make is listed in
 * `$SANDBOX_TEST_MANIFEST`, so that the leftover check after the suite (scripts/leftovers.ts)
 * knows exactly which objects are the tests' own.
 */
function recordMade(kind: "profile" | "tmp", value: string): void {
  const manifest = Deno.env.get("SANDBOX_TEST_MANIFEST");
  if (manifest) Deno.writeTextFileSync(manifest, `${kind} ${value}\n`, { append: true });
}

export interface CliOptions extends SpawnOptions {
  config?: string;
}

/** Run the CLI (`deno run -A cli.ts ARGS`) to completion. */
export function runCli(args: string[], options: CliOptions = {}): Promise<RunResult> {
  const { config, ...rest } = options;
  return run(cliArgv(args, config), { timeoutMs: 300_000, ...rest });
}

/** Start the CLI and return the child for streaming assertions. */
export function spawnCli(args: string[], options: CliOptions = {}) {
  const { config, ...rest } = options;
  return spawn(cliArgv(args, config), rest);
}

function cliArgv(args: string[], config?: string): string[] {
  return [
    Deno.execPath(),
    "run",
    "-A",
    "--quiet",
    CLI,
    ...(config ? ["--config", config] : []),
    ...args,
  ];
}

/** Failure output for assertion messages. */
export function explain(result: RunResult): string {
  return `exit ${result.exitCode}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`;
}

/** `docker ARGS` stdout, trimmed; throws with stderr on failure. */
export async function docker(...args: string[]): Promise<string> {
  const result = await run(["docker", ...args]);
  if (result.exitCode !== 0) throw new Error(`docker ${args.join(" ")} failed: ${result.stderr}`);
  return result.stdout.trim();
}

/** The names of `profile`'s containers, by its label: the running ones, or with `all` every one. */
export async function profileContainers(
  profile: string,
  options: { all?: boolean } = {},
): Promise<string[]> {
  return (await docker(
    "ps",
    ...(options.all ? ["-a"] : []),
    "--filter",
    `label=dev.sandbox.profile=${profile}`,
    "--format",
    "{{.Names}}",
  )).split("\n").filter(Boolean);
}

/**
 * Remove every container, network and volume of a profile, by label (test cleanup), and the host
 * directories mounted into its containers for the proxies' sockets (which the CLI's own removal
 * takes with the container: lib/sandbox/proxy_mount.ts).
 */
export async function removeProfile(profile: string): Promise<void> {
  const filter = `label=dev.sandbox.profile=${profile}`;
  const containers = (await run(["docker", "ps", "-aq", "--filter", filter])).stdout.split("\n")
    .filter(Boolean);
  const proxyDirs = containers.length ? await proxyMountSources(containers) : [];
  if (containers.length) await run(["docker", "rm", "-f", ...containers]);
  await Promise.all(proxyDirs.map(removeProxyDir));
  const networks = (await run(["docker", "network", "ls", "-q", "--filter", filter])).stdout.split(
    "\n",
  ).filter(Boolean);
  if (networks.length) await run(["docker", "network", "rm", ...networks]);
  const volumes = (await run(["docker", "volume", "ls", "-q", "--filter", filter])).stdout.split(
    "\n",
  ).filter(Boolean);
  if (volumes.length) await run(["docker", "volume", "rm", "-f", ...volumes]);
}

/** The host directories bind-mounted at the proxies' socket path into `containers`. */
async function proxyMountSources(containers: string[]): Promise<string[]> {
  const format =
    `{{range .Mounts}}{{if eq .Destination "${PROXY_MOUNT_PATH}"}}{{.Source}}\n{{end}}{{end}}`;
  const result = await run(["docker", "inspect", "--format", format, ...containers]);
  // A container removed meanwhile fails the inspect of it alone: the others' lines still come.
  return result.stdout.split("\n").map((line) => line.trim()).filter((line) =>
    line.startsWith("/tmp/sandbox-proxy-")
  );
}

/**
 * A container's proxy directory and its spare relay's record; its parent (the user's, per state
 * directory) too when no other container's is left in it.
 */
async function removeProxyDir(dir: string): Promise<void> {
  // Gone already (removed by the CLI's own cleanup) is as good.
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  await Deno.remove(`${dir}.spare-relay.json`).catch(() => {}); // absent without a spare relay
  await Deno.remove(dir.slice(0, dir.lastIndexOf("/"))).catch(() => {}); // NotEmpty: another's is in it
}

/** Write a config file with one profile and return its path. */
export async function writeConfig(
  dir: string,
  yaml: string,
  name = "sandbox.yaml",
): Promise<string> {
  const path = `${dir}/${name}`;
  await Deno.writeTextFile(path, yaml);
  return path;
}

/** One of `docker inspect`'s `Mounts`. */
export interface InspectedMount {
  Type: string;
  Source?: string;
  Destination?: string;
  RW?: boolean;
}

/**
 * The only host path a sandbox may have mounted: its own proxy socket directory, read-only, at
 * PROXY_MOUNT_PATH (lib/sandbox/proxy_mount.ts; present on engines that share this machine's
 * filesystem). Returns the other bind mounts, which a hardened container must not have.
 */
export function unexpectedBinds(mounts: InspectedMount[] | null | undefined): InspectedMount[] {
  return (mounts ?? []).filter((m) =>
    m.Type === "bind" &&
    !(m.Destination === PROXY_MOUNT_PATH && m.RW === false &&
      /^\/tmp\/sandbox-proxy-[0-9a-f]+\/[0-9a-f]+$/.test(m.Source ?? ""))
  );
}

/** Run `fn` with these variables set (undefined: unset), then put them back. */
export async function withEnv<T>(
  vars: Record<string, string | undefined>,
  fn: () => Promise<T>,
): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((name) => [name, Deno.env.get(name)]));
  const apply = (values: Record<string, string | undefined>) => {
    for (const [name, value] of Object.entries(values)) {
      if (value === undefined) Deno.env.delete(name);
      else Deno.env.set(name, value);
    }
  };
  apply(vars);
  try {
    return await fn();
  } finally {
    apply(saved);
  }
}

/** The profile `name` of a configuration given as YAML text (no file, no environment); throws on issues. */
export function profileFrom(yaml: string, name: string): Profile {
  const parsed = parseConfig(yaml, undefined, () => undefined);
  if (parsed.kind !== "ok") throw new Error(JSON.stringify(parsed.issues));
  return resolveProfile(parsed.config, name);
}

/** A profile `name` whose LLM is the custom upstream at `baseUrl`, its key read from `$keyEnv`. */
export function upstreamProfile(name: string, baseUrl: string, keyEnv: string): Profile {
  return profileFrom(
    `profiles:\n  ${name}:\n    llm: {provider: custom, base_url: "${baseUrl}", key: {env: ${keyEnv}}}\n`,
    name,
  );
}
