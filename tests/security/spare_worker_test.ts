/**
 * The worker that waits in a shared container for the next run (a "spare", lib/sandbox/spare.ts)
 * and the job it is handed (worker/job.ts), attacked from inside the sandbox and checked from
 * outside:
 *
 * - waiting, it holds no secret: neither the session token nor the key is in its environment or
 *   command line (the read finds its other variables: the positive control);
 * - it serves one run and is gone after it: the next run is served by another process;
 * - the prompt never touches a command line or a file in the sandbox: while the run is live, an
 *   agent that searches every process's argv and every file it can read for it finds nothing, and
 *   the same search finds a marker the agent wrote to a file itself (the positive twin);
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { text, toolCall } from "../_fake_llm.ts";
import { HeldLlm } from "../_held_llm.ts";
import { assertDocker, dockerTest, spawnCli } from "../_helpers.ts";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";

console.error("security: spare worker tests starting");

/** Processes in the container, read as root from outside: pid, args. */
async function processes(container: string): Promise<{ pid: number; args: string }[]> {
  const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "pid=,args="]);
  assert.equal(ps.exitCode, 0, ps.stderr);
  return ps.stdout.split("\n").filter(Boolean).map((line) => {
    const [, pid, args] = /^\s*(\d+)\s+(.*)$/.exec(line) ?? [];
    return { pid: Number(pid), args: args ?? "" };
  });
}

/** The pid of the worker waiting on the spare socket, once it is there (bounded wait). */
async function spareWorker(container: string): Promise<number> {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline;) {
    const ready = await run(["docker", "exec", "--user", "10001", container, "test", "-S", "/tmp/.sandbox-spare.sock"]);
    const worker = (await processes(container)).find((p) => /^deno run .*worker\.js serve --socket/.test(p.args));
    if (ready.exitCode === 0 && worker) return worker.pid;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`no waiting worker in ${container}`);
}

/** A process's environment and command line, as the sandbox user reads them (its own uid). */
async function environOf(container: string, pid: number): Promise<{ environ: string; cmdline: string }> {
  const read = (file: string) =>
    run(["docker", "exec", "--user", "10001", container, "sh", "-c", 'tr "\\0" "\\n" <"$1"', "sh", `/proc/${pid}/${file}`]);
  const [environ, cmdline] = await Promise.all([read("environ"), read("cmdline")]);
  assert.equal(environ.exitCode, 0, environ.stderr);
  return { environ: environ.stdout, cmdline: cmdline.stdout };
}

async function runOnce(fixture: RunFixture, args: string[] = []) {
  const child = spawnCli(["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile, "--format", "ndjson", ...args], {
    config: fixture.config,
    env: fixture.env,
    timeoutMs: CLI_TIMEOUT_MS,
  });
  const [stdout, ended] = await Promise.all([new Response(child.stdout).text(), child.finished]);
  assert.equal(ended.exitCode, 0, `${stdout}\n${ended.stderrTail}`);
  // Each run leases the shared container: what the run before left waiting in it (a worker, a
  // relay) never makes it busy.
  assert.doesNotMatch(ended.stderrTail, /another run of this profile is live/);
  return stdout;
}

