/**
 * What the user names, as a careless or unlucky user names it: endless devices, FIFOs, oversized
 * and non-UTF-8 prompts (from files and stdin), YAML alias problems through every entry point of
 * the configuration, a malformed `sse` recording. Each is refused before anything starts — exit 2,
 * one `sandbox: error:` line naming the file and the problem, no stack trace — and nothing reached
 * the engine: a fake `docker` first on PATH records every call, and must have none. Each has its
 * twin: the same path with a good input gets past the checks (to the fake engine, which is down).
 */
import assert from "node:assert/strict";
import type { RunResult } from "../../lib/process.ts";
import {
  assertDocker,
  dockerTest,
  explain,
  removeProfile,
  ROOT,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { fakeDocker } from "../unit/_fake_docker.ts";

console.error("e2e: input limits starting");

const STACK = /^\s+at |file:\/\/|internal error/m;
const MIB = 1024 * 1024;
const RECORDING = `${ROOT}/examples/hello/recording.json`;

/** The engine is down: whatever reaches it fails as a stopped engine does (exit 125 for the CLI). */
const ENGINE_DOWN =
  `echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2; exit 1`;

async function setup() {
  const dir = await tempDir("sandbox-e2e-input-");
  const docker = await fakeDocker(ENGINE_DOWN);
  const profile = uniqueProfile("e2e-input");
  const d = dir.path;
  const config = await writeConfig(
    d,
    `profiles:\n  ${profile}:\n    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: SANDBOX_E2E_NEVER_SET_KEY}}\n` +
      `  small:\n    llm: {provider: custom, base_url: "http://127.0.0.1:9/v1", key: {env: SANDBOX_E2E_NEVER_SET_KEY}, max_request_body: 1m}\n`,
  );
  await Deno.writeTextFile(`${d}/prompt.txt`, "Say hi\n");
  const env = {
    PATH: `${docker.dir}:${Deno.env.get("PATH")}`,
    XDG_CONFIG_HOME: `${d}/xdg`,
    XDG_STATE_HOME: `${d}/state`,
    SANDBOX_CONFIG: "",
    SANDBOX_E2E_NEVER_SET_KEY: "",
  };
  const cli = (
    args: string[],
    options: { env?: Record<string, string>; stdin?: Uint8Array | string; config?: string } = {},
  ) =>
    runCli(args, {
      config: options.config ?? config,
      env: { ...env, ...options.env },
      stdin: options.stdin,
      cwd: d,
      timeoutMs: 120_000,
    });
  /** `run agentic` with this prompt file, replaying `recording`. */
  const replay = (
    promptFile: string,
    recording = RECORDING,
    more: string[] = [],
  ) => [
    "run",
    "agentic",
    "-p",
    profile,
    "--prompt-file",
    promptFile,
    "-m",
    `replay:${recording}`,
    ...more,
  ];
  return {
    d,
    config,
    profile,
    docker,
    cli,
    replay,
    async [Symbol.asyncDispose]() {
      await docker[Symbol.asyncDispose]();
      await dir[Symbol.asyncDispose]();
    },
  };
}

/** Exit 2, one error line as `says` (a whole line), no stack, nothing on stdout. */
function assertRefused(result: RunResult, says: RegExp, what: string): void {
  const context = `${what}\n${explain(result)}`;
  assert.equal(result.exitCode, 2, context);
  assert.match(result.stderr, new RegExp(says.source, "m"), context);
  assert.equal(result.stderr.match(/^sandbox: error:/gm)?.length, 1, context);
  assert.doesNotMatch(result.stderr, STACK, `a stack trace\n${context}`);
  assert.equal(result.stdout, "", context);
}

/** Past the checks: the run went on to the engine (down here: 125), so the input was accepted. */
function assertAccepted(result: RunResult, what: string): void {
  const context = `${what}\n${explain(result)}`;
  assert.equal(result.exitCode, 125, context);
  assert.match(result.stderr, /Cannot connect to the Docker daemon|docker/i, context);
  assert.doesNotMatch(result.stderr, STACK, `a stack trace\n${context}`);
}

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}

