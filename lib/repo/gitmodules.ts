/**
 * The quarantine's check of what a run's `.gitmodules` says, before its branch enters the user's
 * repository.
 *
 * `transfer.fsckObjects` checks a `.gitmodules` for names with `..` and URLs that look like
 * options, but lets control characters through: a submodule path ending in a carriage return is
 * written unquoted into `.git/config` by a git without the CVE-2025-48384 fix, read back without
 * it, and a checkout then writes through a link the repository planted. Here every `.gitmodules`
 * in a tree the sandbox sent (under each name git treats as one: any case, HFS+'s ignored
 * characters, NTFS's trailing dots and spaces and short names) is read by git's own config parser
 * (`git config --blob`), and a key or value holding a control character (U+0000–U+001F, U+007F),
 * or a file git cannot parse, refuses the whole result.
 */
import { ByteReader } from "../byte_reader.ts";
import { CommandExitError, SandboxError } from "../errors.ts";
import { run, spawn } from "../process.ts";

/** The largest tree or commit read whole (a directory of a million files takes ~40 MB). */
const MAX_OBJECT_BYTES = 256 * 1024 ** 2;
// deno-lint-ignore no-control-regex -- finding control characters is the point
const CONTROL = /[\u0000-\u001f\u007f]/;

/** Whether a tree entry's name is one git reads as `.gitmodules` (fsck's own test, in short). */
export function isGitmodulesName(name: string): boolean {
  const folded = name
    .replace(/[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]/g, "")
    .toLowerCase()
    .split(":")[0]
    .replace(/[. ]+$/, "");
  return folded === ".gitmodules" || /^gitmod~[1-4]$/.test(folded) || /^gi7eba~[1-9]$/.test(folded);
}

/**
 * Refuse (`exec_failed`) the result `head` in repository `repo` when a `.gitmodules` in a tree
 * reachable from it and not from `base` has a control character in a submodule's name, path,
 * URL or any other entry, or cannot be parsed.
 */
export async function assertPlainGitmodules(
  repo: string,
  head: string,
  base: string,
  signal?: AbortSignal,
): Promise<void> {
  for (const blob of await gitmodulesBlobs(repo, head, base, signal)) {
    const listed = await run(["git", "-C", repo, "config", "--blob", blob, "--list", "-z"], {
      signal,
    });
    if (listed.exitCode !== 0) {
      throw new CommandExitError(
        "exec_failed",
        `The sandbox's result has a .gitmodules (${blob}) that git cannot read: refused`,
        listed,
      );
    }
    for (const entry of listed.stdout.split("\0").filter(Boolean)) {
      const newline = entry.indexOf("\n");
      const key = newline === -1 ? entry : entry.slice(0, newline);
      const value = newline === -1 ? "" : entry.slice(newline + 1);
      if (CONTROL.test(key) || CONTROL.test(value)) {
        throw new SandboxError(
          "exec_failed",
          `The sandbox's result has a .gitmodules whose ${
            JSON.stringify(key)
          } holds a control character (${JSON.stringify(value)}): refused`,
          {
            detail:
              "Nothing was imported. A submodule path ending in a carriage return makes some git versions write outside the checkout (CVE-2025-48384)",
          },
        );
      }
    }
  }
}

/** The blobs named `.gitmodules` in the trees reachable from `head` and not from `base`. */
async function gitmodulesBlobs(
  repo: string,
  head: string,
  base: string,
  signal?: AbortSignal,
): Promise<Set<string>> {
  const listed = spawn(
    [
      "git",
      "-C",
      repo,
      "rev-list",
      "--objects",
      "--no-object-names",
      "--filter=object:type=tree",
      head,
      `^${base}`,
    ],
    { signal },
  );
  const batch = spawn(["git", "-C", repo, "cat-file", "--batch"], { stdin: listed.stdout, signal });
  const blobs = new Set<string>();
  try {
    await readTrees(
      new ByteReader(batch.stdout),
      (tree) => gitmodulesIn(tree).forEach((blob) => blobs.add(blob)),
    );
  } catch (error) {
    batch.kill();
    listed.kill();
    await Promise.all([listed.finished, batch.finished]);
    if (error instanceof SandboxError) throw error;
    throw new SandboxError(
      "exec_failed",
      `Cannot read the trees of the sandbox's result: ${(error as Error).message}`,
      { cause: error },
    );
  }
  for (const outcome of await Promise.all([listed.finished, batch.finished])) {
    if (outcome.exitCode !== 0) {
      throw new CommandExitError(
        "exec_failed",
        "Cannot list the trees of the sandbox's result",
        outcome,
      );
    }
  }
  return blobs;
}

/** `git cat-file --batch` output: each tree's body to `onTree`; anything unexpected throws. */
async function readTrees(reader: ByteReader, onTree: (body: Uint8Array) => void): Promise<void> {
  const decoder = new TextDecoder();
  for (;;) {
    const line = await reader.line(200);
    if (line === null) return;
    if (line === undefined) throw new Error("a malformed object header");
    const [oid, type, sizeText] = decoder.decode(line).split(" ");
    const size = Number(sizeText);
    if (!/^[0-9a-f]{40}$/.test(oid) || !Number.isSafeInteger(size)) {
      throw new Error(`an unexpected object "${decoder.decode(line)}"`);
    }
    if (size > MAX_OBJECT_BYTES) {
      throw new SandboxError(
        "exec_failed",
        `The sandbox's result has a ${type} (${oid}) larger than ${MAX_OBJECT_BYTES} bytes: refused`,
      );
    }
    const body = await reader.exact(size + 1);
    if (body.byteLength !== size + 1) throw new Error("truncated output");
    if (type === "tree") onTree(body.subarray(0, size));
  }
}

/** The blob ids of a tree's entries named `.gitmodules` (regular files; fsck refuses a link). */
function gitmodulesIn(tree: Uint8Array): string[] {
  const found: string[] = [];
  const decoder = new TextDecoder();
  let at = 0;
  while (at < tree.byteLength) {
    const space = tree.indexOf(0x20, at);
    const nul = tree.indexOf(0, space);
    if (space === -1 || nul === -1 || nul + 21 > tree.byteLength) {
      throw new Error("a malformed tree");
    }
    const mode = decoder.decode(tree.subarray(at, space));
    const name = decoder.decode(tree.subarray(space + 1, nul));
    if (mode.startsWith("100") && isGitmodulesName(name)) {
      found.push(
        Array.from(tree.subarray(nul + 1, nul + 21), (b) => b.toString(16).padStart(2, "0")).join(
          "",
        ),
      );
    }
    at = nul + 21;
  }
  return found;
}
