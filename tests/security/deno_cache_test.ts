/**
 * Code planted in Deno's code cache for the programs that come after: the tool's worker and relay
 * load /opt/sandbox/*.js through a Deno cache, and V8 runs the compiled code it finds there. A
 * cache the sandbox user wrote to stays in the container's /tmp; the payload here copies every
 * job the worker is handed — a run's prompt and session token — to a file.
 *
 * Refused: every run gets a container no other run or `sandbox exec` has touched (its /tmp, and so
 * its /tmp/deno-dir, its own), destroyed after it (lib/sandbox/pool.ts). So the next run's worker
 * loads from a cache nobody wrote to: the payload never runs there, which the next run's own agent
 * checks from inside (the file the payload would write is not in its view). The twin: in the
 * poisoned container, a worker started on the cache the attacker kept runs the payload and hands
 * the job over.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { HeldLlm } from "../_held_llm.ts";
import { assertDocker, dockerTest, spawnCli } from "../_helpers.ts";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";

console.error("security: deno cache tests starting");

const POISON = await Deno.readTextFile(new URL("./_deno_cache_poison.ts", import.meta.url));
const STOLEN = "/workspace/.stolen-jobs";
const KEPT = "/workspace/.poisoned-deno-dir";
/** The next run's agent looks for what the payload would have written in its container. */
const LOOK =
  `echo HOST=$(hostname); echo STOLEN; cat ${STOLEN} 2>&1; echo STOLEN-END; ls -d ${KEPT} 2>&1`;

/** `sandbox run agentic` with `promptFile` to its end (exit 0): stdout and the run's id. */
async function runWith(
  fixture: RunFixture,
  promptFile: string,
): Promise<{ stdout: string; id: string }> {
  const stderr: string[] = [];
  const child = spawnCli([
    "run",
    "agentic",
    "--prompt-file",
    promptFile,
    "--profile",
    fixture.profile,
    "--format",
    "ndjson",
  ], {
    config: fixture.config,
    env: fixture.env,
    timeoutMs: CLI_TIMEOUT_MS,
    onStderrLine: (line) => stderr.push(line),
  });
  const [stdout, ended] = await Promise.all([new Response(child.stdout).text(), child.finished]);
  assert.equal(ended.exitCode, 0, `${stdout}\n${ended.stderrTail}`);
  const id = /^sandbox: run (\S+) \(/m.exec(stderr.join("\n"))?.[1];
  assert.ok(id, stderr.join("\n"));
  return { stdout, id };
}

/** What the attacker's payload wrote so far in `container` (read as root from outside; empty when nothing). */
async function stolen(container: string): Promise<string> {
  const read = await run([
    "docker",
    "exec",
    "--user",
    "0",
    container,
    "sh",
    "-c",
    `cat ${STOLEN} 2>/dev/null; true`,
  ]);
  assert.equal(read.exitCode, 0, read.stderr);
  return read.stdout;
}

/** The twin: a worker that loads its code from the cache the attacker kept runs the payload. */
async function assertPoisonWorks(container: string): Promise<void> {
  const twin = `TWIN-PROMPT-${crypto.randomUUID()}`;
  const job = JSON.stringify({
    mode: "agentic",
    prompt: twin,
    env: {},
    cwd: "/tmp",
    model: "none",
  });
  const started = await run(
    [
      "docker",
      "exec",
      "-i",
      "--user",
      "10001",
      "--env",
      `DENO_DIR=${KEPT}`,
      container,
      "deno",
      "run",
      "--allow-all",
      "--no-config",
      "/opt/sandbox/worker.js",
      "serve",
    ],
    { stdin: `${job}\n`, timeoutMs: 60_000 },
  );
  assert.match(
    await stolen(container),
    new RegExp(twin),
    `the poisoned cache did not run its payload (so the refusal proves nothing):\n${started.stderr}`,
  );
}

/** Until `docker container inspect` of `name` fails (a run's container is removed just after it). */
async function assertGone(name: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if ((await run(["docker", "container", "inspect", name])).exitCode !== 0) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.fail(`container ${name} is still there after its run`);
}

/**
 * The next run, whose prompt holds a secret: its worker got the job (the LLM saw the prompt), it
 * ran somewhere other than `poisoned`, and its own agent finds nothing the payload wrote there.
 */
async function assertNextRunSafe(
  fixture: RunFixture,
  llm: FakeLlm,
  poisoned: string,
): Promise<void> {
  const secret = `NEXT-RUN-PROMPT-${crypto.randomUUID()}`;
  const secretPrompt = `${fixture.dir.path}/secret.txt`;
  await Deno.writeTextFile(secretPrompt, `Do the private thing. ${secret}\n`);
  llm.script.push(toolCall("execute", { command: LOOK }), text("done"));
  const { stdout, id } = await runWith(fixture, secretPrompt);
  const context = stdout.slice(-3000);
  assert.match(stdout, /"content":"done"/, context);
  assert.ok(
    llm.requests.some((r) => JSON.stringify(r.body).includes(secret)),
    "the next run did not get its prompt",
  );
  const container = (await fixture.meta(id)).extra?.container;
  assert.ok(
    typeof container === "string" && container !== poisoned,
    `the next run was in ${container}, the poisoned one is ${poisoned}`,
  );
  const messages = stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
  const output =
    messages.find((m) => m.type === "tool_result" && m.tool_name === "execute")?.tool_output ?? "";
  assert.match(
    output,
    new RegExp(`^HOST=${container}$`, "m"),
    `the look did not run in the next run's container:\n${output}`,
  );
  const found = output.slice(output.indexOf("STOLEN\n") + 7, output.indexOf("STOLEN-END"));
  assert.match(
    found,
    /No such file or directory/,
    `the payload wrote in the next run's container:\n${output}`,
  );
  assert.ok(
    !found.includes(secret) && !found.includes("SANDBOX_LLM_TOKEN"),
    `the next run's job was stolen through the code cache:\n${output}`,
  );
  assert.match(
    output,
    new RegExp(`${KEPT}'?: No such file or directory`),
    `the poisoned cache is in the next run's container:\n${output}`,
  );
}

Deno.test({
  name:
    "code an agent plants in Deno's code cache never runs in the next run's worker, while a worker started on that cache runs it",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new HeldLlm([
      // Run 1: the hostile agent poisons every code cache it can reach.
      toolCall("write_file", { file_path: "/workspace/poison.ts", content: POISON }),
      toolCall("execute", {
        command: `deno run -A --no-config /workspace/poison.ts ${STOLEN} ${KEPT}`,
      }),
      text("planted"),
    ]);
    await using fixture = await RunFixture.make({
      prefix: "sec-denocache",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_DENO_CACHE_KEY",
      prompt: "Plant it\n",
    });
    // Run 1 is held after the poisoning (its third LLM request), so that the twin runs in its container.
    const held = llm.hold(3);
    const first = runWith(fixture, fixture.promptFile);
    first.catch(() => {});
    const planted = await held;
    const count = /POISONED (\d+)/.exec(planted);
    assert.ok(
      count && Number(count[1]) >= 1,
      `the attack did not poison any cache:\n${planted.slice(-3000)}`,
    );
    const poisoned = await fixture.liveContainer();
    await t.step(
      "twin: in run 1's container, a worker started on the poisoned cache runs the payload",
      async () => {
        await assertPoisonWorks(poisoned);
      },
    );
    llm.release();
    await first;
    await t.step("run 1's container is gone after it", async () => {
      await assertGone(poisoned);
    });
    await t.step(
      "the next run's worker never runs the payload: it is in another container, where nothing was written",
      async () => {
        await assertNextRunSafe(fixture, llm.fake, poisoned);
      },
    );
  },
});

