/**
 * Mode kubernetes, against the tests' API server (tests/_kube_api.ts: REST and pod exec over the
 * WebSocket protocol, each pod two Docker containers on this machine; agent-sandbox's controllers
 * scripted after the upstream), each figure beside its Docker baseline from the same run:
 *
 * - a run's first event, claiming a ready pod of agent-sandbox's `SandboxWarmPool` (a
 *   `SandboxClaim`) and of the tool's own pool, beside `docker exec true` (DESIGN.md's warm
 *   baseline); a cold pod (pool 0) beside `docker run --rm IMG true`. The CLI from a frozen copy
 *   of the sources, the built-in worker replaying a recorded answer (no LLM); `sandbox up` fills
 *   the pool before each warm sample, untimed.
 * - the relay's LLM request latency over a pod's exec stream (WebSocket to the API server, then
 *   its `docker exec`) beside the same relay over `docker exec` stdio (mode container, stream
 *   path): the same client inside, the same upstream, keep-alive, sequential, interleaved.
 *
 * What this cannot show: a real API server's and kubelet's costs (scheduling, image pulls, the
 * exec path through the kubelet and the container runtime), which dominate on a cluster.
 */
import { relayTransportFor } from "../lib/sandbox/providers.ts";
import type { BenchContext, Benchmark, BenchResult, Figure } from "./main.ts";
import { describe, snapshotSources, summarize, timeCliRun, timeRepeated } from "./_run_helpers.ts";
import { parseConfig, type Profile, resolveProfile } from "../lib/config.ts";
import { KeyStore } from "../lib/keys.ts";
import { Redactor } from "../lib/redact.ts";
import { openSession, type SandboxSession } from "../lib/proxy/session.ts";
import { DockerSandboxProvider } from "../lib/sandbox/docker_provider.ts";
import { ensureImage } from "../lib/sandbox/image.ts";
import { DockerCli } from "../lib/sandbox/docker.ts";
import { sandboxLifecycle } from "../lib/sandbox/providers.ts";
import type { SandboxProvider } from "../lib/sandbox/provider.ts";
import { run } from "../lib/process.ts";
import { KubeApiServer } from "../tests/_kube_api.ts";
import { removeProfile } from "../tests/_helpers.ts";
import { DEFAULT_BASE_IMAGE } from "../lib/config.ts";

const RUNS = 5;
const LATENCY_WARMUP = 20;
const LATENCY_ROUNDS = 4;
const LATENCY_PER_ROUND = 50;
const KEY_ENV = "SANDBOX_BENCH_KUBE_KEY";
const KEY = `sk-bench-${crypto.randomUUID().replaceAll("-", "")}`;

/** A one-step conversation (the run bench's): the model answers "done" at once. */
const COMPLETION = {
  id: "chatcmpl-bench",
  object: "chat.completion",
  created: 0,
  model: "replay",
  choices: [{ index: 0, message: { role: "assistant", content: "done" }, finish_reason: "stop" }],
  usage: { prompt_tokens: 10, completion_tokens: 1, total_tokens: 11 },
};
const RECORDING = { version: 1, kind: "openai", responses: [{ status: 200, body: COMPLETION }] };

/** The in-sandbox client: `URL TOKEN N` prints the N request times in ms as JSON. */
const CLIENT = `
const [url, token, count] = Deno.args;
const body = JSON.stringify({ model: "bench-model", messages: [{ role: "user", content: "Summarise the README." }] });
const times = [];
for (let i = 0; i < Number(count); i++) {
  const started = performance.now();
  const response = await fetch(url, { method: "POST", body, headers: { authorization: "Bearer " + token, "content-type": "application/json" } });
  await response.arrayBuffer();
  if (response.status !== 200) { console.error("status " + response.status); Deno.exit(1); }
  times.push(performance.now() - started);
}
console.log(JSON.stringify(times));
`;

type Cleanups = (() => Promise<unknown>)[];

async function run_(context: BenchContext): Promise<BenchResult> {
  const cleanups: Cleanups = [];
  try {
    const image = (await ensureImage(new DockerCli(), DEFAULT_BASE_IMAGE)).tag;
    const kube = new KubeApiServer({ agentSandbox: true });
    cleanups.push(() => kube[Symbol.asyncDispose]());
    const dir = await Deno.makeTempDir({ prefix: "sandbox-bench-kube-" });
    cleanups.push(() => Deno.remove(dir, { recursive: true }));
    await kube.writeKubeconfig(`${dir}/kubeconfig`);
    const starts = await measureStarts(context, { dir, image, cleanups });
    const latency = await measureRelay(context, { dir, image, cleanups });
    return {
      figures: [...starts.figures, latency.figure],
      notes: [...starts.notes, ...latency.notes],
    };
  } finally {
    for (const cleanup of cleanups.reverse()) {
      // A cleanup that fails leaves something behind that the next one need not wait for.
      await cleanup().catch((error) => context.progress(`cleanup: ${error}`));
    }
  }
}

