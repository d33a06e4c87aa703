/**
 * Warm start of each agent, side by side in one run: `sandbox run agentic --agent A` from process
 * start to the first event on stdout, for the built-in deepagents worker, Claude Code and Codex,
 * each with the container of its image up (the agent layers are built by the warm-up runs when
 * missing). The LLM is a replayed one-answer conversation in each agent's own API (`--model
 * replay:FILE`, answered at once), so the figure is the sandbox's and the agent's own start. Each
 * run claims a sandbox from the agent's warm pool (refilled behind the run before it). Baseline
 * beside each: `docker exec CONTAINER true` in a plain container of that agent's image that the
 * bench starts itself (`sleep infinity`: a `docker exec` into a pooled sandbox would make it one
 * that ran foreign commands), measured just before every run; and the agent program's own start
 * in that container (`--version`, or the worker's `--help`) as a part.
 */
import type { BenchContext, Benchmark, BenchResult, Figure } from "./main.ts";
import { agentProgram } from "../lib/agents/launch.ts";
import { removeProfile } from "../tests/_helpers.ts";
import {
  type CliRunTiming,
  describe,
  snapshotSources,
  summarize,
  timeCliRun,
  timeCommand,
  timeRepeated,
} from "./_run_helpers.ts";
import {
  imageOf,
  readyPooled,
  removeBenchContainers,
  removeProxyMounts,
  startBenchContainer,
} from "./_pool_probe.ts";

const WARM_RUNS = 5;
const START_RUNS = 5;
const SANDBOX_USER = "10001:10001";

type Agent = "deepagents" | "claude-code" | "codex";
const AGENTS: Agent[] = ["deepagents", "claude-code", "codex"];

function sse(events: Record<string, unknown>[]): string {
  return events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join("");
}

/** One instant answer, "done", in the API each agent speaks. */
const RECORDINGS: Record<Agent, unknown> = {
  deepagents: {
    version: 1,
    kind: "openai",
    responses: [{
      status: 200,
      body: {
        id: "chatcmpl-bench",
        object: "chat.completion",
        created: 0,
        model: "replay",
        choices: [{
          index: 0,
          message: { role: "assistant", content: "done" },
          finish_reason: "stop",
        }],
        usage: { prompt_tokens: 10, completion_tokens: 1, total_tokens: 11 },
      },
    }],
  },
  "claude-code": {
    version: 1,
    kind: "anthropic",
    responses: [{
      status: 200,
      sse: sse([
        {
          type: "message_start",
          message: {
            id: "msg_bench",
            type: "message",
            role: "assistant",
            model: "replay",
            content: [],
            stop_reason: null,
            usage: { input_tokens: 10, output_tokens: 1 },
          },
        },
        { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
        { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "done" } },
        { type: "content_block_stop", index: 0 },
        {
          type: "message_delta",
          delta: { stop_reason: "end_turn", stop_sequence: null },
          usage: { output_tokens: 1 },
        },
        { type: "message_stop" },
      ]),
    }],
  },
  codex: {
    version: 1,
    kind: "openai-responses",
    responses: [{
      status: 200,
      sse: (() => {
        const item = {
          type: "message",
          id: "msg_bench",
          role: "assistant",
          status: "completed",
          content: [{ type: "output_text", text: "done", annotations: [] }],
        };
        const response = {
          id: "resp_bench",
          object: "response",
          created_at: 0,
          model: "replay",
          status: "in_progress",
          output: [],
        };
        return sse([
          { type: "response.created", response },
          {
            type: "response.output_item.added",
            output_index: 0,
            item: { ...item, status: "in_progress" },
          },
          { type: "response.output_item.done", output_index: 0, item },
          {
            type: "response.completed",
            response: {
              ...response,
              status: "completed",
              output: [item],
              usage: { input_tokens: 10, output_tokens: 1, total_tokens: 11 },
            },
          },
        ]);
      })(),
    }],
  },
};

function disturbed(timing: CliRunTiming): boolean {
  return timing.disturbed || /Building (claude-code|codex) image/.test(timing.stderr);
}