Deno.test({
  name:
    "code a repository's script run by `sandbox exec` plants in Deno's code cache never runs in the worker or relay of the run after it",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new FakeLlm();
    await using fixture = await RunFixture.make({
      prefix: "sec-denoexec",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_DENO_EXEC_KEY",
      prompt: "unused\n",
    });
    await Deno.writeTextFile(`${fixture.dir.path}/poison.ts`, POISON);
    // `cp` needs the development sandbox running: `exec` starts it.
    const first = await fixture.cli(["exec", "-p", fixture.profile, "--", "true"]);
    assert.equal(first.exitCode, 0, first.stderr);
    const copied = await fixture.cli([
      "cp",
      "-p",
      fixture.profile,
      `${fixture.dir.path}/poison.ts`,
      ":poison.ts",
    ]);
    assert.equal(copied.exitCode, 0, copied.stderr);
    const exec = await fixture.cli([
      "exec",
      "-p",
      fixture.profile,
      "--",
      "deno",
      "run",
      "-A",
      "--no-config",
      "/workspace/poison.ts",
      STOLEN,
      KEPT,
    ]);
    assert.equal(exec.exitCode, 0, exec.stderr);
    assert.match(
      exec.stdout,
      /POISONED [1-9]/,
      `the script poisoned no cache:\n${exec.stdout}\n${exec.stderr}`,
    );
    await t.step(
      "the run after it never runs the payload: it is not in the development sandbox, and nothing was written where it is",
      async () => {
        await assertNextRunSafe(fixture, llm, fixture.container);
        assert.equal(
          await stolen(fixture.container),
          "",
          "a job reached the development sandbox's payload",
        );
      },
    );
    await t.step(
      "twin: in the development sandbox, a worker started on the poisoned cache runs the payload",
      async () => {
        await assertPoisonWorks(fixture.container);
      },
    );
  },
});
