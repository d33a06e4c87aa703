/**
 * Keys never enter, egress only where allowed: the host proxies serving a real sandbox, reached
 * through the relay (the sandbox itself has no network; see tests/security/network_test.ts).
 * Every target is on this machine: fake upstreams on loopback and a test server on the host.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  spawnCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("integration: proxy tests starting");

const KEY_ENV = "SANDBOX_TEST_UPSTREAM_KEY";

/** The default route's gateway inside a container on a bridge network: the host's address there. */
const GATEWAY = `g=$(awk '$2 == "00000000" { print $3 }' /proc/net/route); ` +
  `GW=$(printf '%d.%d.%d.%d' "0x$(echo $g | cut -c7-8)" "0x$(echo $g | cut -c5-6)" "0x$(echo $g | cut -c3-4)" "0x$(echo $g | cut -c1-2)")`;

/** A server on the host, on all interfaces, that says who it is. */
function hostServer(): Deno.HttpServer<Deno.NetAddr> & AsyncDisposable {
  const server = Deno.serve(
    { hostname: "0.0.0.0", port: 0, onListen: () => {} },
    () => new Response("hello from the host\n"),
  );
  return Object.assign(server, { [Symbol.asyncDispose]: () => server.shutdown() });
}

async function readAccessLog(stateDir: string): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(`${stateDir}/sandbox/access.ndjson`).catch(() => "");
  return text.split("\n").filter(Boolean).map((line) => JSON.parse(line));
}

Deno.test({
  name:
    "an LLM request from inside a sandbox reaches the upstream with the real key, which exists nowhere in the sandbox",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream();
    await using dir = await tempDir();
    const profile = uniqueProfile("it-key");
    const key = upstream.key;
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${profile}:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
    );
    const env = { [KEY_ENV]: key, XDG_STATE_HOME: `${dir.path}/state` };
    const body = `'{"model":"m","messages":[{"role":"user","content":"hi"}]}'`;
    const script = [
      `curl -sS -X POST "$SANDBOX_LLM_BASE_URL/chat/completions" -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" ` +
      `-H "x-sandbox-profile: someone-else" -H "content-type: application/json" -d ${body} >/dev/null`,
      "echo REQUEST-DONE",
      "read go",
      `curl -s -o /dev/null -w "%{http_code}\\n" -X POST "$SANDBOX_LLM_BASE_URL/chat/completions" -H "Authorization: Bearer sbx_wrong" -d ${body}`,
      `curl -s -o /dev/null -w "%{http_code}\\n" -X POST "$SANDBOX_LLM_BASE_URL/chat/completions" -d ${body}`,
      "echo END",
    ].join("\n");
    const stdin = new TransformStream<Uint8Array, Uint8Array>();
    try {
      const child = spawnCli(["exec", "--profile", profile, "--", "sh", "-c", script], {
        config,
        env,
        stdin: stdin.readable,
      });
      const lines = child.lines();
      const first = await lines.next();
      if (first.value !== "REQUEST-DONE") {
        assert.fail(
          `expected REQUEST-DONE, got ${first.value}; stderr: ${(await child.finished).stderrTail}`,
        );
      }

      // The upstream saw the real key, and nothing of ours.
      assert.equal(upstream.requests.length, 1);
      const seen = upstream.requests[0];
      assert.equal(seen.path, "/v1/chat/completions");
      assert.equal(seen.headers.get("authorization"), `Bearer ${key}`);
      assert.equal(seen.headers.get("x-sandbox-profile"), null);
      const headerText = [...seen.headers].map(([k, v]) => `${k}: ${v}`).join("\n");
      assert.doesNotMatch(headerText, /sbx_/);

      // While the sandbox is in use, the key is nowhere in it or on any command line.
      const container = `sandbox-${profile}`;
      assert.ok(
        !(await docker("container", "inspect", container)).includes(key),
        "key in docker inspect",
      );
      const environs = await run([
        "docker",
        "exec",
        "-u",
        "0",
        container,
        "sh",
        "-c",
        "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null",
      ]);
      assert.ok(environs.stdout.length > 0);
      assert.ok(!environs.stdout.includes(key), "key in a sandbox process's environment or argv");
      // grep reads the key as a pattern from stdin, so the check itself never puts it on a command line.
      const grepFor = (pattern: string) =>
        run([
          "docker",
          "exec",
          "-i",
          "-u",
          "0",
          container,
          "grep",
          "-rlsF",
          "-D",
          "skip",
          "--exclude-dir=proc",
          "--exclude-dir=sys",
          "--exclude-dir=dev",
          "-f",
          "/dev/stdin",
          "/",
        ], { stdin: pattern });
      // The same search finds a string that is there, so an empty answer means something.
      assert.match(
        (await grepFor("PR_SET_CHILD_SUBREAPER")).stdout,
        /\/usr\/local\/bin\/sandbox-exec/,
      );
      const grep = await grepFor(key);
      assert.equal(grep.stdout, "", `files in the sandbox containing the key:\n${grep.stdout}`);
      for await (const entry of Deno.readDir("/proc")) {
        if (!/^\d+$/.test(entry.name)) continue;
        const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
        assert.ok(!cmdline.includes(key), `key on the command line of host process ${entry.name}`);
      }

      const writer = stdin.writable.getWriter();
      await writer.write(new TextEncoder().encode("go\n"));
      await writer.close();
      const rest: string[] = [];
      for await (const line of { [Symbol.asyncIterator]: () => lines }) rest.push(line);
      const outcome = await child.finished;
      assert.deepEqual(rest, ["401", "401", "END"], outcome.stderrTail);
      assert.equal(outcome.exitCode, 0, outcome.stderrTail);
      assert.equal(upstream.requests.length, 1, "a request without a valid token was forwarded");

      const log = await readAccessLog(`${dir.path}/state`);
      const llm = log.filter((e) => e.kind === "llm");
      assert.deepEqual(llm.map((e) => [e.decision, e.status]), [["allow", 200], ["deny", 401], [
        "deny",
        401,
      ]]);
      const logText = JSON.stringify(log);
      assert.ok(
        !logText.includes(key) && !logText.includes("sbx_"),
        "key or token in the access log",
      );
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "allowlist: listed names pass the egress proxy, others are denied and logged, and names do not resolve inside",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using server = hostServer();
    await using dir = await tempDir();
    const port = server.addr.port;
    const profile = uniqueProfile("it-allow");
    const config = await writeConfig(
      dir.path,
      `profiles:
  ${profile}:
    sandbox:
      network:
        mode: allowlist
        allow: ["allowed.test:${port}"]
        hosts: {allowed.test: 127.0.0.1, denied.test: 127.0.0.1}
`,
    );
    const script = [
      `curl -sS -m 10 http://allowed.test:${port}/`,
      `curl -s -m 10 -w "status %{http_code}\\n" http://denied.test:${port}/`,
      // The same URL without the proxy: the name resolves nowhere inside.
      `curl -sS -m 5 --noproxy '*' "http://allowed.test:${port}/" >/dev/null 2>&1 && echo dns-open || echo dns-blocked`,
      `getent hosts allowed.test >/dev/null && echo resolves || echo no-resolution`,
    ].join("\n");
    try {
      const result = await runCli(["exec", "--profile", profile, "--", "sh", "-c", script], {
        config,
        env: { XDG_STATE_HOME: `${dir.path}/state` },
      });
      assert.equal(result.exitCode, 0, explain(result));
      const lines = result.stdout.trim().split("\n");
      assert.equal(lines[0], "hello from the host");
      assert.match(
        result.stdout,
        /"denied\.test:\d+" is not allowed by the allowlist policy of profile/,
      );
      assert.match(result.stdout, /status 403/);
      assert.ok(lines.includes("dns-blocked"), result.stdout);
      assert.ok(lines.includes("no-resolution"), result.stdout);
      const egress = (await readAccessLog(`${dir.path}/state`)).filter((e) => e.kind === "egress");
      assert.deepEqual(
        egress.map((e) => [e.decision, e.host, e.profile]),
        [["allow", "allowed.test", profile], ["deny", "denied.test", profile]],
      );
    } finally {
      await removeProfile(profile);
    }
  },
});

