/**
 * Attack: read a live run's session token from a command line (issue 9, item 5). `ps` shows every
 * process's argv to every local user, on the host and in the sandbox; whoever has the token can
 * spend the user's key through the credential proxy while the run lives.
 *
 * While a run is held live between two LLM requests, the test reads every host process's
 * `/proc/*\/cmdline` and, as root inside, every sandbox process's: the token is in none, and in no
 * host process's environment either (it goes to the worker in its job, on the exec's stdin). The
 * positive twin: the token is delivered — the agent printed it (which is how the test learns it),
 * and a command the agent left running has it in its environment. Searches read the token from
 * stdin, so no check puts it on a command line itself.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { text, toolCall } from "../_fake_llm.ts";
import { HeldLlm } from "../_held_llm.ts";
import { assertDocker, docker, dockerTest, spawnCli } from "../_helpers.ts";
import { CLI_TIMEOUT_MS, RunFixture } from "../_run_fixture.ts";

console.error("security: token command-line tests starting");

/** `/proc/PID/FILE` of every host process whose FILE contains `needle`. */
async function hostProcessesWith(
  file: "cmdline" | "environ",
  needle: string,
): Promise<{ pid: string; cmdline: string }[]> {
  const found: { pid: string; cmdline: string }[] = [];
  let read = 0;
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const content = await Deno.readTextFile(`/proc/${entry.name}/${file}`).catch(() => undefined);
    if (content === undefined) continue;
    read++;
    if (content.includes(needle)) {
      const cmdline = (await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => ""))
        .replaceAll("\0", " ");
      found.push({ pid: entry.name, cmdline });
    }
  }
  assert.ok(read > 10, `read only ${read} host processes' ${file}: the check would prove nothing`);
  return found;
}

/** Sandbox `/proc/PID/FILE` paths holding `needle`, searched as `user` (grep reads it from stdin). */
async function sandboxFilesWith(
  container: string,
  user: string,
  file: "cmdline" | "environ",
  needle: string,
): Promise<string[]> {
  const result = await run(
    [
      "docker",
      "exec",
      "-i",
      "--user",
      user,
      container,
      "sh",
      "-c",
      `grep -lsF -f /dev/stdin /proc/[0-9]*/${file}; ls -d /proc/[0-9]* | wc -l`,
    ],
    { stdin: needle },
  );
  const lines = result.stdout.trim().split("\n");
  const count = Number(lines.pop());
  assert.ok(
    count > 2,
    `the sandbox listed ${count} processes: the check would prove nothing\n${result.stderr}`,
  );
  return lines.filter(Boolean);
}

Deno.test({
  name:
    "a live run's session token is on no command line, host or sandbox, nor in a host process's environment, and its agent's commands have it",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    // The command leaves a process running while the run is held: its environment is the twin.
    await using llm = new HeldLlm([
      toolCall("execute", {
        command: "echo OWN=$SANDBOX_LLM_TOKEN; (sleep 3600 </dev/null >/dev/null 2>&1 &)",
      }),
      text("Done"),
    ]);
    await using fixture = await RunFixture.make({
      prefix: "sec-token",
      llmUrl: llm.baseUrl,
      keyEnv: "SEC_TOKEN_KEY",
      prompt: "Print it\n",
    });
    const held = llm.hold(2);
    const child = spawnCli([
      "run",
      "agentic",
      "--prompt-file",
      fixture.promptFile,
      "--profile",
      fixture.profile,
      "--format",
      "ndjson",
    ], {
      config: fixture.config,
      env: fixture.env,
      timeoutMs: CLI_TIMEOUT_MS,
    });
    const output = new Response(child.stdout).text();
    try {
      const body = await Promise.race([
        held,
        child.finished.then((ended) =>
          Promise.reject(
            new Error(`the run ended before its second LLM request\n${ended.stderrTail}`),
          )
        ),
      ]);
      const token = /OWN=(sbx_[A-Za-z0-9_-]+)/.exec(body)?.[1];
      assert.ok(token, `the agent did not print its token: ${body.slice(0, 400)}`);
      // The run's own container (no other run or exec has one like it).
      const container = await fixture.liveContainer();

      await t.step("no host process has it on its command line", async () => {
        assert.deepEqual(await hostProcessesWith("cmdline", token), []);
      });
      await t.step("no sandbox process has it on its command line", async () => {
        assert.deepEqual(await sandboxFilesWith(container, "0", "cmdline", token), []);
      });
      await t.step("docker inspect of the sandbox does not show it", async () => {
        assert.ok(!(await docker("container", "inspect", container)).includes(token));
      });
      await t.step(
        "no host process has it in its environment (it went in on the worker's input)",
        async () => {
          // The sandbox's own processes show in the host's /proc too: those in its pid namespace are
          // the twin's business, not the host's.
          const here = await Deno.readLink("/proc/self/ns/pid");
          const holders = [];
          for (const found of await hostProcessesWith("environ", token)) {
            if (
              await Deno.readLink(`/proc/${found.pid}/ns/pid`).catch(() => here) === here
            ) holders.push(found);
          }
          assert.deepEqual(holders, []);
        },
      );
      await t.step("twin: the agent's command has it in its environment", async () => {
        const holders = await sandboxFilesWith(container, "10001", "environ", token);
        const pids = holders.map((path) => path.split("/")[2]);
        const cmdlines = await Promise.all(
          pids.map((pid) =>
            run(["docker", "exec", "--user", "0", container, "cat", `/proc/${pid}/cmdline`])
          ),
        );
        assert.ok(
          cmdlines.some((c) => c.stdout.startsWith("sleep\u00003600")),
          `holders: ${holders.join(", ")}`,
        );
      });
    } finally {
      llm.release();
      const [stdout, ended] = await Promise.all([output, child.finished]);
      assert.equal(ended.exitCode, 0, `${stdout}\n${ended.stderrTail}`);
    }
  },
});
