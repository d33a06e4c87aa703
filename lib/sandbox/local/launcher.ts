/**
 * How a command enters a local sandbox (docs/local.md): one Perl program, started on the host,
 * that does in one process what bwrap and the steps around it did in six.
 *
 * In order, each step failing the command with exit 125 (a confinement that cannot be applied
 * must not be skipped):
 * 1. every descriptor above stdio closed (a parent may leave a pipe open; in a sandbox it is a way
 *    out);
 * 2. the sandbox's seccomp program read (seccomp.ts), its cgroup joined (limits.ts), or its rlimits
 *    set where it has no cgroup;
 * 3. the holder's user, mount, network and pid namespaces entered (bwrap.ts `holderArgv`: its mount
 *    namespace is the sandbox's whole filesystem, its root read-only), once the process whose
 *    namespaces were opened is known to be the holder still: the same pid and start time, or the
 *    sandbox has ended and nothing runs (a pid another process took is never entered); then a fork,
 *    since the pid namespace takes only children. The parent stays outside the sandbox, passes the
 *    host's TERM, INT, HUP and QUIT on, and ends as its child ended. The child:
 * 4. dies with that parent (`PR_SET_PDEATHSIG`), and gets a user, ipc, uts and cgroup namespace of
 *    its own: uid and gid 10001 (the holder's root, which is this user on the host), the hostname
 *    `sandbox`;
 * 5. a new session (no terminal to inject into), its working directory, no capability in its
 *    bounding set, no new privileges;
 * 6. the Landlock ruleset (landlock.ts) where the kernel has Landlock, then the seccomp filter,
 *    last: it refuses `unshare` and `setns`, which the steps above needed;
 * 7. the command's environment, exactly, then exec (127: not found, 126: cannot run). It reaches
 *    the launcher as its own environment, each name behind `ENV_PREFIX`, and nothing else does
 *    (`launcherCommand`): no name Perl, the dynamic loader or libc obeys (`PERL5OPT`, `LD_PRELOAD`)
 *    can act on the launcher, which runs on the host, and nothing of the host's reaches the
 *    command. Not as arguments: a command line is anyone's to read on the host (`ps`), an
 *    environment only its user's.
 *
 * It loads no module and calls the kernel by number (`SYSCALLS`: x86_64 and aarch64, the
 * architectures seccomp.ts supports). Every step but the namespaces is the same bwrap took.
 */

/** The syscalls the launcher calls by number, in the order its program reads their numbers. */
const CALLS = [
  "setns",
  "unshare",
  "sethostname",
  "setsid",
  "prctl",
  "seccomp",
  "prlimit64",
  "openat",
] as const;

/** Their numbers, by architecture. */
const SYSCALLS: Record<string, Record<(typeof CALLS)[number], number>> = {
  x86_64: {
    setns: 308,
    unshare: 272,
    sethostname: 170,
    setsid: 112,
    prctl: 157,
    seccomp: 317,
    prlimit64: 302,
    openat: 257,
  },
  aarch64: {
    setns: 268,
    unshare: 97,
    sethostname: 161,
    setsid: 157,
    prctl: 167,
    seccomp: 277,
    prlimit64: 261,
    openat: 56,
  },
};

/** rlimit resources (asm-generic/resource.h, the same on both). */
export const RLIMIT = { core: 4, nproc: 6 } as const;

/** What a variable of the command is called in the launcher's environment. */
const ENV_PREFIX = "SANDBOX_COMMAND_ENV_";

