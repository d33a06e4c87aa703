/**
 * The provider conformance suite: one set of contract tests that every implementation of the
 * sandbox seam (lib/sandbox/provider.ts: `SandboxLifecycle`, `RunSandbox`, `SandboxProvider`)
 * passes. Each `*_test.ts` beside this file registers it for one implementation:
 *
 *   providerContract({ name: "docker", isolated: true, open: ... });
 *
 * A new provider (local, Kubernetes, …) is one such file. The isolation properties (a timeout
 * ends the command's whole tree, a `setsid` child included; no acquire sees what an earlier one
 * did; release leaves nothing) are registered only for a target that declares itself isolated:
 * mode none runs on the host itself and has none of them (it says so: `isolated` is false).
 *
 * The items a target may not hold (the pids limit, no network, the relay, the key kept out) it
 * declares in `holds` (_holds.ts), and each is checked against that declaration, held or not.
 */
import assert from "node:assert/strict";
import type { RunSandbox, SandboxLifecycle } from "../../lib/sandbox/provider.ts";
import { SandboxError } from "../../lib/errors.ts";
import { checkNoNetwork, checkPidsLimit, checkRelayAndKey, type HoldsSubject } from "./_holds.ts";
import type { Holds } from "./_holds.ts";

/** One implementation under test, opened afresh for every test. */
export interface ConformanceTarget {
  /** Its name, first in every test's name. */
  name: string;
  /** Whether it isolates (the lifecycle's `isolated`): the isolation tests are registered only then. */
  isolated: boolean;
  /** What it holds of the pids limit, no network, the relay and the key kept out, and why not. */
  holds: Holds;
  /** Deno.test options, e.g. `ignore` where its engine is not available outside CI. */
  testOptions?: { ignore?: boolean };
  /** A lifecycle whose state is the test's own (its own state directory, a unique profile). */
  open(): Promise<ConformanceSubject>;
}

export interface ConformanceSubject extends AsyncDisposable, Omit<HoldsSubject, "holds"> {
  lifecycle: SandboxLifecycle;
  /** A directory inside `sandbox` that the sandbox user may write (made if needed). */
  scratch(sandbox: RunSandbox): Promise<string>;
  /** Isolated targets: the places the sandbox user can write, where a later sandbox must find nothing. */
  writable?: string[];
  /** Isolated targets: what exists of sandbox `name` now (containers, volumes, host records). */
  traces?(name: string): Promise<string[]>;
}

/** A shell command that prints `alive` or `gone` for the pid in file `$1` (a zombie is gone). */
const ALIVE =
  'p=$(cat "$1"); s=$(cut -d" " -f3 "/proc/$p/stat" 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ] && echo alive || echo gone';

/** Acquire a sandbox of `subject`, hand it to `fn`, release it whatever happens. */
async function withSandbox<T>(
  subject: ConformanceSubject,
  fn: (sandbox: RunSandbox) => Promise<T>,
): Promise<T> {
  const sandbox = await subject.lifecycle.acquire({ runId: crypto.randomUUID().slice(0, 8) });
  try {
    return await fn(sandbox);
  } finally {
    await sandbox.release();
  }
}

/** Register the contract's tests for `target`. */
export function providerContract(target: ConformanceTarget): void {
  const test = (name: string, fn: (t: Deno.TestContext) => Promise<void>) =>
    Deno.test({ name: `${target.name}: ${name}`, ...target.testOptions, fn });
  test("one acquired sandbox runs commands as the contract says", async (t) => {
    await using subject = await target.open();
    assert.equal(subject.lifecycle.isolated, target.isolated, "the lifecycle says what it is");
    await withSandbox(subject, async (sandbox) => {
      const scratch = await subject.scratch(sandbox);
      await operations(t, sandbox, scratch);
      await files(t, sandbox, scratch);
      await missingFiles(t, sandbox, scratch);
    });
  });
  test("the sandbox holds what the target declares of limits, network, relay and key", async (t) => {
    await using subject = await target.open();
    const held = { ...subject, holds: target.holds };
    const says = (item: keyof Holds) => {
      const declared = target.holds[item];
      return declared === true ? "held" : `declared not held: ${declared.not}`;
    };
    await withSandbox(subject, async (sandbox) => {
      await t.step(`no network (${says("noNetwork")})`, () => checkNoNetwork(held, sandbox));
      await t.step(
        `relay reachable (${says("relay")}), key absent (${says("keyAbsent")})`,
        () => checkRelayAndKey(held, sandbox),
      );
      // Last: past the limit, the sandbox's processes may linger until it is released.
      await t.step(`the pids limit (${says("pidsLimit")})`, () => checkPidsLimit(held, sandbox));
    });
  });
  if (target.isolated) isolation(test, target);
}

