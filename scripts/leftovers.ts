/**
 * The check that ends the test command: did the tests leave anything of their own behind?
 * Reports (stderr) and exits 1 when they did; removes nothing.
 *
 * "Their own" is known exactly, never guessed from names, so that other suites sharing the
 * engine and the machine are never blamed:
 * - Docker containers, volumes and networks labelled `dev.sandbox.profile` with a profile the
 *   tests made (`uniqueProfile()` lists each in `$SANDBOX_TEST_MANIFEST`);
 * - temporary directories `tempDir()` made (listed there too) that still exist;
 * - the proxies' socket directories (`/tmp/sandbox-proxy-<hash>`, lib/sandbox/proxy_mount.ts) of
 *   state directories inside those temporary directories: `<hash>` hashes the uid and the state
 *   directory, so each is known exactly for the state directories the tests use
 *   (`XDG_STATE_HOME` the temporary directory or its `state`, or `HOME` the temporary directory);
 *   one of a state directory elsewhere (the user's own) cannot be told from another suite's. These
 *   are reported as notes, without failing the check;
 * - processes whose environment carries this suite's `SANDBOX_TEST_SUITE` marker (every process
 *   the tests started inherits it: the CLI, deno, docker clients, sleeps), other than this check
 *   and its own ancestors and children.
 * What the tests' background cleanups remove a moment later is not a leftover: the check looks
 * again until `$SANDBOX_LEFTOVER_GRACE_MS` (default 60 s) has passed.
 *
 *   usage: SANDBOX_TEST_SUITE=ID SANDBOX_TEST_MANIFEST=FILE deno run -A scripts/leftovers.ts
 */
const GRACE_MS = Number(Deno.env.get("SANDBOX_LEFTOVER_GRACE_MS") ?? 60_000);
const POLL_MS = 2_000;
const PROFILE_LABEL = "dev.sandbox.profile";

interface Manifest {
  profiles: Set<string>;
  tempDirs: string[];
}

async function readManifest(path: string | undefined): Promise<Manifest> {
  const manifest: Manifest = { profiles: new Set(), tempDirs: [] };
  if (!path) return manifest;
  let text = "";
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
    // No test made a profile or a temporary directory.
  }
  for (const line of text.split("\n")) {
    const [kind, ...rest] = line.split(" ");
    const value = rest.join(" ");
    if (kind === "profile") manifest.profiles.add(value);
    else if (kind === "tmp") manifest.tempDirs.push(value);
  }
  return manifest;
}

/** `docker ARGS` stdout lines; an engine that cannot be asked is said once, as no objects. */
async function dockerLines(args: string[]): Promise<string[] | undefined> {
  try {
    const out = await new Deno.Command("docker", { args, stdout: "piped", stderr: "null" })
      .output();
    if (!out.success) return undefined;
    return new TextDecoder().decode(out.stdout).split("\n").filter(Boolean);
  } catch {
    return undefined; // no docker CLI: the tests made no Docker objects either
  }
}

/** The labelled Docker objects of the tests' profiles, one description each. */
async function dockerLeftovers(profiles: Set<string>): Promise<string[]> {
  if (profiles.size === 0) return [];
  const format = `{{.Label "${PROFILE_LABEL}"}}\t{{.Name}}`;
  const kinds: [string, string[]][] = [
    ["container", ["ps", "-a", "--format", `{{.Label "${PROFILE_LABEL}"}}\t{{.Names}}`]],
    ["volume", ["volume", "ls", "--format", format]],
    ["network", ["network", "ls", "--format", format]],
  ];
  const found: string[] = [];
  for (const [kind, args] of kinds) {
    const lines = await dockerLines([...args, "--filter", `label=${PROFILE_LABEL}`]);
    for (const line of lines ?? []) {
      const [profile, name] = line.split("\t");
      if (profiles.has(profile)) found.push(`${kind} ${name} (profile ${profile})`);
    }
  }
  return found;
}

async function tempLeftovers(dirs: string[]): Promise<string[]> {
  const found: string[] = [];
  for (const dir of dirs) {
    try {
      await Deno.lstat(dir);
      found.push(`temporary directory ${dir}`);
    } catch {
      // Removed, as it should be.
    }
  }
  return found;
}

