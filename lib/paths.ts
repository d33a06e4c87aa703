/** Where the user's configuration and state live (XDG base directories). */

/** `$XDG_CONFIG_HOME`, else `~/.config`. */
export function userConfigDir(): string {
  return Deno.env.get("XDG_CONFIG_HOME") || joinPath(homeDir(), ".config");
}

/** `$XDG_STATE_HOME/sandbox`, else `~/.local/state/sandbox`: run logs, trust, locks. */
export function userStateDir(): string {
  const base = Deno.env.get("XDG_STATE_HOME") || joinPath(homeDir(), ".local", "state");
  return joinPath(base, "sandbox");
}

/** `$XDG_CACHE_HOME/sandbox`, else `~/.cache/sandbox`: what can be fetched or made again. */
export function userCacheDir(): string {
  const base = Deno.env.get("XDG_CACHE_HOME") || joinPath(homeDir(), ".cache");
  return joinPath(base, "sandbox");
}

export function homeDir(): string {
  return Deno.env.get("HOME") ?? "/tmp";
}

/** Join with "/", collapsing repeated slashes. */
export function joinPath(...parts: string[]): string {
  return parts.join("/").replace(/\/+/g, "/");
}

/** `path` made absolute against `cwd`, with `.` and `..` resolved textually (no symlinks). */
export function absolutePath(path: string, cwd: string = Deno.cwd()): string {
  const parts: string[] = [];
  for (const part of (path.startsWith("/") ? path : `${cwd}/${path}`).split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") parts.pop();
    else parts.push(part);
  }
  return `/${parts.join("/")}`;
}

/** Is anything at `path` (a dangling symbolic link counts)? */
export async function pathExists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}
