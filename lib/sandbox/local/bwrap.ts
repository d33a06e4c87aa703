/**
 * The bubblewrap command line of sandbox mode local (docs/local.md).
 *
 * A sandbox is one *holder*: `bwrap --unshare-all … sh` whose namespaces the sandbox's commands
 * enter (launcher.ts): its network (only `lo`), so that the relay one command runs serves the
 * worker another runs on the same loopback; its pid namespace, so that killing the holder ends
 * every process of the sandbox; and its mount namespace, the sandbox's whole filesystem: the system
 * read-only and the sandbox's own directories, then the root remounted read-only. Nothing of this
 * user's home is bound, only the paths below. Each command gets its own user, ipc, uts and cgroup
 * namespace, a new session, no capabilities, no new privileges and the seccomp filter from the
 * launcher.
 */
import { SandboxError } from "../../errors.ts";
import { pathExists } from "../../paths.ts";
import { run } from "../../process.ts";

/** Perl inside the sandbox (perl-base, in every Debian system, under the /usr bound read-only). */
export const PERL = "/usr/bin/perl";
/** The sandbox user inside (the container's sandbox uid, for the same file ownership). */
export const LOCAL_UID = 10001;
/** Where the sandbox's own directories appear inside. */
export const LOCAL_PATHS = {
  workspace: "/workspace",
  home: "/home/sandbox",
  tmp: "/tmp",
  proxy: "/run/sandbox-proxy",
  cache: "/cache",
  /** Host programs bound in read-only: deno and the worker's bundle. */
  deno: "/opt/sandbox/bin/deno",
  worker: "/opt/sandbox/worker.js",
} as const;
/** The PATH of every command in the sandbox: deno first. */
export const LOCAL_PATH = "/opt/sandbox/bin:/usr/local/bin:/usr/bin:/bin";
/** Top-level system directories bound read-only (or re-made as the links they are). */
const SYSTEM_DIRS = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/**
 * What of /etc a command needs (name resolution, certificates, the dynamic linker, time
 * zone); never all of it: this user may be root, who can read /etc/shadow.
 */
const ETC_ENTRIES = [
  "hosts",
  "nsswitch.conf",
  "resolv.conf",
  "ssl",
  "ca-certificates",
  "ca-certificates.conf",
  "alternatives",
  "ld.so.cache",
  "ld.so.conf",
  "ld.so.conf.d",
  "localtime",
  "os-release",
  "mime.types",
  "gitconfig",
];

/** The sandbox's own /etc/passwd and /etc/group: its users, none of the host's names. */
export const LOCAL_USERS = {
  passwd:
    `root:x:0:0:root:/root:/bin/sh\nsandbox:x:${LOCAL_UID}:${LOCAL_UID}:sandbox:/home/sandbox:/bin/sh\n` +
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
  group: `root:x:0:\nsandbox:x:${LOCAL_UID}:\nnogroup:x:65534:\n`,
} as const;

/** The host directories of one sandbox (all made by the host, removed at release). */
export interface SandboxDirs {
  root: string;
  /** The files every sandbox reads the same: seccomp.bpf, passwd, group (shared_files.ts). */
  files: string;
  workspace: string;
  home: string;
  tmp: string;
  proxy: string;
}

/** What a sandbox binds besides its own directories. */
export interface HostPrograms {
  deno: string;
  worker?: string;
  /** The repository's object cache, read-only at /cache. */
  cache?: string;
  /**
   * An agent CLI's unpacked files (lib/agents/host_agent.ts), read-only at `at` (its
   * `agentDir`, under /opt/sandbox): only in the sandboxes of runs with that agent.
   */
  agent?: { dir: string; at: string };
}

/** The host's programs this mode needs, found once per process. */
export interface LocalTools {
  bwrap: string;
  /** Perl on the host, which runs each command's launcher (launcher.ts). */
  perl: string;
}

let found: Promise<LocalTools> | undefined;
let probed: Promise<LocalTools> | undefined;

/**
 * The programs mode local needs, found on PATH; else an exit-125 error. Whether user namespaces
 * work is not checked (that costs a bwrap): a sandbox that fails to start asks `localTools()` why.
 */
export function localPrograms(): Promise<LocalTools> {
  found ??= findTools();
  // A failed search is not kept: the user may install bwrap and try again in the same process.
  found.catch(() => found = undefined);
  return found;
}

/** The programs mode local needs, and a check that user namespaces work; else an exit-125 error. */
export function localTools(): Promise<LocalTools> {
  probed ??= probeTools();
  // A failed probe is not kept: the user may install bwrap and try again in the same process.
  probed.catch(() => probed = undefined);
  return probed;
}