/** exec, its streams, stdin, cwd, env and timeout; execStream and execBytes. */
async function operations(t: Deno.TestContext, sandbox: RunSandbox, scratch: string) {
  const { provider } = sandbox;
  await t.step(
    "exec returns the command's exit code; non-zero is a result, not an error",
    async () => {
      assert.equal((await provider.exec(["true"])).exitCode, 0);
      assert.equal((await provider.exec(["sh", "-c", "exit 3"])).exitCode, 3);
    },
  );
  await t.step("exec keeps stdout and stderr apart", async () => {
    const result = await provider.exec(["sh", "-c", "echo out; echo err >&2"]);
    assert.equal(result.stdout, "out\n");
    assert.equal(result.stderr.trim().split("\n").at(-1), "err");
    assert.ok(!result.stdout.includes("err"));
  });
  await t.step("exec gives the command its stdin, bytes or text", async () => {
    assert.equal((await provider.exec(["cat"], { stdin: "hello\n" })).stdout, "hello\n");
    const bytes = new TextEncoder().encode("bytes\n");
    assert.equal((await provider.exec(["cat"], { stdin: bytes })).stdout, "bytes\n");
  });
  await t.step("exec runs in the given cwd with the given variables", async () => {
    const result = await provider.exec(["sh", "-c", 'pwd; echo "$CONFORMANCE_VALUE"'], {
      cwd: scratch,
      env: { CONFORMANCE_VALUE: "a value with spaces" },
    });
    const [cwd, value] = result.stdout.trimEnd().split("\n");
    assert.equal(await realPath(provider, cwd), await realPath(provider, scratch));
    assert.equal(value, "a value with spaces");
  });
  await t.step("a command past its timeout is stopped: timedOut, exit code 124", async () => {
    const result = await provider.exec(["sleep", "300"], { timeoutMs: 1_000 });
    assert.equal(result.timedOut, true);
    assert.equal(result.exitCode, 124);
  });
  await t.step("execStream yields stdout lines, then its outcome has the exit code", async () => {
    const stream = provider.execStream(["sh", "-c", "printf 'a\\nb\\n'; echo e >&2; exit 5"]);
    assert.deepEqual(await Array.fromAsync(stream), ["a", "b"]);
    const outcome = await stream.outcome;
    assert.equal(outcome.exitCode, 5);
    assert.equal(outcome.timedOut, false);
  });
  await t.step("execStream past its timeout raises a timeout", async () => {
    const stream = provider.execStream(["sleep", "300"], { timeoutMs: 1_000 });
    await Array.fromAsync(stream).catch(() => []);
    await assert.rejects(() => stream.outcome, (error: Error & { code?: string }) => {
      assert.equal(error.code, "timeout");
      return true;
    });
  });
  await t.step("execBytes gives stdout as exact bytes", async () => {
    const bytes = provider.execBytes(["printf", "\\000\\001\\377"]);
    const out = new Uint8Array(await new Response(bytes.stdout).arrayBuffer());
    assert.deepEqual([...out], [0, 1, 255]);
    assert.equal((await bytes.outcome).exitCode, 0);
  });
}

/** writeFile/readFile and copyIn/copyOut. */
async function files(t: Deno.TestContext, sandbox: RunSandbox, scratch: string) {
  const { provider } = sandbox;
  await t.step("writeFile writes what readFile reads, mode 0600 unless told", async () => {
    const data = new Uint8Array([0, 10, 13, 255, 65]);
    await provider.writeFile(`${scratch}/written.bin`, data);
    assert.deepEqual([...await provider.readFile(`${scratch}/written.bin`)], [...data]);
    const mode = await provider.exec(["stat", "-c", "%a", `${scratch}/written.bin`]);
    assert.equal(mode.stdout.trim(), "600");
    await provider.writeFile(`${scratch}/run.sh`, "echo ran\n", { mode: 0o755 });
    assert.equal((await provider.exec(["sh", "-c", `"${scratch}/run.sh"`])).stdout, "ran\n");
  });
  await t.step(
    "copyIn copies a host directory in; copyOut copies it back out the same",
    async () => {
      const host = await Deno.makeTempDir({ prefix: "sandbox-conformance-" });
      try {
        await Deno.mkdir(`${host}/in/sub`, { recursive: true });
        await Deno.writeTextFile(`${host}/in/top.txt`, "top\n");
        await Deno.writeTextFile(`${host}/in/sub/deep.txt`, "deep\n");
        await provider.copyIn(`${host}/in`, `${scratch}/copied`);
        const inside = await provider.exec(["cat", `${scratch}/copied/top.txt`]);
        assert.equal(inside.stdout, "top\n");
        await provider.copyOut(`${scratch}/copied`, `${host}/out`);
        assert.equal(await Deno.readTextFile(`${host}/out/top.txt`), "top\n");
        assert.equal(await Deno.readTextFile(`${host}/out/sub/deep.txt`), "deep\n");
      } finally {
        await Deno.remove(host, { recursive: true });
      }
    },
  );
}

