/**
 * `sandbox proxy` as a user (or an orchestrator) runs it: the real CLI as a subprocess, a fake
 * upstream on loopback, no Docker. Everything here talks to 127.0.0.1 only: the denied CONNECT
 * names a host that is refused before any lookup.
 */
import assert from "node:assert/strict";
import type { ChildProcess } from "../../lib/process.ts";
import { explain, runCli, spawnCli, tempDir, writeConfig } from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("e2e: sandbox proxy tests starting");

const KEY_ENV = "SANDBOX_E2E_UPSTREAM_KEY";
const PROFILE = "e2e-proxy";
/** Kills a CLI that hangs, so that a broken build fails the test instead of stalling it. */
const CLI_TIMEOUT_MS = 60_000;

interface ProxyInfo {
  profile: string;
  llm_base_url: string[];
  egress_proxy_url: string[];
  token: string;
  model: string;
  env: Record<string, string>;
}

/** A config whose profile sends LLM calls to `upstream`, and the environment for the CLI. */
async function setup(dir: string, upstream: FakeUpstream) {
  // The fake upstream accepts only its own key: the token forwarded instead would get a 401.
  const key = upstream.key;
  const config = await writeConfig(
    dir,
    `profiles:\n  ${PROFILE}:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
  );
  const env = {
    [KEY_ENV]: key,
    // The access log goes to the temporary directory, not the user's state directory.
    XDG_STATE_HOME: `${dir}/state`,
    // Loopback never goes through a proxy, whatever the environment running the tests says.
    NO_PROXY: "127.0.0.1,localhost",
    no_proxy: "127.0.0.1,localhost",
  };
  return { key, config, env, accessLog: `${dir}/state/sandbox/access.ndjson` };
}

/** A running `sandbox proxy`, with everything it printed collected. */
class ProxyCli implements AsyncDisposable {
  readonly child: ChildProcess;
  stderr = "";
  readonly stdoutLines: string[] = [];
  readonly #lines: AsyncGenerator<string>;
  readonly #stderrWaiters: { test: (line: string) => boolean; resolve: (line: string) => void }[] =
    [];

  constructor(args: string[], options: { config: string; env: Record<string, string> }) {
    this.child = spawnCli(args, {
      ...options,
      timeoutMs: CLI_TIMEOUT_MS,
      onStderrChunk: (text) => (this.stderr += text),
      onStderrLine: (line) => {
        for (const waiter of [...this.#stderrWaiters]) {
          if (!waiter.test(line)) continue;
          this.#stderrWaiters.splice(this.#stderrWaiters.indexOf(waiter), 1);
          waiter.resolve(line);
        }
      },
    });
    this.#lines = this.child.lines();
  }

  /** The next stdout line; fails with the stderr so far if the CLI ends first. */
  async nextStdoutLine(): Promise<string> {
    const next = await this.#lines.next();
    if (next.done) {
      const outcome = await this.child.finished;
      assert.fail(
        `sandbox proxy ended before printing a line (exit ${outcome.exitCode})\n--- stderr\n${this.stderr}`,
      );
    }
    this.stdoutLines.push(next.value);
    return next.value;
  }

  /** The first stderr line matching `test` from now on; fails if the CLI ends first. */
  stderrLine(test: (line: string) => boolean): Promise<string> {
    const line = new Promise<string>((resolve) => this.#stderrWaiters.push({ test, resolve }));
    const ended = this.child.finished.then((outcome) =>
      assert.fail(
        `sandbox proxy ended before the expected stderr line (exit ${outcome.exitCode})\n--- stderr\n${this.stderr}`,
      )
    );
    return Promise.race([line, ended]);
  }

  /** Send SIGTERM and wait for the exit; stdout is read to its end. */
  async stop() {
    this.child.kill();
    for await (const line of this.#lines) this.stdoutLines.push(line);
    return await this.child.finished;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** Send a raw request head to the egress proxy and return everything it answers. */
async function rawRequest(proxyUrl: string, head: string): Promise<string> {
  const { hostname, port } = new URL(proxyUrl);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  try {
    await conn.write(new TextEncoder().encode(head));
    // The proxy answers a denial and then closes: read to the end.
    return await new Response(conn.readable).text();
  } finally {
    try {
      conn.close();
    } catch {
      // Closed by the end of its readable.
    }
  }
}

/** True when nothing accepts TCP connections on `port` of 127.0.0.1. */
async function refusesConnections(port: number): Promise<boolean> {
  try {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    conn.close();
    return false;
  } catch (error) {
    if (error instanceof Deno.errors.ConnectionRefused) return true;
    throw error;
  }
}

const CHAT_BODY = JSON.stringify({
  model: "fake-model",
  messages: [{ role: "user", content: "hi" }],
});

Deno.test("sandbox proxy --json serves the profile's proxies until SIGTERM, then exits 0 and stops listening", async (t) => {
  await using upstream = new FakeUpstream();
  await using dir = await tempDir();
  const { key, config, env, accessLog } = await setup(dir.path, upstream);
  const cli = new ProxyCli(["proxy", "--profile", PROFILE, "--json"], { config, env });
  let stopped = false;
  try {
    const first = await cli.nextStdoutLine();
    let info: ProxyInfo;
    try {
      info = JSON.parse(first);
    } catch {
      assert.fail(`the first stdout line is not JSON: ${first}`);
    }

    await t.step("it prints the proxy URLs on loopback and a token, never the key", () => {
      assert.equal(info.profile, PROFILE);
      assert.equal(info.llm_base_url.length, 1);
      assert.match(info.llm_base_url[0], /^http:\/\/127\.0\.0\.1:\d+\/proxy\/v1$/);
      assert.equal(
        info.egress_proxy_url.length,
        1,
        "the default network mode (allowlist) has an egress proxy",
      );
      assert.match(info.egress_proxy_url[0], /^http:\/\/127\.0\.0\.1:\d+$/);
      assert.match(info.token, /^sbx_[A-Za-z0-9_-]{43}$/);
      assert.equal(info.env.OPENAI_API_KEY, info.token);
      assert.equal(info.env.HTTPS_PROXY, info.egress_proxy_url[0]);
      assert.ok(!first.includes(key), "the key is on stdout");
    });

    await t.step(
      "a request with the token reaches the upstream with the real key and returns 200",
      async () => {
        const arrived = upstream.nextRequest();
        const response = await fetch(`${info.llm_base_url[0]}/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${info.token}`, "content-type": "application/json" },
          body: CHAT_BODY,
        });
        const body = await response.json();
        assert.equal(response.status, 200, JSON.stringify(body));
        assert.equal(body.choices[0].message.content, "Hello");
        const request = await arrived;
        assert.equal(request.path, "/v1/chat/completions");
        assert.equal(request.headers.get("authorization"), `Bearer ${key}`);
        assert.equal(request.body, CHAT_BODY);
      },
    );

    await t.step("a wrong token gets 401 and nothing is forwarded", async () => {
      const before = upstream.requests.length;
      const wrong: Record<string, string>[] = [
        { authorization: "Bearer sbx_wrong" },
        // The real key itself is not a token either.
        { "x-api-key": key },
        {},
      ];
      for (const headers of wrong) {
        const response = await fetch(`${info.llm_base_url[0]}/chat/completions`, {
          method: "POST",
          headers: { ...headers, "content-type": "application/json" },
          body: CHAT_BODY,
        });
        const text = await response.text();
        assert.equal(response.status, 401, text);
        assert.ok(!text.includes(key), "the 401 echoes the presented key");
      }
      // The proxy refuses before it forwards: by the time the 401s arrived, nothing had left.
      assert.equal(upstream.requests.length, before);
    });

    await t.step(
      "the egress proxy answers CONNECT to a name not on the allowlist with 403",
      async () => {
        const answer = await rawRequest(
          info.egress_proxy_url[0],
          "CONNECT not-listed.invalid:443 HTTP/1.1\r\nHost: not-listed.invalid:443\r\n\r\n",
        );
        assert.match(answer, /^HTTP\/1\.1 403 /, answer);
        assert.match(answer, /not-listed\.invalid:443/);
        assert.match(answer, /allowlist policy of profile "e2e-proxy"/);
      },
    );

    await t.step(
      "SIGTERM ends it with exit code 0 and both ports stop accepting connections",
      async () => {
        const ports = [info.llm_base_url[0], info.egress_proxy_url[0]].map((url) =>
          Number(new URL(url).port)
        );
        const outcome = await cli.stop();
        stopped = true;
        assert.equal(
          outcome.exitCode,
          0,
          `exit ${outcome.exitCode} (signal ${outcome.signal})\n--- stderr\n${cli.stderr}`,
        );
        assert.equal(outcome.timedOut, false);
        assert.deepEqual(cli.stdoutLines, [first], "stdout holds exactly one JSON line");
        for (const port of ports) {
          assert.ok(await refusesConnections(port), `port ${port} still accepts connections`);
        }
      },
    );

    await t.step("the key appears nowhere in its output or its access log", async () => {
      assert.ok(!cli.stdoutLines.join("\n").includes(key), "the key is on stdout");
      assert.ok(!cli.stderr.includes(key), "the key is on stderr");
      const log = await Deno.readTextFile(accessLog);
      const entries = log.split("\n").filter(Boolean).map((line) => JSON.parse(line));
      assert.ok(
        entries.some((e) => e.kind === "llm" && e.decision === "allow" && e.status === 200),
        log,
      );
      assert.ok(
        entries.some((e) => e.kind === "egress" && e.decision === "deny" && e.status === 403),
        log,
      );
      assert.ok(!log.includes(key), "the key is in the access log");
      assert.ok(!log.includes(info.token), "the token is in the access log");
    });
  } finally {
    if (!stopped) await cli.stop();
  }
});

Deno.test("sandbox proxy without --json reports on stderr and keeps stdout empty", async () => {
  await using upstream = new FakeUpstream();
  await using dir = await tempDir();
  const { key, config, env } = await setup(dir.path, upstream);
  await using cli = new ProxyCli(["proxy", "--profile", PROFILE], { config, env });
  await cli.stderrLine((line) => line.includes("Ctrl-C stops the proxies"));
  const outcome = await cli.stop();
  assert.equal(outcome.exitCode, 0, `exit ${outcome.exitCode}\n--- stderr\n${cli.stderr}`);
  assert.deepEqual(cli.stdoutLines, [], "stdout is not empty");
  assert.match(cli.stderr, /credential proxy: http:\/\/127\.0\.0\.1:\d+\/proxy\/v1/);
  assert.match(cli.stderr, /egress proxy: http:\/\/127\.0\.0\.1:\d+/);
  assert.match(cli.stderr, /token: sbx_/);
  assert.ok(!cli.stderr.includes(key), "the key is on stderr");
});

Deno.test("sandbox proxy refuses to listen on all interfaces: exit 2, a clear message, no stack trace", async (t) => {
  await using upstream = new FakeUpstream();
  await using dir = await tempDir();
  const { key, config, env } = await setup(dir.path, upstream);
  for (const address of ["0.0.0.0", "::"]) {
    for (const json of [false, true]) {
      await t.step(`--listen ${address}${json ? " --json" : ""}`, async () => {
        const args = [
          "proxy",
          "--profile",
          PROFILE,
          "--listen",
          address,
          ...(json ? ["--json"] : []),
        ];
        const result = await runCli(args, { config, env, timeoutMs: CLI_TIMEOUT_MS });
        assert.equal(result.exitCode, 2, explain(result));
        assert.equal(result.stdout, "", explain(result));
        assert.match(
          result.stderr,
          new RegExp(`Refusing to listen on "${address.replaceAll(".", "\\.")}"`),
          explain(result),
        );
        assert.match(result.stderr, /loopback/, explain(result));
        assert.doesNotMatch(result.stderr, /^\s+at /m, `a stack trace:\n${explain(result)}`);
        assert.doesNotMatch(result.stderr, /internal error/, explain(result));
        assert.ok(!result.stderr.includes(key));
      });
    }
  }
  assert.equal(upstream.requests.length, 0);
});