const PROGRAM = `
my ($setns, $unshare, $sethostname, $setsid, $prctl, $seccomp, $prlimit, $openat) =
  map { $_ + 0 } splice(@ARGV, 0, 8);
my ($holder, $started, $uid, $filter, $cwd) = splice(@ARGV, 0, 5);
sub fail { syswrite(STDERR, "sandbox: $_[0]: $!\\n"); exit 125 }
sub section { my @s; push @s, shift @ARGV while @ARGV && $ARGV[0] ne "--"; shift @ARGV; @s }
my @joins = section();
my @limits = section();
my @landlock = section();
my %env = map { /^${ENV_PREFIX}(.+)\\z/s ? ($1, $ENV{$_}) : () } keys %ENV;
%ENV = ();
if (syscall(436, 3, 0xffffffff, 0) != 0) {
  opendir(my $fds, "/proc/self/fd") or fail("list descriptors");
  for (grep { /^\\d+$/ && $_ > 2 && $_ != fileno($fds) } readdir $fds) { open(my $h, "<&=", $_) and close $h }
  closedir $fds;
}
open(my $f, "<", $filter) or fail("open $filter");
my $program = do { local $/; <$f> };
close $f;
for (@joins) {
  open(my $j, ">>", $_) or fail("cannot join the sandbox cgroup $_");
  syswrite($j, "$$\\n") or fail("cannot join the sandbox cgroup $_");
  close $j;
}
while (my ($resource, $value) = splice(@limits, 0, 2)) {
  syscall($prlimit, 0, $resource + 0, pack("QQ", $value, $value), 0) == 0 or fail("prlimit $resource");
}
# The holder's namespaces, but one this process is in already (entering it again would need a
# right the holder's user namespace does not give).
my @ns;
for my $kind (qw(user mnt net pid)) {
  open(my $n, "<", "/proc/$holder/ns/$kind") or fail("the sandbox has ended (its $kind namespace)");
  my @there = stat $n;
  my @here = stat "/proc/self/ns/$kind";
  push @ns, $n unless @here && $here[0] == $there[0] && $here[1] == $there[1];
}
# Opened while the holder lived, if it lives now with the same start: a pid is not reused while
# its process lives.
open(my $stat, "<", "/proc/$holder/stat") or fail("the sandbox has ended");
# After the last ") ": a name (field 2) may hold ") " itself.
my @fields = split / /, (<$stat> =~ /.*\\) (.*)/s)[0];
$fields[19] eq $started or fail("the sandbox has ended (process $holder is another)");
for (@ns) { syscall($setns, fileno($_), 0) == 0 or fail("cannot enter the sandbox (setns)") }
close $_ for @ns;
my $child = fork() // fail("fork");
if ($child) {
  my @passed = qw(TERM INT HUP QUIT);
  $SIG{$_} = sub { kill $_[0], $child } for @passed;
  1 while waitpid($child, 0) < 0 && $! + 0 == 4;
  my $signal = $? & 127;
  exit($? >> 8) unless $signal;
  $SIG{$_} = "DEFAULT" for @passed;
  kill $signal, $$;
  exit 128 + $signal;
}
syscall($prctl, 1, 9, 0, 0, 0) == 0 or fail("prctl(PR_SET_PDEATHSIG)");
exit 125 if getppid() != 0;
syscall($unshare, 0x10000000 | 0x08000000 | 0x04000000 | 0x02000000) == 0
  or syscall($unshare, 0x10000000 | 0x08000000 | 0x04000000) == 0 or fail("unshare");
for (["setgroups", "deny"], ["uid_map", "$uid 0 1"], ["gid_map", "$uid 0 1"]) {
  open(my $m, ">", "/proc/self/$_->[0]") or fail("open /proc/self/$_->[0]");
  syswrite($m, $_->[1]) or fail("write /proc/self/$_->[0]");
  close $m;
}
my $hostname = "sandbox";
syscall($sethostname, $hostname, length $hostname) == 0 or fail("sethostname");
syscall($setsid) >= 0 or fail("setsid");
chdir($cwd) or fail("cannot enter $cwd");
for my $cap (0 .. 63) {
  next if syscall($prctl, 24, $cap, 0, 0, 0) == 0;
  last if $! + 0 == 22;
  fail("prctl(PR_CAPBSET_DROP)");
}
syscall($prctl, 38, 1, 0, 0, 0) == 0 or fail("prctl(PR_SET_NO_NEW_PRIVS)");
if (@landlock) {
  my $handled = shift @landlock;
  my $ruleset = syscall(444, pack("QQQ", $handled, 0, 0), 8, 0);
  fail("landlock_create_ruleset") if $ruleset < 0;
  while (my ($rights, $path) = splice(@landlock, 0, 2)) {
    my $fd = syscall($openat, -100, $path, 0x200000 | 0x80000);
    if ($fd < 0) { next if $! + 0 == 2; fail("landlock: open $path") }
    syscall(445, $ruleset, 1, pack("QL", $rights + 0, $fd), 0) == 0 or fail("landlock: add $path");
  }
  syscall(446, $ruleset, 0) == 0 or fail("landlock_restrict_self");
}
syscall($seccomp, 1, 0, pack("S x6 P", length($program) / 8, $program)) == 0 or fail("seccomp");
%ENV = %env;
exec { $ARGV[0] } @ARGV;
syswrite(STDERR, "sandbox: cannot run $ARGV[0]: $!\\n");
exit($! + 0 == 2 ? 127 : 126);
`;

/** What the launcher needs to start one command in a sandbox. */
export interface Launch {
  /** Perl on the host (bwrap.ts `LocalTools`). */
  perl: string;
  /**
   * The holder's first process, whose namespaces are entered: its host pid, and when it started
   * (clock ticks since boot, /proc/PID/stat's 22nd field). A pid is the holder's only while the
   * holder lives; a process that has the pid and another start is not entered.
   */
  holder: { pid: number; startTicks: number };
  /** The uid (and gid) the command runs as. */
  uid: number;
  /** The seccomp program's file (on the host). */
  seccompFile: string;
  /** The cgroup.procs files the command joins (none without a cgroup). */
  cgroupJoins: readonly string[];
  /** rlimits set where no cgroup holds the limits: `[RLIMIT.x, value]` pairs. */
  rlimits: readonly (readonly [resource: number, value: number])[];
  /** Landlock's handled rights and its `[rights, path]` rules; undefined where the kernel has none. */
  landlock?: { handled: number; rules: readonly (readonly [rights: number, path: string])[] };
  cwd: string;
  env: Readonly<Record<string, string>>;
  argv: readonly string[];
}

/** A host process to start: its argv, and its whole environment (nothing of the host's added). */
export interface HostCommand {
  argv: string[];
  env: Record<string, string>;
}

/** The host process that runs `launch.argv` in the sandbox. */
export function launcherCommand(launch: Launch): HostCommand {
  const numbers = SYSCALLS[Deno.build.arch];
  if (!numbers) throw new TypeError(`No syscall numbers for ${Deno.build.arch}`);
  const argv = [
    launch.perl,
    "-e",
    PROGRAM,
    ...CALLS.map((name) => String(numbers[name])),
    String(launch.holder.pid),
    String(launch.holder.startTicks),
    String(launch.uid),
    launch.seccompFile,
    launch.cwd,
    ...launch.cgroupJoins,
    "--",
    ...launch.rlimits.flatMap(([resource, value]) => [String(resource), String(value)]),
    "--",
    ...(launch.landlock
      ? [
        String(launch.landlock.handled),
        ...launch.landlock.rules.flatMap(([rights, path]) => [String(rights), path]),
      ]
      : []),
    "--",
    ...launch.argv,
  ];
  const env = Object.fromEntries(
    Object.entries(launch.env).map(([name, value]) => [`${ENV_PREFIX}${name}`, value]),
  );
  return { argv, env };
}
