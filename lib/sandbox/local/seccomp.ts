/**
 * The seccomp filter of sandbox mode local: a classic BPF program, built here as raw bytes, that
 * each command's launcher loads (launcher.ts) just before the command. It closes what the namespaces leave
 * open to an unprivileged process: terminal injection (`ioctl` `TIOCSTI`, `TIOCLINUX`), the
 * kernel keyring (`keyctl`, `add_key`, `request_key`), `bpf`, `perf_event_open`, `userfaultfd`,
 * tracing and reading other processes (`ptrace`, `process_vm_readv`/`writev`), new or other
 * namespaces (`unshare`, `setns`, `clone` with a namespace flag; `clone3`, whose flags a filter
 * cannot read, answers ENOSYS so that libc falls back to `clone`), sockets of a family no network
 * namespace confines (`AF_VSOCK`: the host's and the hypervisor's ports), and io_uring, whose
 * operations (a socket among them) no filter sees (ENOSYS: libraries fall back to plain calls).
 *
 * Layout (struct seccomp_data): nr at 0, arch at 4, args[i] at 16 + 8i (low half first on the
 * little-endian machines below). Another architecture is refused, not let through unfiltered.
 */
import { SandboxError } from "../../errors.ts";

/** Syscall numbers of one architecture. */
interface Arch {
  audit: number;
  /** x86_64: numbers from here on are the x32 ABI, refused. */
  x32Base?: number;
  nr: Record<Blocked | Unavailable | "ioctl" | "clone" | "socket", number>;
}

/** Refused as if the kernel had none (ENOSYS), so that callers take their fallback. */
type Unavailable = "clone3" | "io_uring_setup" | "io_uring_enter" | "io_uring_register";

type Blocked =
  | "keyctl"
  | "add_key"
  | "request_key"
  | "bpf"
  | "perf_event_open"
  | "userfaultfd"
  | "ptrace"
  | "process_vm_readv"
  | "process_vm_writev"
  | "unshare"
  | "setns";

const ARCHES: Record<string, Arch> = {
  x86_64: {
    audit: 0xc000003e,
    x32Base: 0x40000000,
    nr: {
      ioctl: 16,
      clone: 56,
      clone3: 435,
      socket: 41,
      io_uring_setup: 425,
      io_uring_enter: 426,
      io_uring_register: 427,
      keyctl: 250,
      add_key: 248,
      request_key: 249,
      bpf: 321,
      perf_event_open: 298,
      userfaultfd: 323,
      ptrace: 101,
      process_vm_readv: 310,
      process_vm_writev: 311,
      unshare: 272,
      setns: 308,
    },
  },
  aarch64: {
    audit: 0xc00000b7,
    nr: {
      ioctl: 29,
      clone: 220,
      clone3: 435,
      socket: 198,
      io_uring_setup: 425,
      io_uring_enter: 426,
      io_uring_register: 427,
      keyctl: 219,
      add_key: 217,
      request_key: 218,
      bpf: 280,
      perf_event_open: 241,
      userfaultfd: 282,
      ptrace: 117,
      process_vm_readv: 270,
      process_vm_writev: 271,
      unshare: 97,
      setns: 268,
    },
  },
};

/** The ioctl requests refused: push bytes into a terminal's input, or the console's. */
export const REFUSED_IOCTLS = { TIOCSTI: 0x5412, TIOCLINUX: 0x541c } as const;
/** The socket families refused: not confined by a network namespace. */
export const REFUSED_SOCKET_FAMILIES = { AF_VSOCK: 40 } as const;
/** CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET. */
const CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 |
  0x20000000 | 0x40000000;

const LD_W_ABS = 0x20;
const JEQ_K = 0x15;
const JGE_K = 0x35;
const JSET_K = 0x45;
const RET_K = 0x06;
const RET_ALLOW = 0x7fff0000;
const RET_KILL_PROCESS = 0x80000000;
const EPERM = 1;
const ENOSYS = 38;
const EAFNOSUPPORT = 97;
const retErrno = (errno: number) => 0x00050000 | errno;
const NR = 0;
const ARCH = 4;
const argLow = (i: number) => 16 + 8 * i;

