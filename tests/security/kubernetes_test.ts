/**
 * Mode kubernetes through the real CLI (`sandbox run agentic --repo PATH`), against the tests' own
 * Kubernetes API server (tests/_kube_api.ts, pods as real Docker containers), driven by
 * `@kubernetes/client-node`: the run's commit comes back as a branch; the LLM key is in no
 * process, no file and no pod spec (each search beside a canary the same search finds); egress
 * leaves only for allowlisted names (the refused name beside its allowed twin, both served by one
 * loopback upstream).
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { FAKE_LLM_KEY, FakeLlm, text, toolCall } from "../_fake_llm.ts";
import { assertDocker, dockerTest, explain, tempDir } from "../_helpers.ts";
import { KubeApiServer } from "../_kube_api.ts";
import { ensureSandboxImage } from "../_kube_fixture.ts";
import { RunFixture } from "../_run_fixture.ts";

console.error("security: kubernetes run tests starting");

const KEY_ENV = "SANDBOX_KUBE_SEC_KEY";
/** Set in the sandbox's environment by the profile: what the key searches must find there. */
const CANARY = "canary-5b81f0c2d7";

async function git(cwd: string, ...args: string[]): Promise<string> {
  const result = await run(["git", "-C", cwd, ...args]);
  assert.equal(result.exitCode, 0, `git ${args.join(" ")}: ${result.stderr}`);
  return result.stdout.trim();
}

/** A server on the host's loopback, recording each request's Host header and path. */
function loopbackServer() {
  const seen: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    seen.push(`${req.headers.get("host")?.split(":")[0]}${new URL(req.url).pathname}`);
    return new Response("hello from the upstream\n");
  });
  return Object.assign(server, { seen, [Symbol.asyncDispose]: () => server.shutdown() });
}

/** `docker exec` as root into one of the fake cluster's containers (the test's own). */
async function rootExec(container: string, script: string): Promise<string> {
  const result = await run(["docker", "exec", "-u", "0", container, "sh", "-c", script]);
  return result.stdout + result.stderr;
}

/**
 * Counts the processes whose environment or argv holds the needle (read from stdin, so that no
 * process of the search itself carries it), and the files under the writable dirs and /etc.
 */
const SEARCH = `read -r needle; n=0; for p in /proc/[0-9]*; do
  text=$(cat "$p/environ" "$p/cmdline" 2>/dev/null | tr '\\0' '\\n')
  case "$text" in *"$needle"*) n=$((n+1));; esac
done
f=$(printf '%s\\n' "$needle" | grep -rlF -f - /workspace /tmp /home/sandbox /cache /etc 2>/dev/null | wc -l)
echo "procs=$n files=$f"`;

