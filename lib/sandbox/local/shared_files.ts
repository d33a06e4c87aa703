/**
 * The files every local sandbox reads the same — the seccomp program (seccomp.ts) and the
 * sandbox's /etc/passwd and /etc/group (bwrap.ts `LOCAL_USERS`) — written once per content, not per
 * sandbox: `<state>/local-files/<hash>/`, read-only, made whole in a temporary directory and renamed
 * into place, so that a reader sees all of it or none. Only the host reads them (the seccomp
 * program, by each command's launcher) or binds them read-only (passwd, group).
 */
import { sha256HexOf } from "../../hash.ts";
import { userStateDir } from "../../paths.ts";
import { LOCAL_USERS } from "./bwrap.ts";
import { seccompBytes } from "./seccomp.ts";

interface Content {
  files: Record<string, { bytes: Uint8Array; mode: number }>;
  hash: string;
}

let content: Promise<Content> | undefined;

/**
 * The directory of the shared files under the state directory in effect, written if this content
 * has none there yet. Its existence is checked every time (a stat): the state directory may change
 * or be emptied while this process lives.
 */
export async function sharedFiles(): Promise<string> {
  content ??= contentOf();
  const { files, hash } = await content;
  const parent = `${userStateDir()}/local-files`;
  const dir = `${parent}/${hash}`;
  if (await Deno.stat(dir).then(() => true, () => false)) return dir;
  await Deno.mkdir(parent, { recursive: true, mode: 0o700 });
  const partial = await Deno.makeTempDir({ dir: parent, prefix: ".partial-" });
  for (const [name, { bytes, mode }] of Object.entries(files)) {
    await Deno.writeFile(`${partial}/${name}`, bytes, { mode });
  }
  await Deno.chmod(partial, 0o755);
  try {
    await Deno.rename(partial, dir);
  } catch (error) {
    // Another process put the same content there first: theirs is used, ours removed.
    await Deno.remove(partial, { recursive: true });
    if (!await Deno.stat(dir).then(() => true, () => false)) throw error;
  }
  return dir;
}

/** The files and a hash of their names and contents (computed once per process). */
async function contentOf(): Promise<Content> {
  const encoder = new TextEncoder();
  const files: Record<string, { bytes: Uint8Array; mode: number }> = {
    "seccomp.bpf": { bytes: seccompBytes(), mode: 0o400 },
    passwd: { bytes: encoder.encode(LOCAL_USERS.passwd), mode: 0o444 },
    group: { bytes: encoder.encode(LOCAL_USERS.group), mode: 0o444 },
  };
  const all = Object.entries(files).flatMap(([name, { bytes }]) => [encoder.encode(name), bytes]);
  // Each part followed by a zero byte: no two contents join to the same bytes.
  const joined = new Uint8Array(all.reduce((n, part) => n + part.length + 1, 0));
  let at = 0;
  for (const part of all) {
    joined.set(part, at);
    at += part.length + 1;
  }
  return { files, hash: (await sha256HexOf(joined)).slice(0, 16) };
}
