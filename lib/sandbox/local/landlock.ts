/**
 * Landlock, the second layer of sandbox mode local's filesystem (docs/local.md): the command
 * launcher (launcher.ts), inside the sandbox's mount namespace and just before the command, makes a
 * Landlock ruleset of the paths the sandbox may use (`landlockRules`) and restricts itself with it.
 * The mount namespace already shows nothing else; Landlock keeps the same promise should a path be
 * mounted that the ruleset does not name (a bind added by mistake, a mount namespace escaped).
 * Applied where the kernel has Landlock (`landlockAbi`); elsewhere the mount namespace stands alone
 * and `sandbox doctor` says so. landlock_create_ruleset, landlock_add_rule and
 * landlock_restrict_self are 444, 445 and 446 on every architecture.
 */
import { run } from "../../process.ts";
import { LOCAL_PATHS } from "./bwrap.ts";

/** The architectures whose other syscall numbers the launcher knows (those seccomp.ts supports). */
const ARCHES = ["x86_64", "aarch64"];

/** Filesystem access rights (linux/landlock.h), each with the ABI version that added it. */
const FS = {
  execute: 1 << 0,
  writeFile: 1 << 1,
  readFile: 1 << 2,
  readDir: 1 << 3,
  removeDir: 1 << 4,
  removeFile: 1 << 5,
  makeChar: 1 << 6,
  makeDir: 1 << 7,
  makeReg: 1 << 8,
  makeSock: 1 << 9,
  makeFifo: 1 << 10,
  makeBlock: 1 << 11,
  makeSym: 1 << 12,
  refer: 1 << 13, // ABI 2
  truncate: 1 << 14, // ABI 3
  ioctlDev: 1 << 15, // ABI 5
} as const;

/** Every right the kernel of ABI `abi` knows: what the ruleset handles (denies unless granted). */
export function handledRights(abi: number): number {
  if (abi >= 5) return (1 << 16) - 1;
  if (abi >= 3) return (1 << 15) - 1;
  if (abi >= 2) return (1 << 14) - 1;
  return (1 << 13) - 1;
}

const READ = FS.readFile | FS.readDir;
const READ_EXEC = READ | FS.execute;
/** All rights: the sandbox's own directories. */
const ALL = (1 << 16) - 1;
/** Device files: read, write, truncate (`>/dev/null`) and their ioctls; nothing made in /dev. */
const DEVICES = READ | FS.writeFile | FS.truncate | FS.ioctlDev;

/**
 * The paths a command may use, as they are inside the sandbox (bwrap.ts `holderArgv` binds them),
 * and the rights beneath each. A path missing inside (no /cache, a system without /lib64) is
 * skipped. Nothing else is reachable, even where a mount shows it.
 */
export const LANDLOCK_RULES: readonly (readonly [path: string, rights: number])[] = [
  ["/usr", READ_EXEC],
  ["/bin", READ_EXEC],
  ["/sbin", READ_EXEC],
  ["/lib", READ_EXEC],
  ["/lib32", READ_EXEC],
  ["/lib64", READ_EXEC],
  ["/libx32", READ_EXEC],
  ["/etc", READ],
  ["/opt/sandbox", READ_EXEC],
  // Processes read their own and each other's entries, and write a few of their own
  // (oom_score_adj, comm); what /proc must not let them change bwrap mounts read-only.
  ["/proc", READ | FS.writeFile],
  ["/dev", DEVICES],
  ["/dev/shm", ALL],
  [LOCAL_PATHS.workspace, ALL],
  [LOCAL_PATHS.home, ALL],
  [LOCAL_PATHS.tmp, ALL],
  // The proxies' sockets: connecting to one needs no Landlock right, only the path.
  [LOCAL_PATHS.proxy, READ],
  [LOCAL_PATHS.cache, READ],
];

/** The handled rights and `[rights, path]` rules for a kernel of Landlock ABI `abi`. */
export function landlockRules(
  abi: number,
): { handled: number; rules: (readonly [rights: number, path: string])[] } {
  const handled = handledRights(abi);
  return { handled, rules: LANDLOCK_RULES.map(([path, rights]) => [rights & handled, path]) };
}

let probed: Promise<{ abi: number } | { absent: string }> | undefined;

/** `landlockAbi()`, probed once per process. */
export function landlockSupport(): Promise<{ abi: number } | { absent: string }> {
  probed ??= landlockAbi();
  return probed;
}

/**
 * The Landlock ABI version of this kernel, or why Landlock cannot be applied here: a kernel
 * without it (or with it disabled), an architecture without known syscall numbers. (The launcher
 * that applies it is Perl: mode local needs Perl whatever the kernel has, bwrap.ts `localTools`.)
 */
export async function landlockAbi(): Promise<{ abi: number } | { absent: string }> {
  if (!ARCHES.includes(Deno.build.arch)) {
    return { absent: `no syscall numbers for ${Deno.build.arch}` };
  }
  const answer = askInProcess() ?? await askPerl();
  if (answer > 0) return { abi: answer };
  const reason = answer === -38
    ? "this kernel has no Landlock (ENOSYS)"
    : answer === -95
    ? "Landlock is disabled on this kernel (EOPNOTSUPP: not in the lsm= boot list)"
    : `the probe answered ${answer}`;
  return { absent: reason };
}

/**
 * landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION), asked by this process
 * through libc (1 ms): the ABI, or minus the error number. Undefined where this process may not
 * load a library (a library user's `deno run` without --allow-ffi): `askPerl` then asks.
 */
function askInProcess(): number | undefined {
  let libc: Deno.DynamicLibrary<typeof LIBC> | undefined;
  try {
    libc = Deno.dlopen("libc.so.6", LIBC);
    const answer = Number(libc.symbols.syscall(444n, 0n, 0n, 1n));
    if (answer >= 0) return answer;
    const errno = libc.symbols.__errno_location();
    return errno === null ? -1 : -new Deno.UnsafePointerView(errno).getInt32();
  } catch {
    // No FFI permission, or no glibc: the Perl probe answers instead.
    return undefined;
  } finally {
    libc?.close();
  }
}

const LIBC = {
  syscall: { parameters: ["i64", "i64", "i64", "i64"], result: "i64" },
  __errno_location: { parameters: [], result: "pointer" },
} as const;

/** The same question asked by the Perl on PATH, as the launcher's (~20 ms); -1 where none runs. */
async function askPerl(): Promise<number> {
  const probe = await run([
    "perl",
    "-e",
    'my $v = syscall(444, 0, 0, 1); print $v < 0 ? "-" . ($! + 0) : $v',
  ], { clearEnv: true, timeoutMs: 30_000 }).catch(() => undefined);
  if (!probe) return -1;
  const answer = Number(probe.stdout.trim());
  return probe.exitCode === 0 && Number.isInteger(answer) ? answer : -1;
}