/**
 * A FIFO at `path` and a writer that writes `command`'s output into it; it ends when its reader
 * goes (SIGPIPE), and is killed on dispose if no reader ever came (a CLI that stopped before).
 */
async function fifoWriter(
  path: string,
  command: string,
): Promise<AsyncDisposable & { status: Promise<Deno.CommandStatus> }> {
  const made = await new Deno.Command("mkfifo", { args: [path] }).output();
  assert.equal(made.code, 0, "mkfifo failed");
  const child = new Deno.Command("sh", {
    args: ["-c", `${command} > '${path}'`],
    stdout: "null",
    stderr: "null",
  }).spawn();
  let ended = false;
  const status = child.status.finally(() => ended = true);
  return {
    status,
    async [Symbol.asyncDispose]() {
      if (!ended) child.kill("SIGKILL");
      await status;
    },
  };
}

Deno.test("endless and oversized inputs are refused at their limit, read with a bound, before the engine is asked anything", async (t) => {
  await using s = await setup();
  const { d } = s;
  await t.step(
    "a character device that never ends, as the prompt and as the recording",
    async () => {
      assertRefused(
        await s.cli(s.replay("/dev/zero")),
        /^sandbox: error: Prompt file "\/dev\/zero" is larger than 4 MiB, the limit for a prompt$/,
        "prompt /dev/zero",
      );
      assertRefused(
        await s.cli(s.replay(`${d}/prompt.txt`, "/dev/zero")),
        /^sandbox: error: Recording "\/dev\/zero" is larger than 64 MiB, the limit for a recording$/,
        "replay:/dev/zero",
      );
    },
  );
  await t.step("a FIFO whose writer never stops", async () => {
    const fifo = `${d}/endless.fifo`;
    await using writer = await fifoWriter(fifo, "exec yes");
    const result = await s.cli(s.replay(fifo));
    // The writer ends with the CLI's read (SIGPIPE): nothing went on reading it.
    assert.equal((await writer.status).signal, "SIGPIPE", explain(result));
    assertRefused(
      result,
      new RegExp(
        `^sandbox: error: Prompt file "${
          escape(fifo)
        }" is larger than 4 MiB, the limit for a prompt$`,
      ),
      "endless FIFO",
    );
  });
  await t.step("a prompt file and a prompt on stdin one byte past the limit", async () => {
    const big = "x".repeat(4 * MIB + 1);
    await Deno.writeTextFile(`${d}/big.txt`, big);
    assertRefused(
      await s.cli(s.replay(`${d}/big.txt`)),
      /^sandbox: error: Prompt file ".*big\.txt" is larger than 4 MiB, the limit for a prompt$/,
      "big file",
    );
    assertRefused(
      await s.cli(s.replay("-"), { stdin: big }),
      /^sandbox: error: Prompt on stdin is larger than 4 MiB, the limit for a prompt$/,
      "big stdin",
    );
    assertRefused(
      await s.cli([...s.replay(`${d}/prompt.txt`), "--instructions-file", `${d}/big.txt`]),
      /^sandbox: error: Instructions file ".*big\.txt" is larger than 4 MiB/,
      "big instructions",
    );
  });
  await t.step(
    "a prompt within the file limit but past what the profile's LLM request can carry (a 413 mid-run otherwise)",
    async () => {
      await Deno.writeTextFile(`${d}/600k.txt`, "x".repeat(600 * 1024));
      const result = await s.cli([
        "run",
        "agentic",
        "-p",
        "small",
        "--prompt-file",
        `${d}/600k.txt`,
        "-m",
        `replay:${RECORDING}`,
      ]);
      assertRefused(
        result,
        /^sandbox: error: The prompt \(600 KiB\) is too large for an LLM request: at most 512 KiB, half of profiles\.small\.llm\.max_request_body \(1 MiB\)$/,
        "prompt past max_request_body",
      );
    },
  );
  await t.step("a configuration file that never ends", async () => {
    const result = await s.cli(["config", "validate"], { config: "/dev/zero" });
    assertRefused(
      result,
      /^sandbox: error: Invalid configuration in "\/dev\/zero"$/,
      "config /dev/zero",
    );
    assert.match(
      result.stderr,
      /^sandbox: {3}cannot read: larger than 1 MiB, the limit for a configuration file$/m,
    );
  });
  await t.step("nothing reached the engine", async () => {
    assert.deepEqual(await s.docker.calls(), []);
  });
  await t.step(
    "the twins: a prompt at the limit, through a FIFO, on stdin, get past the checks to the engine",
    async () => {
      await Deno.writeTextFile(`${d}/limit.txt`, "x".repeat(4 * MIB));
      assertAccepted(await s.cli(s.replay(`${d}/limit.txt`)), "prompt at the limit");
      const fifo = `${d}/small.fifo`;
      await using writer = await fifoWriter(fifo, "printf 'Say hi'");
      assertAccepted(await s.cli(s.replay(fifo)), "prompt through a FIFO");
      assert.equal((await writer.status).code, 0);
      assertAccepted(await s.cli(s.replay("-"), { stdin: "Say hi\n" }), "prompt on stdin");
      assert.ok((await s.docker.calls()).length > 0, "the accepted runs never reached the engine");
    },
  );
});