/** The proxy directory (proxy_mount.ts `proxyMountSource`'s parent) of the state directory `state`. */
async function proxyParent(state: string): Promise<string> {
  const bytes = new TextEncoder().encode(`${Deno.uid() ?? ""}\0${state}`);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
  return `/tmp/sandbox-proxy-${hex.slice(0, 16)}`;
}

/** The proxy directories of the state directories the tests put in their temporary directories. */
async function proxyLeftovers(dirs: string[]): Promise<string[]> {
  const found: string[] = [];
  for (const dir of dirs) {
    for (const state of [`${dir}/sandbox`, `${dir}/state/sandbox`, `${dir}/.local/state/sandbox`]) {
      const parent = await proxyParent(state);
      try {
        await Deno.lstat(parent);
        found.push(`proxy directory ${parent} (state directory ${state})`);
      } catch {
        // Removed with the state directory's last container, as it should be.
      }
    }
  }
  return found;
}

/** pid → parent pid, for every process. */
async function parents(): Promise<Map<number, number>> {
  const map = new Map<number, number>();
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const stat = await Deno.readTextFile(`/proc/${entry.name}/stat`);
      // The name in parentheses may hold spaces: the parent pid is the second field after it.
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      map.set(Number(entry.name), ppid);
    } catch {
      // The process ended while being listed.
    }
  }
  return map;
}

/** Processes carrying `marker` in their environment, but this check's ancestors and descendants. */
async function processLeftovers(marker: string): Promise<string[]> {
  const tree = await parents();
  const ancestors = new Set<number>();
  for (let pid = Deno.pid; pid > 1 && !ancestors.has(pid); pid = tree.get(pid) ?? 1) {
    ancestors.add(pid);
  }
  const descendsFromUs = (pid: number): boolean => {
    for (let p = pid, hops = 0; p > 1 && hops < 1000; p = tree.get(p) ?? 1, hops++) {
      if (p === Deno.pid) return true;
    }
    return false;
  };
  const found: string[] = [];
  for (const pid of tree.keys()) {
    if (ancestors.has(pid) || descendsFromUs(pid)) continue;
    let environ: string;
    try {
      environ = await Deno.readTextFile(`/proc/${pid}/environ`);
    } catch {
      continue; // ended, or not ours to read
    }
    if (!environ.split("\0").includes(marker)) continue;
    const cmdline = await Deno.readTextFile(`/proc/${pid}/cmdline`).catch(() => ""); // ended
    found.push(`process ${pid}: ${cmdline.split("\0").join(" ").trim().slice(0, 200)}`);
  }
  return found;
}

async function leftovers(manifest: Manifest, marker: string | undefined): Promise<string[]> {
  return [
    ...await dockerLeftovers(manifest.profiles),
    ...await tempLeftovers(manifest.tempDirs),
    ...(marker ? await processLeftovers(marker) : []),
  ];
}

async function main(): Promise<number> {
  const suite = Deno.env.get("SANDBOX_TEST_SUITE");
  const manifest = await readManifest(Deno.env.get("SANDBOX_TEST_MANIFEST"));
  const marker = suite ? `SANDBOX_TEST_SUITE=${suite}` : undefined;
  const deadline = Date.now() + GRACE_MS;
  let found = await leftovers(manifest, marker);
  while (found.length > 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    found = await leftovers(manifest, marker);
  }
  // Said, not failed on yet: until every test is known to remove them, one would fail the suite.
  for (const line of await proxyLeftovers(manifest.tempDirs)) {
    console.error(`leftovers: note: ${line}`);
  }
  if (found.length === 0) {
    console.error(
      `leftovers: none (${manifest.profiles.size} test profiles, ${manifest.tempDirs.length} temporary directories checked)`,
    );
    return 0;
  }
  console.error(`leftovers: the tests left ${found.length} things of their own behind:`);
  for (const line of found) console.error(`leftovers:   ${line}`);
  return 1;
}

Deno.exit(await main());