async function run(context: BenchContext): Promise<BenchResult> {
  const { signal } = context;
  const dir = await Deno.makeTempDir({ prefix: "sandbox-bench-agents-" });
  const src = `${dir}/src`;
  const profile = `bench-agents-${crypto.randomUUID().slice(0, 8)}`;
  const notes: string[] = [];
  const plain: Partial<Record<Agent, string>> = {};
  try {
    await snapshotSources(src);
    await Deno.mkdir(`${dir}/state`);
    await Deno.writeTextFile(`${dir}/sandbox.yaml`, `profiles:\n  ${profile}: {}\n`);
    await Deno.writeTextFile(`${dir}/prompt.txt`, "Answer with one word: done\n");
    const at = { cwd: src, env: { XDG_STATE_HOME: `${dir}/state` }, signal };
    const argv = (agent: Agent) => {
      const recording = `${dir}/${agent}.json`;
      Deno.writeTextFileSync(recording, JSON.stringify(RECORDINGS[agent]));
      return [
        Deno.execPath(),
        "run",
        "-A",
        "--quiet",
        `${src}/cli.ts`,
        "--config",
        `${dir}/sandbox.yaml`,
        "run",
        "agentic",
        "-p",
        profile,
        "--agent",
        agent,
        "--prompt-file",
        `${dir}/prompt.txt`,
        "--model",
        `replay:${recording}`,
        "--format",
        "ndjson",
      ];
    };
    const container = (agent: Agent) => plain[agent]!;

    for (const agent of AGENTS) {
      context.progress(
        `${agent}: warm-up run (builds the image or the agent's layer when missing)`,
      );
      const warmup = await timeCliRun(argv(agent), at);
      if (disturbed(warmup)) notes.push(`${agent}: the warm-up run built an image`);
      // The run refilled the agent's pool before it exited: its ready sandbox names the image.
      const [pooled] = await readyPooled(
        `${dir}/state`,
        profile,
        agent === "deepagents" ? undefined : agent,
      );
      plain[agent] = await startBenchContainer(await imageOf(pooled), agent, ["sleep", "infinity"]);
    }

    const exec: Record<Agent, number[]> = { deepagents: [], "claude-code": [], codex: [] };
    const warm: Record<Agent, CliRunTiming[]> = { deepagents: [], "claude-code": [], codex: [] };
    context.progress(
      `warm: ${WARM_RUNS} rounds of the three agents, each run after a raw docker exec in a plain container of its image`,
    );
    for (let i = 0; i < WARM_RUNS; i++) {
      for (const agent of AGENTS) {
        signal.throwIfAborted();
        exec[agent].push(await timeCommand(["docker", "exec", container(agent), "true"], at));
        warm[agent].push(await timeCliRun(argv(agent), at));
      }
    }

    context.progress(
      `the agents' own start in plain containers of their images: ${START_RUNS} × each`,
    );
    const startArgv: Record<Agent, string[]> = {
      deepagents: ["deno", "run", "--allow-all", "--no-config", "/opt/sandbox/worker.js", "--help"],
      "claude-code": [agentProgram("claude-code"), "--version"],
      codex: [agentProgram("codex"), "--version"],
    };
    const figures: Figure[] = [];
    for (const agent of AGENTS) {
      const bad = warm[agent].filter(disturbed).length;
      if (bad > 0) {
        notes.push(`${agent}: ${bad} warm runs built an image or replaced the container: not warm`);
      }
      const baseline = summarize(exec[agent]);
      const first = summarize(warm[agent].map((t) => t.firstEventMs));
      const exit = summarize(warm[agent].map((t) => t.exitMs));
      const start = summarize(
        await timeRepeated(
          [
            "docker",
            "exec",
            "--user",
            SANDBOX_USER,
            "--env",
            "HOME=/tmp/bench-home",
            container(agent),
            ...startArgv[agent],
          ],
          START_RUNS,
          at,
        ),
      );
      figures.push(
        {
          name: `warm run, ${agent}: process start → first event`,
          unit: "ms",
          baseline: baseline.median,
          measured: first.median,
          better: "lower",
        },
        {
          name: `warm run, ${agent}: process start → exit`,
          unit: "ms",
          baseline: baseline.median,
          measured: exit.median,
          better: "lower",
        },
        {
          name: `part: ${agent}'s own start in its container (${startArgv[agent].at(-1)})`,
          unit: "ms",
          baseline: baseline.median,
          measured: start.median,
          better: "lower",
        },
      );
      notes.push(
        `${agent}: first event ${describe(first)}; exit ${describe(exit)}; docker exec true ${
          describe(baseline)
        }; own start ${describe(start)}; events [${warm[agent][0].types.join(", ")}]`,
      );
    }
    notes.push(
      `setup: one profile ${profile} with default settings (isolated network); --agent picks the agent, each run in a pooled sandbox of its own; --model replay of one instant answer in the agent's API; sources frozen in a temporary copy`,
    );
    return { figures, notes };
  } finally {
    context.progress(`removing profile ${profile} and the plain containers`);
    await removeBenchContainers(Object.values(plain));
    await removeProfile(profile);
    await removeProxyMounts(`${dir}/state`);
    await Deno.remove(dir, { recursive: true });
  }
}

export const benchmark: Benchmark = {
  name: "agents",
  title: "warm start to the first event: deepagents worker, Claude Code, Codex",
  baselineLabel: "docker exec",
  measuredLabel: "sandbox",
  run,
};
