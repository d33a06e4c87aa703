/**
 * Attack: reach a host service through the egress proxy under an allowed name that resolves to an
 * internal address (issue 9, item 6). The agent's side is a script that uses nothing but the
 * environment the session gives the sandbox (`HTTP_PROXY`), as an agent would, so it does not
 * depend on how the proxy is reached (through the relay, on loopback inside). `NO_PROXY` lists
 * `localhost`, so the script overrides it, as an attacker would.
 *
 * The target is a server this test starts on the host's loopback only. The proxy must refuse
 * `localhost` (allowlisted, resolved by the host to 127.0.0.1) on both the plain-HTTP and the
 * CONNECT path, and a numeric spelling of 127.0.0.1 (allowlisted literally); the positive twin,
 * the same requests under a name the user mapped to 127.0.0.1 in `network.hosts`, succeeds.
 */
import assert from "node:assert/strict";
import {
  assertDocker,
  dockerTest,
  explain,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";

console.error("security: egress internal-address tests starting");

/** A server on the host's loopback only, recording the path of every request it receives. */
function loopbackServer(): Deno.HttpServer<Deno.NetAddr> & AsyncDisposable & { paths: string[] } {
  const paths: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    paths.push(new URL(req.url).pathname);
    return new Response("hello from the host loopback\n");
  });
  return Object.assign(server, { paths, [Symbol.asyncDispose]: () => server.shutdown() });
}

interface Probe {
  /** What curl printed: the response body, or its error message. */
  output: string;
  /** The final response's status (000 when none). */
  httpCode: string;
  /** The proxy's answer to CONNECT (000 when no CONNECT was made). */
  connectCode: string;
}

/** Lines `name<TAB>http connect<TAB>output` from the script, by name. */
function parseProbes(stdout: string): Map<string, Probe> {
  const probes = new Map<string, Probe>();
  for (const line of stdout.split("\n")) {
    const match = /^([a-z-]+)\t(\d{3}) (\d{3})\t(.*)$/.exec(line);
    if (match) {
      probes.set(match[1], { httpCode: match[2], connectCode: match[3], output: match[4] });
    }
  }
  return probes;
}

async function readEgressLog(stateDir: string): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(`${stateDir}/sandbox/access.ndjson`).catch(() => "");
  return text.split("\n").filter(Boolean).map((line) => JSON.parse(line))
    .filter((entry) => entry.kind === "egress");
}

Deno.test({
  name:
    "an allowlisted name resolving to the host's loopback is refused with 403 from inside a sandbox; the same service under a name mapped in network.hosts answers",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using server = loopbackServer();
    await using dir = await tempDir();
    const port = server.addr.port;
    const profile = uniqueProfile("sec-egress-internal");
    const config = await writeConfig(
      dir.path,
      `profiles:
  ${profile}:
    sandbox:
      network:
        mode: allowlist
        allow: ["localhost:${port}", "127.0.0.1:${port}", "mapped.test:${port}"]
        hosts: {mapped.test: 127.0.0.1}
`,
    );
    // Only the session's environment: HTTP_PROXY names the proxy, whatever the transport.
    const script = `set -u
echo SANDBOX-SIDE-START
probe() {
  name=$1; shift
  rm -f /tmp/probe-body /tmp/probe-err
  codes=$(curl -sS -m 20 --noproxy '' --proxy "$HTTP_PROXY" -o /tmp/probe-body -w '%{http_code} %{http_connect}' "$@" 2>/tmp/probe-err)
  printf '%s\t%s\t%s\n' "$name" "$codes" "$(cat /tmp/probe-body /tmp/probe-err 2>/dev/null | tr '\n' ' ')"
}
probe plain-localhost "http://localhost:${port}/attack-plain"
probe connect-localhost --proxytunnel "http://localhost:${port}/attack-connect"
probe plain-literal "http://2130706433:${port}/attack-literal"
probe plain-mapped "http://mapped.test:${port}/twin-plain"
probe connect-mapped --proxytunnel "http://mapped.test:${port}/twin-connect"
echo SANDBOX-SIDE-END
`;
    try {
      const result = await runCli(["exec", "--profile", profile, "--", "sh", "-c", script], {
        config,
        env: { XDG_STATE_HOME: `${dir.path}/state` },
        timeoutMs: 240_000,
      });
      assert.equal(result.exitCode, 0, explain(result));
      const lines = result.stdout.trim().split("\n");
      assert.equal(lines[0], "SANDBOX-SIDE-START", explain(result));
      assert.equal(lines.at(-1), "SANDBOX-SIDE-END", explain(result));
      const probes = parseProbes(result.stdout);
      const probe = (name: string) => {
        const found = probes.get(name);
        assert.ok(found, `no result for probe ${name}\n${explain(result)}`);
        return found;
      };

      // The attack, plain HTTP: 403 from the proxy, saying why and how to allow it.
      const plain = probe("plain-localhost");
      assert.equal(plain.httpCode, "403", plain.output);
      assert.match(
        plain.output,
        new RegExp(
          `^sandbox egress proxy: "localhost:${port}" resolved to an internal address \\(a loopback address\\), .*network\\.hosts of profile "${profile}"`,
        ),
      );
      // The attack, CONNECT: the proxy refuses the tunnel itself.
      const connect = probe("connect-localhost");
      assert.equal(connect.connectCode, "403", connect.output);
      assert.match(connect.output, /CONNECT tunnel failed, response 403/);
      // The attack, a numeric spelling of 127.0.0.1, listed literally in the allowlist.
      const literal = probe("plain-literal");
      assert.equal(literal.httpCode, "403", literal.output);
      assert.match(
        literal.output,
        new RegExp(`"127\\.0\\.0\\.1:${port}" is an internal address \\(a loopback address\\)`),
      );

      // The positive twins: the same service, the same paths through the proxy, under a mapped name.
      const twinPlain = probe("plain-mapped");
      assert.deepEqual([twinPlain.httpCode, twinPlain.output], [
        "200",
        "hello from the host loopback ",
      ]);
      const twinConnect = probe("connect-mapped");
      assert.deepEqual(
        [twinConnect.connectCode, twinConnect.httpCode, twinConnect.output],
        ["200", "200", "hello from the host loopback "],
      );

      // The listener received the twins' requests and nothing of the attacks.
      assert.deepEqual(server.paths, ["/twin-plain", "/twin-connect"]);

      // The access log: the refusals with the address the name resolved to, the twins with the
      // address actually connected to.
      const log = await readEgressLog(`${dir.path}/state`);
      assert.deepEqual(
        log.map((e) => [e.method, e.host, e.decision, e.status, e.address]),
        [
          ["GET", "localhost", "deny", 403, undefined],
          ["CONNECT", "localhost", "deny", 403, undefined],
          ["GET", "127.0.0.1", "deny", 403, undefined],
          ["GET", "mapped.test", "allow", 200, "127.0.0.1"],
          ["CONNECT", "mapped.test", "allow", 200, "127.0.0.1"],
        ],
      );
      assert.match(String(log[0].reason), /resolved: 127\.0\.0\.1 \(a loopback address\)/);
    } finally {
      await removeProfile(profile);
    }
  },
});