/** A missing path is a `file_not_found`, read or copied out; beside it an existing file reads. */
async function missingFiles(t: Deno.TestContext, sandbox: RunSandbox, scratch: string) {
  const { provider } = sandbox;
  const isFileNotFound = (error: unknown) =>
    error instanceof SandboxError && error.code === "file_not_found" &&
    error.message.includes(`${scratch}/absent.txt`);
  await t.step(
    "readFile of a missing file raises file_not_found; an existing one reads",
    async () => {
      await assert.rejects(provider.readFile(`${scratch}/absent.txt`), isFileNotFound);
      await provider.writeFile(`${scratch}/present.txt`, "here\n");
      assert.equal(
        new TextDecoder().decode(await provider.readFile(`${scratch}/present.txt`)),
        "here\n",
      );
    },
  );
  await t.step("copyOut of a missing path raises file_not_found and writes nothing", async () => {
    const host = await Deno.makeTempDir({ prefix: "sandbox-conformance-" });
    try {
      await assert.rejects(
        provider.copyOut(`${scratch}/absent.txt`, `${host}/out`),
        isFileNotFound,
      );
      await assert.rejects(Deno.lstat(`${host}/out`), Deno.errors.NotFound);
    } finally {
      await Deno.remove(host, { recursive: true });
    }
  });
}

/** What a path is, resolved inside the sandbox (a temporary directory may be reached by a link). */
async function realPath(provider: RunSandbox["provider"], path: string): Promise<string> {
  return (await provider.exec(["realpath", "--", path])).stdout.trim();
}

/** The isolation properties: registered only for a target that isolates. */
function isolation(
  test: (name: string, fn: (t: Deno.TestContext) => Promise<void>) => void,
  target: ConformanceTarget,
): void {
  test("a timeout ends the command's whole tree, a setsid child included", async () => {
    await using subject = await target.open();
    await withSandbox(subject, async (sandbox) => {
      const { provider } = sandbox;
      const scratch = await subject.scratch(sandbox);
      const script = `setsid sh -c 'echo $$ > "$1/setsid.pid"; exec sleep 300' "$0" "$1" &
        sh -c 'echo $$ > "$1/child.pid"; exec sleep 300' "$0" "$1" &
        exec sleep 300`;
      const result = await provider.exec(["sh", "-c", script, "sh", scratch], {
        timeoutMs: 2_000,
      });
      assert.equal(result.timedOut, true);
      for (const name of ["child.pid", "setsid.pid"]) {
        const check = await provider.exec(["sh", "-c", ALIVE, "sh", `${scratch}/${name}`]);
        assert.equal(check.stdout.trim(), "gone", `${name}: ${check.stdout}${check.stderr}`);
      }
    });
  });
  test("acquire gives a sandbox no earlier acquire touched", async () => {
    await using subject = await target.open();
    const marker = `marker-${crypto.randomUUID()}`;
    await subject.lifecycle.fill({ wait: true });
    const first = await withSandbox(subject, async (sandbox) => {
      for (const dir of subject.writable!) {
        await sandbox.provider.writeFile(`${dir}/${marker}`, "left by the first sandbox\n");
      }
      return sandbox.name;
    });
    await subject.lifecycle.fill({ wait: true });
    await withSandbox(subject, async (sandbox) => {
      assert.notEqual(sandbox.name, first);
      const paths = subject.writable!.map((dir) => `${dir}/${marker}`);
      const found = await sandbox.provider.exec(["ls", "-d", "--", ...paths]);
      assert.notEqual(found.exitCode, 0, `found in the next sandbox: ${found.stdout}`);
      assert.equal(found.stdout, "");
    });
  });
  test("release leaves nothing of the sandbox (which existed until then)", async () => {
    await using subject = await target.open();
    const sandbox = await subject.lifecycle.acquire({ runId: crypto.randomUUID().slice(0, 8) });
    await sandbox.provider.writeFile(`${await subject.scratch(sandbox)}/work.txt`, "work\n");
    const before = await subject.traces!(sandbox.name);
    assert.ok(before.length > 0, "the sandbox is there before it is released");
    await sandbox.release();
    // A release may return before the removal ends (Docker's runs detached): wait for it,
    // generously; a trace that stays is the failure.
    let left = before;
    for (let attempt = 0; attempt < 240 && left.length > 0; attempt++) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      left = await subject.traces!(sandbox.name);
    }
    assert.deepEqual(left, [], `left behind: ${left.join(", ")} (before release: ${before})`);
  });
}