/** First events: agent-sandbox claim, own-pool claim, cold pod; and their Docker baselines. */
async function measureStarts(
  context: BenchContext,
  rig: { dir: string; image: string; cleanups: Cleanups },
): Promise<{ figures: Figure[]; notes: string[] }> {
  const { dir, image, cleanups } = rig;
  const src = `${dir}/src`;
  await snapshotSources(src);
  const name = `bench-kube-${crypto.randomUUID().slice(0, 8)}`;
  const kube = (pool: number, choice: string) =>
    `{sandbox: {mode: kubernetes, pool: ${pool}, kubernetes: {image: "${image}", pool: ${choice}}}}`;
  await Deno.writeTextFile(
    `${dir}/sandbox.yaml`,
    `profiles:\n  ${name}-as: ${kube(1, "agent-sandbox")}\n  ${name}-own: ${kube(1, "own")}\n` +
      `  ${name}-cold: ${kube(0, "own")}\n`,
  );
  await Deno.writeTextFile(`${dir}/recording.json`, JSON.stringify(RECORDING));
  await Deno.writeTextFile(`${dir}/prompt.txt`, "Answer with one word: done\n");
  const at = {
    cwd: src,
    env: { XDG_STATE_HOME: `${dir}/state`, KUBECONFIG: `${dir}/kubeconfig` },
    signal: context.signal,
  };
  const cli = (...args: string[]) =>
    [Deno.execPath(), "run", "-A", "--quiet", `${src}/cli.ts`, "--config", `${dir}/sandbox.yaml`]
      .concat(args);
  const runOf = (profile: string) =>
    cli("run", "agentic", "--prompt-file", `${dir}/prompt.txt`, "-p", profile)
      .concat("--model", `replay:${dir}/recording.json`, "--format", "ndjson");
  for (const kind of ["as", "own", "cold"]) {
    cleanups.push(() => run(cli("down", "-p", `${name}-${kind}`), at));
  }
  const firsts: Record<string, number[]> = { as: [], own: [], cold: [] };
  context.progress(`starts: ${RUNS} runs each, agent-sandbox claim, own pool, cold pod`);
  for (let i = 0; i <= RUNS; i++) {
    for (const kind of ["as", "own", "cold"]) {
      context.signal.throwIfAborted();
      if (kind !== "cold") await run(cli("up", "-p", `${name}-${kind}`), at);
      const timing = await timeCliRun(runOf(`${name}-${kind}`), at);
      // The first round warms the CLI's module cache and the images: not a sample.
      if (i > 0) firsts[kind].push(timing.firstEventMs);
    }
  }
  const baselines = await dockerBaselines(context, image);
  const [as, own, cold] = [summarize(firsts.as), summarize(firsts.own), summarize(firsts.cold)];
  return {
    figures: [
      figure("warm run → first event, agent-sandbox SandboxClaim", baselines.exec.median, as),
      figure("warm run → first event, own pool (label claim)", baselines.exec.median, own),
      figure("cold pod → first event", baselines.run.median, cold),
    ],
    notes: [
      `first event: agent-sandbox claim ${describe(as)}; own pool ${describe(own)}; cold pod ${
        describe(cold)
      }`,
      `baselines: docker exec true ${describe(baselines.exec)}; docker run --rm IMG true ${
        describe(baselines.run)
      }`,
    ],
  };
}

function figure(name: string, baseline: number, measured: { median: number }): Figure {
  return { name, unit: "ms", baseline, measured: measured.median, better: "lower" };
}

async function dockerBaselines(context: BenchContext, image: string) {
  const container = `sandbox-bench-kube-exec-${crypto.randomUUID().slice(0, 8)}`;
  const started = await run(["docker", "run", "--detach", "--name", container, image, "sleep"]
    .concat("infinity"));
  if (started.exitCode !== 0) throw new Error(`docker run: ${started.stderr}`);
  try {
    const options = { signal: context.signal, warmup: 2 };
    const exec = await timeRepeated(["docker", "exec", container, "true"], RUNS, options);
    const cold = await timeRepeated(["docker", "run", "--rm", image, "true"], RUNS, options);
    return { exec: summarize(exec), run: summarize(cold) };
  } finally {
    await run(["docker", "rm", "--force", container]);
  }
}

