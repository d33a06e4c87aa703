/**
 * Code planted in Deno's code cache for the programs that come after: the tool's worker and relay
 * load /opt/sandbox/*.js through a Deno cache, and V8 runs the compiled code it finds there. A
 * cache the sandbox user wrote to stays in the container's /tmp; the payload here copies every
 * job the worker is handed — the next run's prompt and session token — to a file.
 *
 * Refused: each of the tool's Deno programs gets a cache of its own, copied from the image's
 * read-only one when it starts (scripts/sandbox-exec `private_deno_dir`), so neither the next
 * run's waiting worker nor a worker or relay started after a `sandbox exec` reads what an earlier
 * command wrote (and a released lease empties /tmp besides: tests/security/run_leftovers_test.ts).
 * The twin: the very cache the attacker poisoned, used by a worker started on it, runs the payload
 * and hands the job over.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, spawnCli } from "../_helpers.ts";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";

console.error("security: deno cache tests starting");

const POISON = await Deno.readTextFile(new URL("./_deno_cache_poison.ts", import.meta.url));
const STOLEN = "/workspace/.stolen-jobs";
const KEPT = "/workspace/.poisoned-deno-dir";

async function runWith(fixture: RunFixture, promptFile: string): Promise<string> {
  const child = spawnCli(["run", "agentic", "--prompt-file", promptFile, "--profile", fixture.profile, "--format", "ndjson"], {
    config: fixture.config,
    env: fixture.env,
    timeoutMs: CLI_TIMEOUT_MS,
  });
  const [stdout, ended] = await Promise.all([new Response(child.stdout).text(), child.finished]);
  assert.equal(ended.exitCode, 0, `${stdout}\n${ended.stderrTail}`);
  return stdout;
}

/** What the attacker's payload wrote so far (read as root from outside; empty when nothing). */
async function stolen(container: string): Promise<string> {
  const read = await run(["docker", "exec", "--user", "0", container, "sh", "-c", `cat ${STOLEN} 2>/dev/null; true`]);
  assert.equal(read.exitCode, 0, read.stderr);
  return read.stdout;
}

/** The twin: a worker that loads its code from the cache the attacker kept runs the payload. */
async function assertPoisonWorks(container: string): Promise<void> {
  const twin = `TWIN-PROMPT-${crypto.randomUUID()}`;
  const job = JSON.stringify({ mode: "agentic", prompt: twin, env: {}, cwd: "/tmp", model: "none" });
  const started = await run(
    ["docker", "exec", "-i", "--user", "10001", "--env", `DENO_DIR=${KEPT}`, container, "deno", "run", "--allow-all", "--no-config", "/opt/sandbox/worker.js", "serve"],
    { stdin: `${job}\n`, timeoutMs: 60_000 },
  );
  assert.match(await stolen(container), new RegExp(twin), `the poisoned cache did not run its payload (so the refusal proves nothing):\n${started.stderr}`);
}

async function assertNextRunSafe(fixture: RunFixture, llm: FakeLlm): Promise<void> {
  const secret = `NEXT-RUN-PROMPT-${crypto.randomUUID()}`;
  const secretPrompt = `${fixture.dir.path}/secret.txt`;
  await Deno.writeTextFile(secretPrompt, `Do the private thing. ${secret}\n`);
  const output = await runWith(fixture, secretPrompt);
  assert.match(output, /"content":"done"/);
  assert.ok(llm.requests.some((r) => JSON.stringify(r.body).includes(secret)), "the next run did not get its prompt");
  const after = await stolen(fixture.container);
  assert.ok(!after.includes(secret), `the next run's job was stolen through the code cache:\n${after}`);
  assert.ok(!after.includes("SANDBOX_LLM_TOKEN"), `a session token was stolen through the code cache:\n${after}`);
}

Deno.test({
  name: "code an agent plants in Deno's code cache never runs in the next run's worker, while a worker started on that cache runs it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([
      // Run 1: the hostile agent poisons every code cache it can reach.
      toolCall("write_file", { file_path: "/workspace/poison.ts", content: POISON }),
      toolCall("execute", { command: `deno run -A --no-config /workspace/poison.ts ${STOLEN} ${KEPT}` }),
      text("planted"),
      // Run 2: an ordinary run, whose prompt holds the secret (served by the worker that run 1's
      // lease started after it).
      text("done"),
    ]);
    await using fixture = await RunFixture.make({ prefix: "sec-denocache", llmUrl: llm.baseUrl, keyEnv: "SEC_DENO_CACHE_KEY", prompt: "Plant it\n" });
    await runWith(fixture, fixture.promptFile);
    const planted = llm.requests.map((r) => JSON.stringify(r.body)).join("\n");
    const count = /POISONED (\d+)/.exec(planted);
    assert.ok(count && Number(count[1]) >= 1, `the attack did not poison any cache:\n${planted.slice(-3000)}`);
    await assertNextRunSafe(fixture, llm);
    await assertPoisonWorks(fixture.container);
  },
});

Deno.test({
  name: "code a repository's script run by `sandbox exec` plants in Deno's code cache never runs in the worker or relay of the run after it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using llm = new FakeLlm([text("done")]);
    await using fixture = await RunFixture.make({ prefix: "sec-denoexec", llmUrl: llm.baseUrl, keyEnv: "SEC_DENO_EXEC_KEY", prompt: "unused\n" });
    // The container's first command, an exec: nothing waits in it after that, so the run starts
    // its own worker after the script ran (`up` would leave one waiting, loaded before it).
    await Deno.writeTextFile(`${fixture.dir.path}/poison.ts`, POISON);
    const first = await fixture.cli(["exec", "-p", fixture.profile, "--", "true"]);
    assert.equal(first.exitCode, 0, first.stderr);
    const copied = await fixture.cli(["cp", "-p", fixture.profile, `${fixture.dir.path}/poison.ts`, ":poison.ts"]);
    assert.equal(copied.exitCode, 0, copied.stderr);
    const exec = await fixture.cli(["exec", "-p", fixture.profile, "--", "deno", "run", "-A", "--no-config", "/workspace/poison.ts", STOLEN, KEPT]);
    assert.equal(exec.exitCode, 0, exec.stderr);
    assert.match(exec.stdout, /POISONED [1-9]/, `the script poisoned no cache:\n${exec.stdout}\n${exec.stderr}`);
    await assertNextRunSafe(fixture, llm);
    await assertPoisonWorks(fixture.container);
  },
});