async function which(program: string): Promise<string | undefined> {
  for (const dir of (Deno.env.get("PATH") ?? "/usr/bin:/bin").split(":")) {
    const path = `${dir || "."}/${program}`;
    const info = await Deno.stat(path).catch(() => undefined);
    if (info?.isFile && ((info.mode ?? 0) & 0o111) !== 0) return path;
  }
  return undefined;
}

async function findTools(): Promise<LocalTools> {
  const [bwrap, bash, perl, systemPerl] = await Promise.all(
    [which("bwrap"), which("bash"), which("perl"), pathExists(PERL)],
  );
  if (!bwrap) {
    throw new SandboxError(
      "unsupported",
      'Sandbox mode "local" needs bubblewrap: "bwrap" not found',
      {
        detail:
          "Install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)" +
          ', or use sandbox mode "container"',
      },
    );
  }
  if (!bash) {
    throw new SandboxError("unsupported", 'Sandbox mode "local" needs "bash"', {
      detail: "Install bash",
    });
  }
  if (!perl || !systemPerl) {
    throw new SandboxError(
      "unsupported",
      `Sandbox mode "local" needs Perl (${PERL}, on PATH): its command launcher and its relay are Perl programs`,
      { detail: "Install it (Debian/Ubuntu: perl-base; Fedora: perl-interpreter)" },
    );
  }
  return { bwrap, perl };
}

async function probeTools(): Promise<LocalTools> {
  const tools = await localPrograms();
  const { bwrap } = tools;
  const probe = await run(
    [bwrap, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "true"],
    {
      clearEnv: true,
      timeoutMs: 30_000,
    },
  );
  if (probe.exitCode !== 0) {
    throw new SandboxError(
      "unsupported",
      `Sandbox mode "local" needs unprivileged user namespaces, which this machine refuses: ${
        probe.stderr.trim().split("\n").at(-1) ?? `bwrap exited ${probe.exitCode}`
      }`,
      {
        detail:
          "Enable them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0; " +
          "Ubuntu 24.04+: kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap)" +
          ', or use sandbox mode "container"',
      },
    );
  }
  return tools;
}

/** The system read-only: /usr and its companions as they are on the host, and the /etc entries above. */
export async function systemArgs(): Promise<string[]> {
  const args: string[] = [];
  for (const name of SYSTEM_DIRS) {
    const info = await Deno.lstat(`/${name}`).catch(() => undefined);
    if (info?.isSymlink) args.push("--symlink", await Deno.readLink(`/${name}`), `/${name}`);
    else if (info?.isDirectory) args.push("--ro-bind", `/${name}`, `/${name}`);
  }
  for (const name of ETC_ENTRIES) {
    if (await Deno.lstat(`/etc/${name}`).then(() => true, () => false)) {
      args.push("--ro-bind", `/etc/${name}`, `/etc/${name}`);
    }
  }
  return args;
}

/**
 * Entries of /proc a process may write as root on the host: sysctls (`kernel.core_pattern` runs
 * a program as the host's root), the sysrq trigger, and the like. Their owner check looks at the
 * uid alone, and a command of a sandbox that root made is the host's uid 0 (in namespaces of its
 * own, with no capability): the holder mounts them read-only, as Docker does (bwrap does so for
 * /proc/irq and /proc/bus itself). Bound from the host's /proc: what they show is global, or the
 * reader's namespace's.
 */
const READ_ONLY_PROC = ["sys", "sysrq-trigger", "fs", "acpi", "scsi"];

/**
 * The device nodes bwrap's `--dev` binds from the host. For a sandbox that root made, a command
 * owns them (uid 0): a `chmod 000 /dev/null` inside would change the host's. The holder remounts
 * each read-only (their metadata unchangeable; reading and writing a device is not a change of its
 * file), keeping what bwrap set (nosuid) and not adding nodev, which would make them unusable.
 * Root's sandboxes only: an ordinary user's commands are that user on the host, to whom the nodes
 * are not writable, and its holder could not remount them (unprivileged, bwrap makes the mounts in
 * a user namespace outside the one its command runs in).
 */
const DEVICE_NODES = [
  "/dev/null",
  "/dev/zero",
  "/dev/full",
  "/dev/random",
  "/dev/urandom",
  "/dev/tty",
];

/** mount(2), by architecture (launcher.ts has the launcher's own). */
const MOUNT_SYSCALL: Record<string, number> = { x86_64: 165, aarch64: 40 };

/**
 * What the holder runs, as root of its user namespace: the device nodes made read-only
 * (`DEVICE_NODES`), then a read of its stdin, a pipe whose other end only the process that made it
 * holds. That process's death (SIGKILL included) closes it: the read ends, the holder's init
 * exits and its pid namespace, every command's included, dies with it. bwrap's
 * `--die-with-parent` alone does not hold as root (the holder was seen left under init).
 */