async function search(container: string, needle: string): Promise<string> {
  const child = new Deno.Command("docker", {
    args: ["exec", "-i", "-u", "0", container, "sh", "-c", SEARCH],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(`${needle}\n`));
  await writer.close();
  const output = await child.output();
  return new TextDecoder().decode(output.stdout).trim();
}

/** The agent's command: probes egress, writes its work, then waits for the test's scan. */
function agentScript(port: number): string {
  return `echo AGENT-START
curl -sS -m 20 -o /tmp/denied -w 'denied=%{http_code}\\n' http://offlist.test:${port}/attack || true
curl -sS -m 20 -o /tmp/allowed -w 'allowed=%{http_code}\\n' http://allowed.test:${port}/twin || true
printf 'file %s\\n' "$(cat /tmp/allowed)"
echo "${CANARY}" > /workspace/canary.txt
touch /tmp/scan-me
i=0; while [ ! -f /tmp/scanned ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
echo AGENT-END`;
}

Deno.test({
  name:
    "a kubernetes run: its commit comes back as a branch; the key is in no pod process, file or pod spec (a canary is); an off-allowlist name is refused and its allowlisted twin answers",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    const image = await ensureSandboxImage();
    await using upstream = loopbackServer();
    const port = upstream.addr.port;
    await using kube = new KubeApiServer();
    const workdir = `agent-${crypto.randomUUID().slice(0, 6)}`;
    await using llm = new FakeLlm([
      toolCall("execute", { command: agentScript(port) }),
      toolCall("write_file", { file_path: "agent.txt", content: "written in a pod\n" }),
      text("Done"),
    ]);
    await using fixture = await RunFixture.make({
      prefix: "sec-kube",
      llmUrl: llm.baseUrl,
      keyEnv: KEY_ENV,
      prompt: `Work in ${workdir}.\n`,
      sandboxYaml: `{mode: kubernetes, pool: 0, kubernetes: {image: "${image}"}, ` +
        `network: {mode: allowlist, allow: ["allowed.test:${port}"], ` +
        `hosts: {allowed.test: 127.0.0.1, offlist.test: 127.0.0.1}}, ` +
        `environment: {set: {SANDBOX_CANARY: ${CANARY}}}}`,
    });
    await kube.writeKubeconfig(`${fixture.dir.path}/kubeconfig`);
    await using repoDir = await tempDir("sandbox-kube-repo-");
    const repo = repoDir.path;
    await git(repo, "init", "-q", "-b", "main");
    await Deno.writeTextFile(`${repo}/README.md`, "base\n");
    await git(repo, "add", "-A");
    await git(repo, "-c", "user.name=U", "-c", "user.email=u@example.test", "commit", "-qm", "b");
    const base = await git(repo, "rev-parse", "HEAD");

    const running = fixture.cli(
      ["run", "agentic", "--repo", repo, "--prompt-file", fixture.promptFile, "--profile"]
        .concat(fixture.profile, "--format", "ndjson"),
      { KUBECONFIG: `${fixture.dir.path}/kubeconfig` },
    );
    const scan = await scanDuringRun(kube, running);
    const result = await running;
    const context = explain(result);
    console.error("marker: kubernetes run finished");
    assert.equal(result.exitCode, 0, context);

    await t.step("the run's commit comes back as branch sandbox/<run-id> on the base", async () => {
      const id = result.stderr.match(/^sandbox: run (\S+) \(/m)?.[1];
      assert.ok(id, context);
      const branch = `sandbox/${id}`;
      assert.equal(await git(repo, "show", `${branch}:agent.txt`), "written in a pod");
      assert.equal(await git(repo, "rev-parse", `${branch}~1`), base);
      assert.equal(await git(repo, "rev-parse", "HEAD"), base, "HEAD stays");
    });

    await t.step("the key is in no process or file of either pod container; the canary is", () => {
      assert.ok(scan, `the agent never asked for the scan\n${context}`);
      assert.match(scan.sandboxCanary, /^procs=[1-9]\d* files=[1-9]\d*$/, context);
      assert.match(scan.sandboxKey, /^procs=0 files=0$/, context);
      assert.match(scan.relayKey, /^procs=0 files=0$/, context);
      assert.match(scan.relayProcs, /relay/, "the relay's processes were searched");
    });

    await t.step("the key is in no pod spec nor exec request", () => {
      assert.ok(scan!.podJson.includes(image), "the pod as served was searched");
      assert.ok(!scan!.podJson.includes(FAKE_LLM_KEY), "the pod as the API server serves it");
      const created = JSON.stringify(kube.created);
      assert.ok(created.includes(image), "the created specs were searched");
      assert.ok(!created.includes(FAKE_LLM_KEY), "the pod specs as created");
      assert.ok(!JSON.stringify(kube.execs).includes(FAKE_LLM_KEY), "exec argv");
      assert.ok(llm.completions >= 3, `the key reached the upstream from the host\n${context}`);
    });

    await t.step("egress: the off-allowlist name is refused, its allowlisted twin answers", () => {
      const output = result.stdout;
      assert.match(output, /denied=403/, context);
      assert.match(output, /allowed=200/, context);
      assert.match(output, /file hello from the upstream/, context);
      assert.deepEqual(upstream.seen, ["allowed.test/twin"]);
    });
  },
});

interface Scan {
  podJson: string;
  sandboxKey: string;
  sandboxCanary: string;
  relayKey: string;
  relayProcs: string;
}

/** Once the agent asks (`/tmp/scan-me`), search its pod; then let the agent go on. */
async function scanDuringRun(
  kube: KubeApiServer,
  running: Promise<unknown>,
): Promise<Scan | undefined> {
  let done = false;
  running.finally(() => done = true);
  while (!done) {
    for (const name of kube.pods.keys()) {
      const sandbox = kube.containerOf(name, "sandbox");
      if ((await rootExec(sandbox, "test -f /tmp/scan-me && echo yes")).trim() !== "yes") continue;
      const relay = kube.containerOf(name, "relay");
      const response = await fetch(`${kube.url}/api/v1/namespaces/default/pods/${name}`);
      const scan = {
        podJson: await response.text(),
        sandboxKey: await search(sandbox, FAKE_LLM_KEY),
        sandboxCanary: await search(sandbox, CANARY),
        relayKey: await search(relay, FAKE_LLM_KEY),
        relayProcs: await rootExec(relay, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"),
      };
      await rootExec(sandbox, "touch /tmp/scanned");
      return scan;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return undefined;
}