Deno.test("a prompt that is not UTF-8 is refused, naming the file and the offset of the first bad byte", async () => {
  await using s = await setup();
  // "Résumé" in Latin-1: the é at offset 1 is no UTF-8.
  await Deno.writeFile(
    `${s.d}/latin1.txt`,
    new Uint8Array([0x52, 0xe9, 0x73, 0x75, 0x6d, 0xe9, 0x0a]),
  );
  assertRefused(
    await s.cli(s.replay(`${s.d}/latin1.txt`)),
    /^sandbox: error: Prompt file ".*latin1\.txt" is not UTF-8 text: invalid byte at offset 1$/,
    "latin-1 file",
  );
  assertRefused(
    await s.cli(s.replay("-"), { stdin: new Uint8Array([0x68, 0x69, 0x20, 0xc3, 0x28]) }),
    /^sandbox: error: Prompt on stdin is not UTF-8 text: invalid byte at offset 3$/,
    "bad stdin",
  );
  assert.deepEqual(await s.docker.calls(), []);
  // The twin: the same words in UTF-8.
  await Deno.writeTextFile(`${s.d}/utf8.txt`, "Résumé\n");
  assertAccepted(await s.cli(s.replay(`${s.d}/utf8.txt`)), "UTF-8 prompt");
});