export function holderCommand(
  devices: readonly string[] = Deno.uid() === 0 ? DEVICE_NODES : [],
  arch: string = Deno.build.arch,
): string[] {
  const mount = MOUNT_SYSCALL[arch];
  if (mount === undefined) throw new TypeError(`No mount syscall number for ${arch}`);
  // A remount replaces a mount's flags: each keeps those it has (mountinfo's options; the kernel
  // refuses to clear one a less privileged namespace inherited locked, such as the host's noexec),
  // plus MS_RDONLY. syscall() may write into its string arguments: copies, never literals.
  const program = `my %flag = (ro => 1, nosuid => 2, nodev => 4, noexec => 8, noatime => 1024, ` +
    `nodiratime => 2048, relatime => 1 << 21, strictatime => 1 << 24); my %options; ` +
    `open(my $info, "<", "/proc/self/mountinfo") or die "sandbox: mountinfo: $!\\n"; ` +
    `while (<$info>) { my @field = split / /; $options{$field[4]} = $field[5] } close $info; ` +
    `for (@ARGV) { my ($source, $target) = ("none", $_); my $flags = 0x20 | 0x1000 | 0x1; ` +
    `$flags |= $flag{$_} // 0 for split /,/, $options{$target} // ""; ` +
    `syscall(${mount}, $source, $target, 0, $flags, 0) == 0 ` +
    `or die "sandbox: cannot make $target read-only: $!\\n" } ` +
    `syswrite(STDERR, "${HOLDER_READY}\\n"); 1 while sysread(STDIN, my $ignored, 4096);`;
  return [PERL, "-e", program, ...devices];
}
/**
 * What the holder's command says first, on stderr (bwrap closes its `--info-fd`, stdout, in the
 * child): it has started, so its namespaces are complete (the user namespace's id maps are
 * written before it runs).
 */
export const HOLDER_READY = "holder-ready";

/**
 * `argv` started with no descriptor of this process's but stdio. A child inherits whatever
 * descriptor lacks close-on-exec: Deno leaves `/dev/null` open on one, and a parent of this
 * process may leave a pipe of its own; in a sandbox either is a way out (a pipe another program
 * reads). bash closes every one above 2 and becomes `argv` (dash can redirect single digits only).
 */
export function withoutInheritedFds(argv: readonly string[]): string[] {
  return ["bash", "-c", CLOSE_INHERITED_FDS, "bash", ...argv];
}

/** bash: close every descriptor above stdio, then become the command. */
const CLOSE_INHERITED_FDS = "for f in /proc/$$/fd/*; do n=${f##*/}; " +
  'if [ "$n" -gt 2 ]; then eval "exec $n>&-"; fi; done; exec "$@"';

/**
 * The holder's command line (`system`: `systemArgs()`): the namespaces every command enters, and
 * in its mount namespace the sandbox's whole filesystem.
 */
export function holderArgv(
  tools: LocalTools,
  system: readonly string[],
  dirs: SandboxDirs,
  programs: HostPrograms,
): string[] {
  const bind = (from: string | undefined, to: string, ro = true): string[] =>
    from === undefined ? [] : [ro ? "--ro-bind" : "--bind", from, to];
  return [
    tools.bwrap,
    "--unshare-all",
    // Root of the holder's user namespace, which is this user on the host: a command entering it
    // has there the rights it needs to make namespaces of its own (launcher.ts), and no more.
    "--uid",
    "0",
    "--gid",
    "0",
    "--die-with-parent",
    "--new-session",
    ...system,
    "--proc",
    "/proc",
    ...READ_ONLY_PROC.flatMap((entry) => ["--ro-bind-try", `/proc/${entry}`, `/proc/${entry}`]),
    "--dev",
    "/dev",
    ...bind(`${dirs.files}/passwd`, "/etc/passwd"),
    ...bind(`${dirs.files}/group`, "/etc/group"),
    ...bind(dirs.workspace, LOCAL_PATHS.workspace, false),
    ...bind(dirs.home, LOCAL_PATHS.home, false),
    ...bind(dirs.tmp, LOCAL_PATHS.tmp, false),
    ...bind(dirs.proxy, LOCAL_PATHS.proxy),
    ...bind(programs.cache, LOCAL_PATHS.cache),
    ...bind(programs.deno, LOCAL_PATHS.deno),
    ...bind(programs.worker, LOCAL_PATHS.worker),
    ...(programs.agent ? bind(programs.agent.dir, programs.agent.at) : []),
    "--remount-ro",
    "/",
    // The child's pid, as soon as its namespaces exist, on stdout (read by the host).
    "--info-fd",
    "1",
    "--",
    ...holderCommand(),
  ];
}
