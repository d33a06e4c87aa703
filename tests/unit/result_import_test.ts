/**
 * The result import (`collectResult`): the sandbox's pack is streamed into the quarantine's
 * `git index-pack`, never held whole, and cut off past its cap. A provider fake answers the
 * in-sandbox steps; the packs are real ones made by git on this host, or an endless stream.
 */
import assert from "node:assert/strict";
import { collectResult, resolveLocalRepo, type RunWorktree } from "../../lib/repo/local.ts";
import { run, spawn } from "../../lib/process.ts";
import type { SandboxError } from "../../lib/errors.ts";
import type {
  ExecBytes,
  ExecOptions,
  ExecResult,
  SandboxProvider,
} from "../../lib/sandbox/provider.ts";
import { tempDir } from "../_helpers.ts";

async function git(dir: string, ...args: string[]): Promise<string> {
  const result = await run([
    "git",
    "-C",
    dir,
    "-c",
    "user.name=u",
    "-c",
    "user.email=u@x",
    ...args,
  ]);
  assert.equal(result.exitCode, 0, result.stderr);
  return result.stdout.trim();
}

/** The user's repository (one commit) and the sandbox's copy with one more on top. */
async function repositories(root: string) {
  const user = `${root}/user`;
  await Deno.mkdir(user);
  await git(user, "init", "-q", "-b", "main");
  await Deno.writeTextFile(`${user}/a.txt`, "a\n");
  await git(user, "add", ".");
  await git(user, "commit", "-qm", "base");
  const base = await git(user, "rev-parse", "HEAD");
  const sandbox = `${root}/sandbox`;
  await git(root, "clone", "-q", user, sandbox);
  await Deno.writeTextFile(`${sandbox}/b.txt`, "the agent's work\n");
  await git(sandbox, "add", ".");
  await git(sandbox, "commit", "-qm", "agent");
  const head = await git(sandbox, "rev-parse", "HEAD");
  return { user, sandbox, base, head };
}

/** Answers the in-sandbox steps of `collectResult`; `pack` is what the pack command streams. */
class ImportProvider implements Pick<SandboxProvider, "exec" | "execBytes"> {
  stopped = false;
  constructor(readonly head: string, readonly pack: () => ReadableStream<Uint8Array>) {}

  exec(_argv: readonly string[], _options?: ExecOptions): Promise<ExecResult> {
    // commitLeftovers: "nothing committed", the head, no refs.
    return Promise.resolve({
      exitCode: 0,
      stdout: `no\n${this.head}\n`,
      stderr: "",
      durationMs: 1,
      timedOut: false,
      oomKilled: false,
    });
  }

  execBytes(): ExecBytes {
    return {
      stdout: this.pack(),
      outcome: Promise.resolve({
        exitCode: 0,
        durationMs: 1,
        timedOut: false,
        oomKilled: false,
        stderrTail: "",
      }),
      stop: () => {
        this.stopped = true;
        return Promise.resolve();
      },
    };
  }
}

function worktreeFor(base: string): RunWorktree {
  return {
    bare: "/workspace/repos/x.git",
    path: "/workspace/worktrees/r",
    branch: "sandbox/r",
    targetBranch: "sandbox/r",
    base,
    refsBefore: [],
    sentBytes: 0,
  };
}

Deno.test("the run branch comes back through index-pack as a stream: the branch and the byte count arrive", async () => {
  await using dir = await tempDir();
  const { user, sandbox, base, head } = await repositories(dir.path);
  const provider = new ImportProvider(
    head,
    () =>
      spawn(["git", "-C", sandbox, "pack-objects", "--stdout", "--revs", "--thin", "-q"], {
        stdin: `${head}\n^${base}\n`,
      }).stdout,
  );
  const result = await collectResult(
    provider as unknown as SandboxProvider,
    await resolveLocalRepo(user),
    worktreeFor(base),
    { runId: "r" },
  );
  assert.equal(result.commit, head);
  assert.equal(await git(user, "rev-parse", "refs/heads/sandbox/r"), head);
  assert.equal(await git(user, "show", "sandbox/r:b.txt"), "the agent's work");
  assert.ok(result.receivedBytes > 0);
  assert.equal(provider.stopped, false);
});