type Insn = [code: number, jt: number, jf: number, k: number];

/** `nr` answers `errno`. */
function refuse(nr: number, errno = EPERM): Insn[] {
  return [[LD_W_ABS, 0, 0, NR], [JEQ_K, 0, 1, nr], [RET_K, 0, 0, retErrno(errno)]];
}

/**
 * `nr` whose argument `arg` (its low 32 bits, as the kernel reads an int) is one of `values`
 * answers `errno`; with any other value it is allowed.
 */
function refuseWhenArg(nr: number, arg: number, values: number[], errno: number): Insn[] {
  const body: Insn[] = [[LD_W_ABS, 0, 0, argLow(arg)]];
  values.forEach((value, i) => body.push([JEQ_K, values.length - i, 0, value]));
  body.push([RET_K, 0, 0, RET_ALLOW], [RET_K, 0, 0, retErrno(errno)]);
  return [[LD_W_ABS, 0, 0, NR], [JEQ_K, 0, body.length, nr], ...body];
}

/** clone with a namespace flag answers EPERM; any other clone is allowed. */
function refuseNamespaceClone(nr: number): Insn[] {
  const body: Insn[] = [
    [LD_W_ABS, 0, 0, argLow(0)],
    [JSET_K, 0, 1, CLONE_NAMESPACE_FLAGS],
    [RET_K, 0, 0, retErrno(EPERM)],
    [RET_K, 0, 0, RET_ALLOW],
  ];
  return [[LD_W_ABS, 0, 0, NR], [JEQ_K, 0, body.length, nr], ...body];
}

/** The filter's instructions for `arch` (a key of the table above). */
export function seccompProgram(arch: string = Deno.build.arch): Insn[] {
  const spec = ARCHES[arch];
  if (!spec) {
    throw new SandboxError(
      "unsupported",
      `Sandbox mode local has no seccomp filter for architecture "${arch}"`,
      { detail: 'Use sandbox mode "container" on this machine' },
    );
  }
  const program: Insn[] = [
    [LD_W_ABS, 0, 0, ARCH],
    [JEQ_K, 1, 0, spec.audit],
    [RET_K, 0, 0, RET_KILL_PROCESS],
  ];
  if (spec.x32Base !== undefined) {
    program.push([LD_W_ABS, 0, 0, NR], [JGE_K, 0, 1, spec.x32Base], [
      RET_K,
      0,
      0,
      retErrno(EPERM),
    ]);
  }
  program.push(...refuseWhenArg(spec.nr.ioctl, 1, Object.values(REFUSED_IOCTLS), EPERM));
  program.push(
    ...refuseWhenArg(spec.nr.socket, 0, Object.values(REFUSED_SOCKET_FAMILIES), EAFNOSUPPORT),
  );
  program.push(...refuseNamespaceClone(spec.nr.clone));
  for (const name of UNAVAILABLE) program.push(...refuse(spec.nr[name], ENOSYS));
  for (const name of BLOCKED) program.push(...refuse(spec.nr[name]));
  program.push([RET_K, 0, 0, RET_ALLOW]);
  return program;
}

/** The syscalls that answer ENOSYS. */
export const UNAVAILABLE: readonly Unavailable[] = [
  "clone3",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
];

/** The syscalls refused outright (EPERM). */
export const BLOCKED: readonly Blocked[] = [
  "keyctl",
  "add_key",
  "request_key",
  "bpf",
  "perf_event_open",
  "userfaultfd",
  "ptrace",
  "process_vm_readv",
  "process_vm_writev",
  "unshare",
  "setns",
];

/** The filter as bwrap reads it: `struct sock_filter` (u16 code, u8 jt, u8 jf, u32 k), little-endian. */
export function seccompBytes(program: Insn[] = seccompProgram()): Uint8Array {
  const bytes = new Uint8Array(program.length * 8);
  const view = new DataView(bytes.buffer);
  program.forEach(([code, jt, jf, k], i) => {
    view.setUint16(i * 8, code, true);
    view.setUint8(i * 8 + 2, jt);
    view.setUint8(i * 8 + 3, jf);
    view.setUint32(i * 8 + 4, k >>> 0, true);
  });
  return bytes;
}
