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
  type Summary,
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

/** Where one bench's files are, and how its commands run. */
interface Bench {
  dir: string;
  src: string;
  profile: string;
  at: { cwd: string; env: Record<string, string>; signal: AbortSignal };
}

async function run(context: BenchContext): Promise<BenchResult> {
  const { signal } = context;
  const dir = await Deno.makeTempDir({ prefix: "sandbox-bench-agents-" });
  const src = `${dir}/src`;
  const profile = `bench-agents-${crypto.randomUUID().slice(0, 8)}`;
  const notes: string[] = [];
  // Filled as the plain containers start, so that the cleanup below removes those that did.
  const plain: Partial<Record<Agent, string>> = {};
  try {
    await snapshotSources(src);
    await Deno.mkdir(`${dir}/state`);
    await Deno.writeTextFile(`${dir}/sandbox.yaml`, `profiles:\n  ${profile}: {}\n`);
    await Deno.writeTextFile(`${dir}/prompt.txt`, "Answer with one word: done\n");
    const bench: Bench = {
      dir,
      src,
      profile,
      at: { cwd: src, env: { XDG_STATE_HOME: `${dir}/state` }, signal },
    };
    await warmUp(bench, plain, notes, context);
    const containers = plain as Record<Agent, string>;
    const { exec, warm } = await measureWarm(bench, containers, context);

    context.progress(
      `the agents' own start in plain containers of their images: ${START_RUNS} × each`,
    );
    const figures: Figure[] = [];
    for (const agent of AGENTS) {
      const bad = warm[agent].filter(disturbed).length;
      if (bad > 0) {
        notes.push(`${agent}: ${bad} warm runs built an image or replaced the container: not warm`);
      }
      const start = await measureOwnStart(agent, containers[agent], bench);
      const result = agentFigures(agent, exec[agent], warm[agent], start);
      figures.push(...result.figures);
      notes.push(result.note);
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

/** The CLI's argv for one replayed run of `agent` (its recording written beside the prompt). */
function cliArgv(bench: Bench, agent: Agent): string[] {
  const { dir, src, profile } = bench;
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
}

/**
 * One run per agent, which builds what is missing and refills its pool, then a plain container
 * of the image its pooled sandbox uses (recorded in `plain` as it starts).
 */
async function warmUp(
  bench: Bench,
  plain: Partial<Record<Agent, string>>,
  notes: string[],
  context: BenchContext,
): Promise<void> {
  for (const agent of AGENTS) {
    context.progress(
      `${agent}: warm-up run (builds the image or the agent's layer when missing)`,
    );
    const warmup = await timeCliRun(cliArgv(bench, agent), bench.at);
    if (disturbed(warmup)) notes.push(`${agent}: the warm-up run built an image`);
    // The run refilled the agent's pool before it exited: its ready sandbox names the image.
    const [pooled] = await readyPooled(
      `${bench.dir}/state`,
      bench.profile,
      agent === "deepagents" ? undefined : agent,
    );
    plain[agent] = await startBenchContainer(await imageOf(pooled), agent, ["sleep", "infinity"]);
  }
}

/** Rounds of the three agents, each run after a raw `docker exec` in its plain container. */
async function measureWarm(
  bench: Bench,
  containers: Record<Agent, string>,
  context: BenchContext,
): Promise<{ exec: Record<Agent, number[]>; warm: Record<Agent, CliRunTiming[]> }> {
  const exec: Record<Agent, number[]> = { deepagents: [], "claude-code": [], codex: [] };
  const warm: Record<Agent, CliRunTiming[]> = { deepagents: [], "claude-code": [], codex: [] };
  context.progress(
    `warm: ${WARM_RUNS} rounds of the three agents, each run after a raw docker exec in a plain container of its image`,
  );
  for (let i = 0; i < WARM_RUNS; i++) {
    for (const agent of AGENTS) {
      context.signal.throwIfAborted();
      exec[agent].push(await timeCommand(["docker", "exec", containers[agent], "true"], bench.at));
      warm[agent].push(await timeCliRun(cliArgv(bench, agent), bench.at));
    }
  }
  return { exec, warm };
}

/** What each agent's own start is timed with (the worker's `--help`, the CLIs' `--version`). */
const START_ARGV: Record<Agent, string[]> = {
  deepagents: ["deno", "run", "--allow-all", "--no-config", "/opt/sandbox/worker.js", "--help"],
  "claude-code": [agentProgram("claude-code"), "--version"],
  codex: [agentProgram("codex"), "--version"],
};

/** The agent's own start, as the sandbox user, in its plain container. */
async function measureOwnStart(agent: Agent, container: string, bench: Bench): Promise<Summary> {
  return summarize(
    await timeRepeated(
      [
        "docker",
        "exec",
        "--user",
        SANDBOX_USER,
        "--env",
        "HOME=/tmp/bench-home",
        container,
        ...START_ARGV[agent],
      ],
      START_RUNS,
      bench.at,
    ),
  );
}

function agentFigures(
  agent: Agent,
  exec: number[],
  warm: CliRunTiming[],
  start: Summary,
): { figures: Figure[]; note: string } {
  const baseline = summarize(exec);
  const first = summarize(warm.map((t) => t.firstEventMs));
  const exit = summarize(warm.map((t) => t.exitMs));
  const figures: Figure[] = [
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
      name: `part: ${agent}'s own start in its container (${START_ARGV[agent].at(-1)})`,
      unit: "ms",
      baseline: baseline.median,
      measured: start.median,
      better: "lower",
    },
  ];
  const note = `${agent}: first event ${describe(first)}; exit ${
    describe(exit)
  }; docker exec true ${describe(baseline)}; own start ${describe(start)}; events [${
    warm[0].types.join(", ")
  }]`;
  return { figures, note };
}

export const benchmark: Benchmark = {
  name: "agents",
  title: "warm start to the first event: deepagents worker, Claude Code, Codex",
  baselineLabel: "docker exec",
  measuredLabel: "sandbox",
  run,
};