Deno.test({
  name:
    "none: only the credential proxy is reachable; full: the host server is reachable directly, and the credential proxy through the relay",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using server = hostServer();
    await using upstream = new FakeUpstream();
    await using dir = await tempDir();
    const port = server.addr.port;
    const none = uniqueProfile("it-none");
    const full = uniqueProfile("it-full");
    const config = await writeConfig(
      dir.path,
      `profiles:
  ${none}:
    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}
    sandbox:
      network: {mode: none, allow: ["allowed.test:${port}"], hosts: {allowed.test: 127.0.0.1}}
  ${full}:
    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}
    sandbox:
      network: {mode: full}
`,
    );
    const env = { [KEY_ENV]: upstream.key, XDG_STATE_HOME: `${dir.path}/state` };
    try {
      await t.step("none", async () => {
        const script = [
          `curl -s -m 10 -o /dev/null -w "llm %{http_code}\\n" "$SANDBOX_LLM_BASE_URL/models" -H "Authorization: Bearer $SANDBOX_LLM_TOKEN"`,
          `curl -s -m 10 -o /dev/null -w "egress %{http_code}\\n" http://allowed.test:${port}/`,
        ].join("\n");
        const result = await runCli(["exec", "--profile", none, "--", "sh", "-c", script], {
          config,
          env,
        });
        assert.equal(result.exitCode, 0, explain(result));
        assert.deepEqual(result.stdout.trim().split("\n"), ["llm 200", "egress 403"]);
      });

      await t.step("full", async () => {
        const script = [
          GATEWAY,
          `curl -sS -m 10 "http://$GW:${port}/"`,
          "env | grep -c _PROXY= || true",
          `curl -s -m 10 -o /dev/null -w "llm %{http_code}\\n" "$SANDBOX_LLM_BASE_URL/models" -H "Authorization: Bearer $SANDBOX_LLM_TOKEN"`,
          `echo "$SANDBOX_LLM_BASE_URL"`,
        ].join("\n");
        const result = await runCli(["exec", "--profile", full, "--", "bash", "-c", script], {
          config,
          env,
        });
        assert.equal(result.exitCode, 0, explain(result));
        assert.deepEqual(result.stdout.trim().split("\n"), [
          "hello from the host",
          "0",
          "llm 200",
          "http://127.0.0.1:19080/proxy/v1",
        ]);
      });
    } finally {
      await removeProfile(none);
      await removeProfile(full);
    }
  },
});
