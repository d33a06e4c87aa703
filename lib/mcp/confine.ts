/**
 * Paths an MCP client names, confined to its environment's checkout — decided inside the sandbox,
 * where the path is used, never from host paths.
 *
 * Every file operation is one sandbox script: `CONFINE` resolves the path as the sandbox sees it
 * (`realpath -m`: every symlink that exists is followed, `..` is folded), refuses it unless the
 * result is the checkout or below it, and the operation then works on that resolved path only —
 * the path that was checked is the path that is used. A symlink the client made inside the
 * checkout that points out of it is therefore refused like the path it points to.
 *
 * This keeps the file tools to the checkout; it is not the isolation boundary. Commands
 * (`environment_run`) may read anything in the sandbox, which is the point of a sandbox: nothing
 * of the host is in it (docs/mcp.md).
 */
import { SandboxError } from "../errors.ts";
import type { SandboxProvider } from "../sandbox/provider.ts";

/** Exit codes of `CONFINE` and the operations after it (outside the range commands use). */
export const CONFINE_EXIT = {
  noRoot: 90,
  unresolvable: 91,
  outside: 92,
  notFile: 93,
  notDirectory: 94,
} as const;

/**
 * Sandbox script prefix: `$1` the checkout, `$2` the path (relative to the checkout, or
 * absolute); leaves `$root` and the resolved `$r`, or exits with a `CONFINE_EXIT` code.
 */
export const CONFINE = 'root=$(realpath -e -- "$1") || exit 90; ' +
  'case "$2" in /*) p=$2 ;; *) p=$root/$2 ;; esac; ' +
  'r=$(realpath -m -- "$p") || exit 91; ' +
  'case "$r" in "$root"|"$root"/*) ;; *) exit 92 ;; esac; ';

/** The operations, each run after `CONFINE` on `$r`. */
export const OPERATIONS = {
  /** `$3`: bytes at most. First line: the file's size; then its first `$3` bytes. */
  read: '[ -f "$r" ] || exit 93; stat -c %s -- "$r"; head -c "$3" -- "$r"',
  /** The content on stdin; parent directories made as needed. */
  write: '[ ! -d "$r" ] || exit 93; mkdir -p -- "$(dirname -- "$r")" && cat >"$r"',
  /** `$3`: depth, `$4`: entries at most. Lines `TYPE SIZE PATH` (PATH relative to `$r`). */
  list: '[ -d "$r" ] || exit 94; ' +
    'find "$r" -mindepth 1 -maxdepth "$3" -name .git -prune -o -printf "%y %s %P\\n" | ' +
    'LC_ALL=C sort -k3 | head -n "$4"',
  /**
   * `$3`: the pattern, `$4`: lines at most, `$5`: grep's flags (`-F` or `-E`, maybe `-i`).
   * Lines `PATH:LINE:TEXT`, PATH relative to the checkout; no match is not an error.
   */
  search: 'cd "$root" || exit 90; case "$r" in "$root") t=. ;; *) t=${r#"$root"/} ;; esac; ' +
    'grep -rnI --exclude-dir=.git $5 -e "$3" -- "$t" | sed "s|^\\./||" | head -n "$4"; true',
  /** A directory to run a command in: prints it. */
  dir: '[ -d "$r" ] || exit 94; printf "%s\\n" "$r"',
} as const;

export type Operation = keyof typeof OPERATIONS;

/** The argv of `operation` on `path` in checkout `root`, with its further arguments. */
export function confinedArgv(
  operation: Operation,
  root: string,
  path: string,
  args: string[] = [],
): string[] {
  return ["sh", "-c", CONFINE + OPERATIONS[operation], "sh", root, path, ...args];
}

/**
 * Run `operation` on `path` in the sandbox; its stdout. A path outside the checkout, missing or
 * of the wrong kind is a `usage` error naming it (the client's mistake, said as a tool error).
 */
export async function confined(
  provider: SandboxProvider,
  operation: Operation,
  target: { root: string; path: string },
  options: { args?: string[]; stdin?: Uint8Array | string; signal?: AbortSignal } = {},
): Promise<string> {
  const result = await provider.exec(
    confinedArgv(operation, target.root, target.path, options.args),
    {
      stdin: options.stdin,
      signal: options.signal,
      timeoutMs: 120_000,
    },
  );
  if (result.exitCode === 0) return result.stdout;
  throw confineError(result.exitCode, target, result.stderr);
}

/** The error for a `CONFINE_EXIT` code (or any other failure) on `target`. */
export function confineError(
  exitCode: number,
  target: { root: string; path: string },
  stderr: string,
): SandboxError {
  const named = `"${target.path}"`;
  switch (exitCode) {
    case CONFINE_EXIT.outside:
      return new SandboxError(
        "usage",
        `Path ${named} is outside the checkout ${target.root} (symlinks followed): refused`,
        { detail: "File tools work only inside the environment's checkout" },
      );
    case CONFINE_EXIT.notFile:
      return new SandboxError("usage", `Path ${named} is not a regular file`);
    case CONFINE_EXIT.notDirectory:
      return new SandboxError("usage", `Path ${named} is not a directory`);
    case CONFINE_EXIT.noRoot:
      return new SandboxError("container_not_found", `The checkout ${target.root} is gone`);
    default:
      return new SandboxError(
        "exec_failed",
        `Cannot use path ${named} in the sandbox: ${stderr.trim() || `exit ${exitCode}`}`,
      );
  }
}
