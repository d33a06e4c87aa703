/**
 * A run's agent plants code in Deno's code cache for the runs after it (the worker waiting for
 * the next run, and every later one, load /opt/sandbox/worker.js through a Deno cache, and a
 * cache the sandbox user wrote to stays in the container's /tmp after the run): the payload
 * copies every job the worker is handed — the next run's prompt and session token — to a file.
 *
 * Refused: each of the tool's Deno programs gets a cache of its own, copied from the image's
 * read-only one when it starts (scripts/sandbox-exec), so the next run's worker never reads what
 * an earlier run wrote; the prompt of the next run is in no file. The twin: the very cache the
 * agent poisoned, used by a worker started on it, runs the payload and hands the job over.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, spawnCli } from "../_helpers.ts";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";

console.error("security: deno cache tests starting");

const POISON = await Deno.readTextFile(new URL("./_deno_cache_poison.ts", import.meta.url));
const STOLEN = "/workspace/.stolen-jobs";
const KEPT = "/tmp/poisoned-deno-dir";

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

Deno.test({
  name: "code an agent plants in Deno's code cache never runs in the next run's worker, while a worker started on that cache runs it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const secret = `NEXT-RUN-PROMPT-${crypto.randomUUID()}`;
    await using llm = new FakeLlm([
      // Run 1: the hostile agent poisons every code cache it can reach.
      toolCall("write_file", { file_path: "/workspace/poison.ts", content: POISON }),
      toolCall("execute", { command: `deno run -A --no-config /workspace/poison.ts ${STOLEN} ${KEPT}` }),
      text("planted"),
      // Run 2: an ordinary run, whose prompt holds the secret.
      text("done"),
    ]);
    await using fixture = await RunFixture.make({ prefix: "sec-denocache", llmUrl: llm.baseUrl, keyEnv: "SEC_DENO_CACHE_KEY", prompt: "Plant it\n" });
    await runWith(fixture, fixture.promptFile);
    const planted = llm.requests.map((r) => JSON.stringify(r.body)).join("\n");
    const count = /POISONED (\d+)/.exec(planted);
    assert.ok(count && Number(count[1]) >= 1, `the attack did not poison any cache:\n${planted.slice(-3000)}`);

    // Run 2 is served by the worker run 1's lease started after it (and would be by any other).
    const secretPrompt = `${fixture.dir.path}/secret.txt`;
    await Deno.writeTextFile(secretPrompt, `Do the private thing. ${secret}\n`);
    const output = await runWith(fixture, secretPrompt);
    assert.match(output, /"content":"done"/);
    const after = await stolen(fixture.container);
    assert.ok(!after.includes(secret), `the next run's job was stolen through the code cache:\n${after}`);
    assert.ok(!after.includes("SANDBOX_LLM_TOKEN"), `a session token was stolen through the code cache:\n${after}`);

    // The twin: a worker that loads the code from the cache the agent poisoned runs the payload.
    const twin = `TWIN-PROMPT-${crypto.randomUUID()}`;
    const job = JSON.stringify({ mode: "agentic", prompt: twin, env: {}, cwd: "/tmp", model: "none" });
    const started = await run(
      ["docker", "exec", "-i", "--user", "10001", "--env", `DENO_DIR=${KEPT}`, fixture.container, "deno", "run", "--allow-all", "--no-config", "/opt/sandbox/worker.js", "serve"],
      { stdin: `${job}\n`, timeoutMs: 60_000 },
    );
    assert.match(await stolen(fixture.container), new RegExp(twin), `the poisoned cache did not run its payload (so the refusal proves nothing):\n${started.stderr}`);
  },
});