/** The relay over a pod's exec stream vs over `docker exec` (stream path), one upstream. */
async function measureRelay(
  context: BenchContext,
  rig: { dir: string; image: string; cleanups: Cleanups },
): Promise<{ figure: Figure; notes: string[] }> {
  const { cleanups } = rig;
  const upstream = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    if (req.headers.get("authorization") !== `Bearer ${KEY}`) {
      return new Response("bad key", { status: 401 });
    }
    return Response.json(COMPLETION);
  });
  cleanups.push(() => upstream.shutdown());
  const name = `bench-kuberelay-${crypto.randomUUID().slice(0, 8)}`;
  const llm =
    `llm: {provider: custom, base_url: "http://127.0.0.1:${upstream.addr.port}/v1", key: {env: ${KEY_ENV}}}`;
  const profiles = parsed(
    `profiles:\n  ${name}-pod: {${llm}, sandbox: {mode: kubernetes, pool: 0, ` +
      `kubernetes: {image: "${rig.image}", pool: own}}}\n  ${name}-docker: {${llm}}\n`,
  );
  const redactor = new Redactor();
  const keys = new KeyStore({ redactor, env: (n) => (n === KEY_ENV ? KEY : undefined) });
  const options = { keys, redactor, accessLogPath: `${rig.dir}/access.ndjson` };

  const previous = Deno.env.get("KUBECONFIG");
  Deno.env.set("KUBECONFIG", `${rig.dir}/kubeconfig`);
  cleanups.push(() =>
    Promise.resolve(
      previous === undefined ? Deno.env.delete("KUBECONFIG") : Deno.env.set("KUBECONFIG", previous),
    )
  );
  const pod = await (await sandboxLifecycle(profiles.pod)).acquire({ runId: "relaybench" });
  cleanups.push(() => pod.release());
  const podSession = await openSession(profiles.pod, pod.relay!, options);
  cleanups.push(() => podSession.close());

  const docker = new DockerSandboxProvider(profiles.docker, { onProgress: context.progress });
  cleanups.push(() => removeProfile(profiles.docker.name));
  await docker.ensureRunning({ signal: context.signal });
  const dockerSession = await openSession(profiles.docker, relayTransportFor(docker), {
    ...options,
    relayTransport: "stream",
  });
  cleanups.push(() => dockerSession.close());

  const times = await timeRequests(context, {
    pod: [pod.provider, podSession],
    docker: [docker, dockerSession],
  });
  const [pod50, docker50] = [summarize(times.pod).median, summarize(times.docker).median];
  return {
    figure: {
      name: "LLM request p50 through the relay: pod exec stream (vs docker exec stream)",
      unit: "ms",
      baseline: docker50,
      measured: pod50,
      better: "lower",
    },
    notes: [
      `relay: keep-alive sequential requests, ${
        LATENCY_ROUNDS * LATENCY_PER_ROUND
      } per path after ${LATENCY_WARMUP} warm-up, interleaved; p50 pod exec ${
        pod50.toFixed(2)
      } ms, docker exec ${docker50.toFixed(2)} ms; the pod path is the test API server's ` +
      "WebSocket in front of its own docker exec, so the difference is the exec protocol's hop",
    ],
  };
}

type Paths = Record<"pod" | "docker", [SandboxProvider, SandboxSession]>;

/** Request times (ms) per path: the same client in each sandbox, rounds interleaved. */
async function timeRequests(context: BenchContext, paths: Paths) {
  for (const [provider] of Object.values(paths)) {
    await provider.writeFile("/tmp/bench-client.js", CLIENT);
  }
  const latencies = async (path: keyof Paths, count: number): Promise<number[]> => {
    const [provider, session] = paths[path];
    const url = `${session.env.SANDBOX_LLM_BASE_URL}/chat/completions`;
    const result = await provider.exec(
      ["deno", "run", "-A", "--no-config", "/tmp/bench-client.js", url, session.token, `${count}`],
      { env: session.env, signal: context.signal, timeoutMs: 600_000 },
    );
    if (result.exitCode !== 0) throw new Error(`${path} client: ${result.stderr}`);
    return JSON.parse(result.stdout) as number[];
  };
  context.progress(`relay: ${LATENCY_ROUNDS} × ${LATENCY_PER_ROUND} requests per path`);
  for (const path of ["pod", "docker"] as const) await latencies(path, LATENCY_WARMUP);
  const times = { pod: [] as number[], docker: [] as number[] };
  for (let round = 0; round < LATENCY_ROUNDS; round++) {
    for (const path of ["pod", "docker"] as const) {
      times[path].push(...await latencies(path, LATENCY_PER_ROUND));
    }
  }
  return times;
}

function parsed(yaml: string): { pod: Profile; docker: Profile } {
  const loaded = parseConfig(yaml, "bench profile");
  if (loaded.kind !== "ok") throw new Error(`bench profile: ${JSON.stringify(loaded.issues)}`);
  const names = Object.keys(loaded.config.profiles ?? {});
  const pick = (suffix: string) =>
    resolveProfile(loaded.config, names.find((n) => n.endsWith(suffix))!);
  return { pod: pick("-pod"), docker: pick("-docker") };
}

export const benchmark: Benchmark = {
  name: "kubernetes",
  title: "mode kubernetes (test API server, pods as containers) vs Docker",
  baselineLabel: "docker",
  measuredLabel: "kubernetes",
  run: run_,
};
