/**
 * Anthropic's sandbox-runtime (`srt`, @anthropic-ai/sandbox-runtime) for bench/local_bench.ts:
 * installed from npm into a directory of the bench's own (once per version, under $TMPDIR), run the way its
 * README says (`srt --settings FILE COMMAND`), and the memory of a process tree (ours or srt's).
 */
import { run } from "../lib/process.ts";

export const SRT_VERSION = "0.0.78";

/**
 * Where the bench keeps its srt: `$TMPDIR/sandbox-bench-srt-VERSION`, outside the user's home,
 * whose reads srt is told to deny (as our sandbox sees none of it): its own files must stay readable.
 */
function srtDir(): string {
  return `${Deno.env.get("TMPDIR") || "/tmp"}/sandbox-bench-srt-${SRT_VERSION}`;
}

async function onPath(program: string): Promise<boolean> {
  return (await run(["sh", "-c", 'command -v "$1"', "sh", program])).exitCode === 0;
}

/**
 * The path of the `srt` program, installed if missing; or why it cannot run here (what to
 * install), as a string the bench prints instead of srt's figures.
 */
export async function installSrt(
  progress: (line: string) => void,
): Promise<{ srt: string } | { missing: string }> {
  const missing = [];
  for (
    const [program, what] of [["npm", "npm"], ["node", "nodejs"], ["socat", "socat"], [
      "rg",
      "ripgrep",
    ]]
  ) {
    if (!await onPath(program)) missing.push(what);
  }
  if (missing.length > 0) {
    return {
      missing: `srt cannot run here: ${
        missing.join(", ")
      } missing (scripts/provision.sh installs them)`,
    };
  }
  const dir = srtDir();
  const srt = `${dir}/node_modules/.bin/srt`;
  if (await Deno.stat(srt).then(() => false, () => true)) {
    progress(`installing @anthropic-ai/sandbox-runtime@${SRT_VERSION} into ${dir}`);
    await Deno.mkdir(dir, { recursive: true });
    const installed = await run([
      "npm",
      "install",
      "--no-audit",
      "--no-fund",
      "--prefix",
      dir,
      `@anthropic-ai/sandbox-runtime@${SRT_VERSION}`,
    ], { timeoutMs: 600_000 });
    if (installed.exitCode !== 0) {
      return { missing: `npm install of srt failed: ${installed.stderr.trim().slice(-400)}` };
    }
  }
  return { srt };
}

/**
 * A settings file for srt: no network but `allowed` (host:port entries), writes only to `workDir`,
 * reads of the user's home denied (as our sandbox sees none of it).
 */
export async function srtSettings(workDir: string, allowed: string[]): Promise<string> {
  const path = `${workDir}/srt-settings-${allowed.length}.json`;
  await Deno.writeTextFile(
    path,
    JSON.stringify({
      network: { allowedDomains: allowed, deniedDomains: [] },
      filesystem: { denyRead: ["~"], allowWrite: [workDir], denyWrite: [] },
    }),
  );
  return path;
}

/** The host pids of `pid` and all its descendants. */
async function tree(pid: number): Promise<number[]> {
  const found = [pid];
  for (let i = 0; i < found.length; i++) {
    const text = await Deno.readTextFile(`/proc/${found[i]}/task/${found[i]}/children`)
      .catch(() => ""); // gone since: no children
    found.push(...text.split(" ").filter(Boolean).map(Number));
  }
  return found;
}

/** The summed proportional set size (Pss) of `pid`'s tree, in MB. */
async function treePssMb(pid: number): Promise<number> {
  let kb = 0;
  for (const p of await tree(pid)) {
    const text = await Deno.readTextFile(`/proc/${p}/smaps_rollup`).catch(() => ""); // gone
    kb += Number(/^Pss:\s+(\d+) kB/m.exec(text)?.[1] ?? 0);
  }
  return kb / 1024;
}

/**
 * The memory of an idle sandbox: `argv` is started (its command `sleep`), and once a `sleep`
 * runs in its tree and a second has passed, the Pss of the whole tree (the launcher's process,
 * its proxies, the sandbox's processes) is read; then it is stopped.
 */
export async function idleSandboxMb(argv: string[], env?: Record<string, string>): Promise<number> {
  const child = new Deno.Command(argv[0], {
    args: argv.slice(1),
    env,
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  try {
    for (let attempt = 0; attempt < 600; attempt++) {
      const comms = await Promise.all(
        (await tree(child.pid)).map((p) => Deno.readTextFile(`/proc/${p}/comm`).catch(() => "")),
      );
      if (comms.some((comm) => comm.trim() === "sleep")) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    return await treePssMb(child.pid);
  } finally {
    // SIGTERM: each launcher then ends its sandbox as on an interrupt.
    child.kill("SIGTERM");
    await child.status;
  }
}