Deno.test("a pack past the cap is cut off while it streams, the packer is stopped, and nothing is imported", async () => {
  await using dir = await tempDir();
  const { user, base, head } = await repositories(dir.path);
  const cap = 1024 ** 2;
  let produced = 0;
  // An endless but well-formed pack, so that index-pack keeps reading: one blob declared 32 GiB
  // long, its zlib stream fed from random bytes. What the sender produced before the refusal
  // shows the host read as it went.
  const endless = () => {
    const head = new Uint8Array([
      0x50,
      0x41,
      0x43,
      0x4b,
      0,
      0,
      0,
      2,
      0,
      0,
      0,
      1,
      0xb0,
      0x80,
      0x80,
      0x80,
      0x80,
      0x08,
    ]);
    const blob = new ReadableStream<BufferSource>({
      pull(controller) {
        controller.enqueue(crypto.getRandomValues(new Uint8Array(64 * 1024)));
      },
    }, { highWaterMark: 1 }).pipeThrough(new CompressionStream("deflate")).getReader();
    let sentHead = false;
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        // Ends at some point, so that a missing cap fails the test instead of hanging it.
        if (produced > 64 * cap) return controller.close();
        const chunk = sentHead ? (await blob.read()).value! : head;
        sentHead = true;
        produced += chunk.byteLength;
        controller.enqueue(chunk);
      },
      cancel: () => blob.cancel(),
    }, { highWaterMark: 1 });
  };
  const provider = new ImportProvider(head, endless);
  await assert.rejects(
    collectResult(
      provider as unknown as SandboxProvider,
      await resolveLocalRepo(user),
      worktreeFor(base),
      { runId: "r", maxBytes: cap },
    ),
    (error: SandboxError) =>
      error.code === "exec_failed" &&
      /sent back more than 1(\.0)? MiB of objects: refused/.test(error.message),
  );
  assert.equal(provider.stopped, true);
  assert.ok(produced < cap + 1024 ** 2, `the sender produced ${produced} bytes before the refusal`);
  assert.equal(
    (await run(["git", "-C", user, "rev-parse", "--verify", "-q", "refs/heads/sandbox/r"]))
      .exitCode,
    1,
  );
});

/** The sandbox's copy with one more commit adding `.gitmodules` (under `name`, in `dir`) with `text`. */
async function withGitmodules(root: string, text: string, name = ".gitmodules", dir = "") {
  const repos = await repositories(root);
  if (dir) await Deno.mkdir(`${repos.sandbox}/${dir}`, { recursive: true });
  await Deno.writeTextFile(`${repos.sandbox}/${dir ? `${dir}/` : ""}${name}`, text);
  await git(repos.sandbox, "add", "-A");
  await git(repos.sandbox, "commit", "-qm", "submodules");
  return { ...repos, head: await git(repos.sandbox, "rev-parse", "HEAD") };
}

function packProvider(sandbox: string, head: string, base: string): ImportProvider {
  return new ImportProvider(
    head,
    () =>
      spawn(["git", "-C", sandbox, "pack-objects", "--stdout", "--revs", "--thin", "-q"], {
        stdin: `${head}\n^${base}\n`,
      }).stdout,
  );
}

Deno.test("a .gitmodules whose entries hold control characters is refused in the quarantine, and nothing is imported; a plain one passes", async (t) => {
  const hostile: [string, string, string?, string?][] = [
    [
      "a path ending in a carriage return (CVE-2025-48384)",
      '[submodule "sub"]\n\tpath = "sub\r"\n\turl = https://example.com/sub.git\n',
    ],
    [
      "a name holding an escape character",
      '[submodule "a\u001bb"]\n\tpath = sub\n\turl = https://example.com/sub.git\n',
    ],
    [
      "a url with a tab",
      '[submodule "sub"]\n\tpath = sub\n\turl = "https://example.com/\tsub.git"\n',
    ],
    [
      "an NTFS-style name (.GITMODULES. in a subdirectory)",
      '[submodule "sub"]\n\tpath = "sub\r"\n',
      ".GITMODULES.",
      "deep/er",
    ],
  ];
  for (const [name, text, file, dir] of hostile) {
    await t.step(name, async () => {
      await using root = await tempDir();
      const { user, sandbox, base, head } = await withGitmodules(root.path, text, file, dir);
      await assert.rejects(
        collectResult(
          packProvider(sandbox, head, base) as unknown as SandboxProvider,
          await resolveLocalRepo(user),
          worktreeFor(base),
          { runId: "r" },
        ),
        (error: SandboxError) => {
          assert.equal(error.code, "exec_failed");
          assert.match(
            error.message,
            /^The sandbox's result has a \.gitmodules whose "submodule\..*" holds a control character \(.*\): refused$/,
          );
          return true;
        },
      );
      assert.equal(
        (await run(["git", "-C", user, "rev-parse", "--verify", "-q", "refs/heads/sandbox/r"]))
          .exitCode,
        1,
        "the branch was imported",
      );
      assert.equal(
        (await run(["git", "-C", user, "cat-file", "-e", head])).exitCode,
        1,
        "the commit was imported",
      );
    });
  }
  await t.step("a plain .gitmodules comes back with its branch (twin)", async () => {
    await using root = await tempDir();
    const text =
      '[submodule "lib/sub"]\n\tpath = lib/sub\n\turl = https://example.com/sub.git\n\tbranch = main\n';
    const { user, sandbox, base, head } = await withGitmodules(root.path, text);
    const result = await collectResult(
      packProvider(sandbox, head, base) as unknown as SandboxProvider,
      await resolveLocalRepo(user),
      worktreeFor(base),
      { runId: "r" },
    );
    assert.equal(result.commit, head);
    assert.equal(await git(user, "show", "sandbox/r:.gitmodules"), text.trimEnd());
  });
});