Deno.test({
  name: "the waiting worker holds no secret, serves exactly one run, and a new one waits after it",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using llm = new HeldLlm([text("first"), text("second")]);
    await using fixture = await RunFixture.make({ prefix: "sec-spare", llmUrl: llm.baseUrl, keyEnv: "SEC_SPARE_KEY", prompt: "Say something\n" });
    // A first run creates the container; its lease, released, starts the worker for the next.
    await runOnce(fixture);
    const waiting = await spareWorker(fixture.container);

    await t.step("waiting, its environment and command line hold no token and no key", async () => {
      const { environ, cmdline } = await environOf(fixture.container, waiting);
      assert.match(environ, /^DENO_DIR=/m, "the environment was read (positive control)");
      for (const secret of ["SANDBOX_LLM_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", fixture.env.SEC_SPARE_KEY]) {
        assert.ok(!environ.includes(secret) && !cmdline.includes(secret), `the waiting worker holds ${secret}`);
      }
    });

    await t.step("the next run is served by it, and it is gone after that run, a new one waiting", async () => {
      const held = llm.hold(2);
      const child = spawnCli(["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile, "--format", "ndjson"], {
        config: fixture.config,
        env: fixture.env,
        timeoutMs: CLI_TIMEOUT_MS,
      });
      const output = new Response(child.stdout).text();
      await Promise.race([held, child.finished.then((e) => Promise.reject(new Error(`the run ended early: ${e.stderrTail}`)))]);
      // Live: the run is served by the process that was waiting (no other worker was started).
      const all = await processes(fixture.container);
      const workers = all.filter((p) => /^deno .*worker\.js/.test(p.args));
      assert.deepEqual(workers.map((p) => p.pid), [waiting], `the run is not served by the waiting worker:\n${all.map((p) => `${p.pid} ${p.args}`).join("\n")}`);
      llm.release();
      const [stdout, ended] = await Promise.all([output, child.finished]);
      assert.equal(ended.exitCode, 0, `${stdout}\n${ended.stderrTail}`);
      assert.match(stdout, /"content":"second"/);
      assert.ok(!(await processes(fixture.container)).some((p) => p.pid === waiting), "the worker that served the run outlived it");
      const next = await spareWorker(fixture.container);
      assert.notEqual(next, waiting, "the same process waits again");
    });
  },
});

Deno.test({
  name: "the prompt is in no command line and no file inside the sandbox while the run is live",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const marker = `PROMPT-MARKER-${crypto.randomUUID()}`;
    // The agent looks everywhere it can: every process's argv, every readable file.
    const search = [
      // The marker's text is put together at run time: this script's own argv must not hold it.
      'P=PROMPT; M="$P-MARKER-"',
      "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' <\"$f\" 2>/dev/null; echo; done >/tmp/agent-argv.txt",
      'echo "ARGV-HITS=$(grep -c "$M" /tmp/agent-argv.txt)"',
      'grep -rlsF "$M" /tmp /workspace /home 2>/dev/null | sed "s/^/FILE-HIT=/"; echo SEARCHED',
      // The twin: the same search, once the agent has written such a text to a file itself.
      'echo "${M}WRITTEN-BY-THE-AGENT" >/tmp/agent-note.txt',
      'grep -rlsF "$M" /tmp 2>/dev/null | sed "s/^/OWN-HIT=/"',
    ].join("\n");
    // A first run readies the container (and the worker that waits in it); the second searches.
    await using llm = new HeldLlm([text("ready"), toolCall("execute", { command: search }), text("done")]);
    await using fixture = await RunFixture.make({ prefix: "sec-prompt", llmUrl: llm.baseUrl, keyEnv: "SEC_PROMPT_KEY", prompt: `Find it. ${marker}\n` });
    await runOnce(fixture);
    await spareWorker(fixture.container);
    const held = llm.hold(3);
    const child = spawnCli(["run", "agentic", "--prompt-file", fixture.promptFile, "--profile", fixture.profile, "--format", "ndjson"], {
      config: fixture.config,
      env: fixture.env,
      timeoutMs: CLI_TIMEOUT_MS,
    });
    const output = new Response(child.stdout).text();
    const toolResults = await Promise.race([held, child.finished.then((e) => Promise.reject(new Error(`the run ended early: ${e.stderrTail}`)))]);
    assert.match(toolResults, /SEARCHED/, "the agent's search did not finish");
    assert.match(toolResults, /OWN-HIT=\/tmp\/agent-note\.txt/, "the same search does not find the agent's own file (it would prove nothing)");
    assert.match(toolResults, /ARGV-HITS=0/, `the prompt is on a command line:\n${toolResults}`);
    // (The script itself is in the request too: only its output names a path.)
    assert.doesNotMatch(toolResults, /FILE-HIT=\/(tmp|workspace|home)/, `the prompt is in a file:\n${toolResults}`);
    // From outside too, as root: no process's argv holds it.
    assert.ok(!(await processes(fixture.container)).some((p) => p.args.includes(marker)), "the prompt is on a command line (seen from outside)");
    llm.release();
    const [stdout, ended] = await Promise.all([output, child.finished]);
    assert.equal(ended.exitCode, 0, `${stdout}\n${ended.stderrTail}`);
  },
});
