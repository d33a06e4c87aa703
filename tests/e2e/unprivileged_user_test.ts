/**
 * No root needed: an ordinary user in the `docker` group runs the bundled CLI with a default
 * profile (network allowlist), reaches the credential proxy and the egress proxy from inside the
 * sandbox, and completes an offline agent run. The test (root, as in CI) creates the user and
 * removes it after.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { decodeMessage } from "../../lib/run/protocol.ts";
import {
  DOCKER_AVAILABLE,
  explain,
  IN_CI,
  removeProfile,
  ROOT,
  tempDir,
  uniqueProfile,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("e2e: unprivileged user test starting");

const KEY_ENV = "SANDBOX_TEST_USER_KEY";

Deno.test({
  name:
    "an ordinary user in the docker group runs sandboxes with the default network policy, no root needed",
  // Creating a user needs root: CI runs as root; elsewhere this runs only when it can.
  ignore: !IN_CI && (!DOCKER_AVAILABLE || Deno.uid() !== 0),
  async fn() {
    assert.ok(DOCKER_AVAILABLE, "CI is set but no Docker engine is reachable");
    assert.equal(Deno.uid(), 0, "this test creates a user: run it as root");
    const built = await run(["bash", `${ROOT}/scripts/bundle.sh`]);
    assert.equal(built.exitCode, 0, explain(built));

    await using upstream = new FakeUpstream({ key: "sk-test-user-key" });
    const server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      () => new Response("hello from the host\n"),
    );
    await using hostServer = Object.assign(server, {
      [Symbol.asyncDispose]: () => server.shutdown(),
    });
    await using dir = await tempDir("sandbox-user-");
    const user = `sbxt${crypto.randomUUID().slice(0, 8)}`;
    const home = `${dir.path}/home`;
    const profile = uniqueProfile("e2e-user");
    let created = false;
    try {
      const added = await run([
        "useradd",
        "--no-create-home",
        "--home-dir",
        home,
        "--shell",
        "/bin/sh",
        "--groups",
        "docker",
        user,
      ]);
      assert.equal(added.exitCode, 0, explain(added));
      created = true;
      await Deno.chmod(dir.path, 0o755);
      await Deno.mkdir(home, { mode: 0o700 });
      for (
        const [from, to] of [["dist/sandbox.js", "sandbox.js"], [
          "examples/hello/prompt.txt",
          "prompt.txt",
        ], ["examples/hello/recording.json", "recording.json"]]
      ) {
        await Deno.copyFile(`${ROOT}/${from}`, `${home}/${to}`);
      }
      await Deno.writeTextFile(
        `${home}/sandbox.yaml`,
        `profiles:
  ${profile}:
    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}
    sandbox:
      network:
        allow: ["allowed.test:${hostServer.addr.port}"]
        hosts: {allowed.test: 127.0.0.1}
`,
      );
      const ids = (await run(["id", "-u", user])).stdout.trim();
      const chown = await run(["chown", "-R", `${user}:${user}`, home]);
      assert.equal(chown.exitCode, 0, explain(chown));

      /** The bundled CLI as the user, with a clean environment of its own (plus `env`). */
      const asUser = (args: string[], env: string[] = []) =>
        run([
          "runuser",
          "-u",
          user,
          "--",
          "env",
          "-i",
          `HOME=${home}`,
          "PATH=/usr/local/bin:/usr/bin:/bin",
          `${KEY_ENV}=sk-test-user-key`,
          ...env,
          Deno.execPath(),
          "run",
          "--allow-all",
          "--no-config",
          "sandbox.js",
          "--config",
          "sandbox.yaml",
          ...args,
        ], { cwd: home, timeoutMs: 600_000 });

      const exec = await asUser([
        "exec",
        "--profile",
        profile,
        "--",
        "sh",
        "-c",
        [
          "id -u",
          `curl -s -m 10 -o /dev/null -w "llm %{http_code}\\n" -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`,
          `curl -sS -m 10 http://allowed.test:${hostServer.addr.port}/`,
          `curl -s -m 10 -o /dev/null -w "denied %{http_code}\\n" http://denied.test/`,
          "ls /sys/class/net",
        ].join("\n"),
      ], ["SANDBOX_TRACE=1"]);
      assert.equal(exec.exitCode, 0, explain(exec));
      // This engine is local: the relay reached the user's sockets, mounted into the sandbox.
      assert.match(exec.stderr, /relay ready \(socket path\)/, exec.stderr);
      assert.deepEqual(exec.stdout.trim().split("\n"), [
        "10001",
        "llm 200",
        "hello from the host",
        "denied 403",
        "lo",
      ]);
      assert.equal(upstream.requests.length, 1);
      assert.equal(upstream.requests[0].headers.get("authorization"), "Bearer sk-test-user-key");

      // The same user, kept to the exec stream (what a remote engine gets), reaches them too.
      const streamed = await asUser([
        "exec",
        "--profile",
        profile,
        "--",
        "sh",
        "-c",
        `curl -s -m 10 -o /dev/null -w "llm %{http_code}\\n" -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`,
      ], ["SANDBOX_TRACE=1", "SANDBOX_RELAY_TRANSPORT=stream"]);
      assert.equal(streamed.exitCode, 0, explain(streamed));
      assert.match(streamed.stderr, /relay ready \(stream path\)/, streamed.stderr);
      assert.equal(streamed.stdout.trim(), "llm 200");

      const agent = await asUser([
        "run",
        "agentic",
        "--profile",
        profile,
        "--prompt-file",
        "prompt.txt",
        "--model",
        "replay:recording.json",
      ]);
      assert.equal(agent.exitCode, 0, explain(agent));
      const messages = agent.stdout.trim().split("\n").map((line, i) => decodeMessage(line, i + 1));
      assert.equal(messages.at(-1)?.type, "usage");
      const ran = messages.find((m) => m.type === "tool_result" && m.tool_name === "execute");
      assert.match(ran?.tool_output ?? "", /Hello from the sandbox, sandbox!/);

      // What the user's CLI kept on the host is the user's: the access log and run logs.
      const state = await Deno.stat(`${home}/.local/state/sandbox/access.ndjson`);
      assert.equal(String(state.uid), ids);
    } finally {
      await removeProfile(profile);
      if (created) {
        // Processes of the user are gone with the CLI; the user goes now.
        const removed = await run(["userdel", user]);
        assert.equal(removed.exitCode, 0, explain(removed));
      }
    }
  },
});