Deno.test("YAML alias problems are configuration errors in every entry point: config validate, run, trust, $SANDBOX_CONFIG", async (t) => {
  await using s = await setup();
  const undefinedAlias = await writeConfig(s.d, `profiles:\n  work: *nope\n`, "undefined.yaml");
  const lines = ["laughs: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"];
  for (
    const [name, prev] of [["b", "a"], ["c", "b"], ["d", "c"], ["e", "d"], ["f", "e"], ["g", "f"]]
  ) {
    lines.push(`${name}: &${name} [${Array(9).fill(`*${prev}`).join(", ")}]`);
  }
  const bomb = await writeConfig(s.d, `${lines.join("\n")}\nprofiles: {work: {}}\n`, "bomb.yaml");
  const cases = [
    {
      file: undefinedAlias,
      problem:
        /^sandbox: {3}YAML alias: \*nope at line 2, column 9 names no anchor \(&nope\) set before it$/m,
    },
    {
      file: bomb,
      problem:
        /^sandbox: {3}YAML alias: Excessive alias count .*\(at most 100 alias expansions\)$/m,
    },
  ];
  for (const { file, problem } of cases) {
    const name = file.replace(/^.*\//, "");
    const entryPoints: [string, string[], Record<string, string>][] = [
      ["config validate FILE", ["config", "validate", file], {}],
      ["-c FILE run", [
        "-c",
        file,
        "run",
        "agentic",
        "-p",
        "work",
        "--prompt-file",
        `${s.d}/prompt.txt`,
        "-m",
        `replay:${RECORDING}`,
      ], {}],
      ["trust FILE", ["trust", file], {}],
      ["$SANDBOX_CONFIG with run", [
        "run",
        "agentic",
        "-p",
        "work",
        "--prompt-file",
        `${s.d}/prompt.txt`,
        "-m",
        `replay:${RECORDING}`,
      ], { SANDBOX_CONFIG: file }],
      ["$SANDBOX_CONFIG with runs", ["runs"], { SANDBOX_CONFIG: file }],
    ];
    for (const [how, args, env] of entryPoints) {
      await t.step(`${name} through ${how}`, async () => {
        // No --config from the fixture: the file under test is the only one named.
        const result = await runCli(args, {
          env: {
            PATH: `${s.docker.dir}:${Deno.env.get("PATH")}`,
            XDG_CONFIG_HOME: `${s.d}/xdg`,
            XDG_STATE_HOME: `${s.d}/state`,
            SANDBOX_CONFIG: "",
            ...env,
          },
          cwd: s.d,
          timeoutMs: 120_000,
        });
        assertRefused(
          result,
          new RegExp(`^sandbox: error: Invalid configuration in "${escape(file)}"$`),
          `${name} through ${how}`,
        );
        assert.match(result.stderr, problem, explain(result));
      });
    }
  }
  await t.step("nothing reached the engine", async () => {
    assert.deepEqual(await s.docker.calls(), []);
  });
  await t.step("the twin: aliases that resolve are a valid configuration", async () => {
    const good = await writeConfig(
      s.d,
      `profiles:\n  base: &base {llm: {provider: anthropic}}\n  work: *base\n`,
      "aliases.yaml",
    );
    const result = await runCli(["config", "validate", good], {
      env: { XDG_STATE_HOME: `${s.d}/state`, SANDBOX_CONFIG: "" },
      timeoutMs: 120_000,
    });
    assert.equal(result.exitCode, 0, explain(result));
    assert.match(result.stdout, /aliases\.yaml is valid \(profiles: .*\bbase, work\)/);
  });
});

Deno.test("a recording whose sse entry its client could not read is refused at load, not mid-run", async () => {
  await using s = await setup();
  const recording = {
    version: 1,
    kind: "openai",
    responses: [{ status: 200, sse: "data: {oops\n\ndata: [DONE]\n\n" }],
  };
  await Deno.writeTextFile(`${s.d}/bad-sse.json`, JSON.stringify(recording));
  const result = await s.cli(s.replay(`${s.d}/prompt.txt`, `${s.d}/bad-sse.json`));
  assertRefused(result, /^sandbox: error: Invalid recording ".*bad-sse\.json"$/, "bad sse");
  assert.match(
    result.stderr,
    /^sandbox: {3}responses\[0\]\.sse: the event at line 1: its data is not JSON \(nor "\[DONE\]"\)/m,
    explain(result),
  );
  assert.deepEqual(await s.docker.calls(), []);
  // The twin: the same stream, well formed.
  const good = {
    ...recording,
    responses: [{
      status: 200,
      sse: 'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n',
    }],
  };
  await Deno.writeTextFile(`${s.d}/good-sse.json`, JSON.stringify(good));
  assertAccepted(await s.cli(s.replay(`${s.d}/prompt.txt`, `${s.d}/good-sse.json`)), "good sse");
});

Deno.test({
  name:
    "a prompt piped on stdin runs a replay to its end in a real sandbox (the bound keeps a pipe working)",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir("sandbox-e2e-stdin-");
    const profile = uniqueProfile("e2e-stdin");
    const config = await writeConfig(dir.path, `profiles:\n  ${profile}: {}\n`);
    try {
      const result = await runCli([
        "run",
        "agentic",
        "-p",
        profile,
        "--prompt-file",
        "-",
        "-m",
        `replay:${RECORDING}`,
        "--format",
        "ndjson",
      ], {
        config,
        env: { XDG_STATE_HOME: `${dir.path}/state` },
        stdin: await Deno.readTextFile(`${ROOT}/examples/hello/prompt.txt`),
        timeoutMs: 240_000,
      });
      const context = explain(result);
      assert.equal(result.exitCode, 0, context);
      const last = JSON.parse(result.stdout.trim().split("\n").at(-1)!);
      assert.equal(last.type, "usage", context);
    } finally {
      await removeProfile(profile);
    }
  },
});
