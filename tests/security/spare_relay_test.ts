/**
 * The spare relay (lib/proxy/spare_relay.ts): a session that closes leaves a relay waiting in its
 * container, and the next session claims it instead of starting one. These tests attack it from
 * inside the sandbox, as the agent, with more than an agent knows (the spare's directory, read
 * from the host's record), and check each outcome from outside:
 *
 * - the key that names the relay is not readable by the agent (its environment, the record), and
 *   the agent's own connections to the control socket — a wrong key, or nothing at all, held
 *   open — do not pass for the relay or hold it up: the session still gets the real one, which
 *   carries its requests;
 * - `sandbox exec` after `sandbox exec` in the development sandbox claims it (runs never use
 *   that sandbox: a pooled one gets a spare relay of its own before its run claims it);
 * - a session passes the spare it claimed on to the next one, and every connection the agent had
 *   open through it is cut as it does; between sessions it carries nothing;
 * - killed mid-session, it is replaced on the same ports, and requests work again;
 * - a spare that died with its container is found dead, and the session starts a relay itself.
 */
import { relayTransportFor } from "../../lib/sandbox/providers.ts";
import assert from "node:assert/strict";
import { openSession, type SandboxSession } from "../../lib/proxy/session.ts";
import { DockerSandboxProvider, RELAY_USER } from "../../lib/sandbox/docker_provider.ts";
import { PROXY_MOUNT_PATH, proxyMountSource } from "../../lib/sandbox/proxy_mount.ts";
import { run } from "../../lib/process.ts";
import {
  assertDocker,
  dockerTest,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  upstreamProfile,
  withEnv,
  writeConfig,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";
import { squatScript } from "../_squat.ts";

console.error("security: spare relay tests starting");

const KEY_ENV = "SANDBOX_TEST_SPARE_RELAY_KEY";
const KEY = "sk-test-spare-relay";

/** The host's record of the container's spare relay, or undefined. */
async function spareRecord(
  container: string,
): Promise<{ id: string; dir: string; key: string; ports: Record<string, number> } | undefined> {
  try {
    return JSON.parse(
      await Deno.readTextFile(`${await proxyMountSource(container)}.spare-relay.json`),
    );
  } catch {
    return undefined;
  }
}

/** The pid of the spare relay of socket directory `dir` in the container, read as root from outside. */
async function spareRelayPid(container: string, dir: string): Promise<number | undefined> {
  const ps = await run(["docker", "exec", "--user", "0", container, "ps", "-eo", "pid=,args="]);
  assert.equal(ps.exitCode, 0, ps.stderr);
  const line = ps.stdout.split("\n").find((line) =>
    /^\s*\d+ deno run .*relay\.js --spare/.test(line) &&
    line.includes(`--sockets ${PROXY_MOUNT_PATH}/${dir} `)
  );
  return line === undefined ? undefined : Number(line.trim().split(" ")[0]);
}

/** `bash -c script` in the sandbox as the agent, with the session's variables. */
async function agent(
  provider: DockerSandboxProvider,
  session: SandboxSession | undefined,
  script: string,
): Promise<string[]> {
  const result = await provider.exec(["bash", "-c", script], {
    env: session?.env ?? {},
    timeoutMs: 60_000,
  });
  assert.equal(result.exitCode, 0, `exit ${result.exitCode}: ${result.stderr}`);
  return result.stdout.trim().split("\n");
}

/** An LLM request through the session's relay, as the agent makes it: its status code. */
const LLM_CALL =
  `curl -s -m 10 -o /dev/null -w '%{http_code}\\n' -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`;

/** The agent's attempt on a spare's control socket: a wrong key, garbage, silence. */
const SQUAT = squatScript("control.sock", [`${"0".repeat(64)}\n`, "garbage\n", ""]);

/** `kill -SIG PID` in the container as the relay's uid (root there has no CAP_KILL). */
async function signalRelay(container: string, signal: string, pid: number): Promise<void> {
  const killed = await run([
    "docker",
    "exec",
    "--user",
    RELAY_USER,
    container,
    "kill",
    `-${signal}`,
    String(pid),
  ]);
  assert.equal(killed.exitCode, 0, killed.stderr);
}

/** Whether process `pid` exists in the container. */
async function alive(container: string, pid: number): Promise<boolean> {
  return (await run(["docker", "exec", "--user", "0", container, "test", "-d", `/proc/${pid}`]))
    .exitCode === 0;
}

Deno.test({
  name:
    "a spare relay: the agent neither reads its key nor passes for it; claimed, it carries the next session's requests; killed, it is replaced; dead with its container, it is passed over",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using upstream = new FakeUpstream({ key: KEY });
    await using dir = await tempDir();
    const name = uniqueProfile("sec-spare-relay");
    const profile = upstreamProfile(name, upstream.baseUrl, KEY_ENV);
    const provider = new DockerSandboxProvider(profile);
    const container = provider.containerName;
    const options = { accessLogPath: `${dir.path}/access.ndjson` };
    /** Open a session, let `use` have it, and close it leaving a spare relay; the spare's record. */
    const session = async (use: (session: SandboxSession) => Promise<void>) => {
      const opened = await openSession(profile, relayTransportFor(provider), options);
      try {
        await use(opened);
        opened.leaveSpareRelay();
      } finally {
        await opened.close();
      }
      const record = await spareRecord(container);
      assert.ok(record, "a closed session left no spare relay");
      const pid = await spareRelayPid(container, record.dir);
      assert.ok(pid, "no spare relay runs in the container");
      return { ...record, pid };
    };
    await withEnv({ [KEY_ENV]: KEY }, async () => {
      try {
        await provider.ensureRunning();
        let spare = await session((first) => {
          assert.equal(first.relay.transport, "socket");
          return Promise.resolve();
        });

        await t.step(
          "the agent cannot read the spare's key: not in its environment (its own process's is readable), nowhere in the sandbox's files",
          async () => {
            const lines = await agent(
              provider,
              undefined,
              `
            cat /proc/${spare.pid}/environ >/dev/null 2>&1 && echo relay-environ-read || echo relay-environ-refused
            env MARK=own sleep 5 & own=$!; sleep 0.3
            tr '\\0' '\\n' </proc/$own/environ | grep -q '^MARK=own$' && echo own-environ-read || echo own-environ-refused; kill $own
            grep -rlsF '${spare.key}' / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -1 | grep -q . && echo key-found || echo key-not-found
            ls ${PROXY_MOUNT_PATH} >/dev/null 2>&1 && echo mount-listed || echo mount-not-listed
            curl -s -m 10 -o /dev/null http://127.0.0.1:${spare.ports.llm}/proxy/v1/models; echo "spare-port-curl-exit $?"`,
            );
            assert.deepEqual(lines.slice(0, 4), [
              "relay-environ-refused",
              "own-environ-read",
              "key-not-found",
              "mount-not-listed",
            ]);
            // The spare listens (a refused connection would be curl's 7), but until a session
            // claims it there is nothing behind it: the connection is closed unanswered (52, 56).
            assert.match(lines[4], /^spare-port-curl-exit (52|56)$/);
          },
        );

        await t.step(
          "the agent's connections to the control socket (a wrong key, garbage, silence held open) do not pass for the relay: with the real one held still, the session passes the spare over, stops it, and carries its requests on a relay of its own",
          async () => {
            await provider.writeFile("/tmp/squat.js", SQUAT);
            // The agent polls the spare's directory (told to it: more than it knows) before the
            // session opens, and goes on while it does; the spare itself cannot answer.
            await signalRelay(container, "STOP", spare.pid);
            const squatting = provider.exec(
              [
                "deno",
                "run",
                "--quiet",
                "--no-config",
                "-A",
                "/tmp/squat.js",
                `${PROXY_MOUNT_PATH}/${spare.dir}`,
                "5",
              ],
              { timeoutMs: 60_000 },
            );
            await new Promise((resolve) => setTimeout(resolve, 1_000));
            const stopped = spare.pid;
            spare = await session(async (second) => {
              const squatted = await squatting;
              assert.equal(squatted.exitCode, 0, squatted.stderr);
              assert.ok(
                Number(squatted.stdout.trim()) > 0,
                `the agent never reached the control socket: ${squatted.stdout}`,
              );
              assert.equal(
                await alive(container, stopped),
                false,
                "the spare that did not answer was not stopped",
              );
              assert.equal(second.relay.transport, "socket");
              const before = upstream.requests.length;
              assert.deepEqual(await agent(provider, second, LLM_CALL), ["200"]);
              assert.equal(upstream.requests.length - before, 1);
            });
          },
        );

        await t.step(
          "the twin: the spare answering, the next session claims it (its directory, its ports, no relay of its own) and it carries the session's requests; closing, the session passes it on, cutting every connection the agent had open through it",
          async () => {
            const claimed = spare;
            let holding: Promise<{ stdout: string; exitCode: number; stderr: string }> | undefined;
            spare = await session(async (third) => {
              assert.equal(third.sandboxSocketDir, `${PROXY_MOUNT_PATH}/${claimed.dir}`);
              assert.equal(third.relay.starts, 1);
              assert.equal(third.relay.transport, "socket");
              assert.deepEqual(await agent(provider, third, LLM_CALL), ["200"]);
              // The agent opens a connection through the relay and holds it (a request begun,
              // never finished), hoping to carry it into the next session: it waits up to 30 s
              // for the connection to end.
              holding = provider.exec([
                "bash",
                "-c",
                `
                exec 3<>/dev/tcp/127.0.0.1/${third.relay.ports.llm} || exit 3
                printf 'GET /proxy/v1/models HTTP/1.1\r\nHost: relay\r\n' >&3
                echo open
                if timeout 30 cat <&3 >/dev/null; then echo closed; else echo held; fi`,
              ], { timeoutMs: 60_000 });
              await new Promise((resolve) => setTimeout(resolve, 1_000));
            });
            const held = await holding!;
            assert.equal(held.stdout, "open\nclosed\n", held.stderr);
            // The same relay, still waiting, in the same directory, on the same ports, with the
            // same key: nothing was started for the next session.
            assert.equal(spare.pid, claimed.pid);
            assert.equal(spare.dir, claimed.dir);
            assert.deepEqual(spare.ports, claimed.ports);
            assert.equal(spare.key, claimed.key);
            // Between sessions, the relay carries nothing: the directory holds no socket.
            const between = await agent(
              provider,
              undefined,
              `curl -s -m 10 -o /dev/null http://127.0.0.1:${spare.ports.llm}/proxy/v1/models; echo "curl-exit $?"`,
            );
            assert.match(between[0], /^curl-exit (52|56)$/);
            // And the next session gets it again.
            spare = await session(async (again) => {
              assert.equal(again.sandboxSocketDir, `${PROXY_MOUNT_PATH}/${claimed.dir}`);
              assert.equal(again.relay.starts, 1);
              assert.deepEqual(await agent(provider, again, LLM_CALL), ["200"]);
            });
            assert.equal(spare.pid, claimed.pid);
          },
        );

        await t.step(
          "killed mid-session, the claimed spare is replaced on the same ports and the session's requests work again",
          async () => {
            const claimed = spare;
            spare = await session(async (fourth) => {
              assert.equal(fourth.sandboxSocketDir, `${PROXY_MOUNT_PATH}/${claimed.dir}`);
              const ports = { ...fourth.relay.ports };
              const restarted = fourth.relay.nextReady();
              await signalRelay(container, "KILL", claimed.pid);
              await restarted;
              assert.equal(fourth.relay.starts, 2);
              assert.deepEqual(fourth.relay.ports, ports);
              assert.deepEqual(await agent(provider, fourth, LLM_CALL), ["200"]);
            });
          },
        );

        await t.step(
          "a spare that died with its container is passed over: the next session starts a relay itself, in a directory of its own",
          async () => {
            const restarted = await run(["docker", "restart", "--time", "1", container]);
            assert.equal(restarted.exitCode, 0, restarted.stderr);
            await using fifth = await openSession(profile, relayTransportFor(provider), options);
            assert.match(
              fifth.sandboxSocketDir ?? "",
              new RegExp(`^${PROXY_MOUNT_PATH}/[0-9a-f]{8}$`),
            );
            assert.equal(fifth.relay.transport, "socket");
            assert.deepEqual(await agent(provider, fifth, LLM_CALL), ["200"]);
            assert.equal(
              await spareRecord(container),
              undefined,
              "the dead spare's record was kept",
            );
          },
        );
      } finally {
        await removeProfile(name);
      }
    });
  },
});

Deno.test({
  name:
    "sandbox exec leaves a spare relay and the next sandbox exec claims it; down removes what the host kept for it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream({ key: KEY });
    await using dir = await tempDir();
    const name = uniqueProfile("sec-spare-exec");
    const config = await writeConfig(
      dir.path,
      `profiles:\n  ${name}:\n    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}\n`,
    );
    const env = { [KEY_ENV]: KEY, XDG_STATE_HOME: `${dir.path}/state`, SANDBOX_TRACE: "1" };
    try {
      const exec = (script: string) =>
        runCli(["exec", "-p", name, "--", "bash", "-c", script], {
          config,
          env,
          timeoutMs: 120_000,
        });
      const first = await exec(LLM_CALL);
      assert.equal(first.exitCode, 0, first.stderr);
      assert.equal(first.stdout.trim(), "200");
      assert.doesNotMatch(first.stderr, /spare relay claimed/);
      assert.match(first.stderr, /spare relay started/);
      const second = await exec(LLM_CALL);
      assert.equal(second.exitCode, 0, second.stderr);
      assert.equal(second.stdout.trim(), "200");
      assert.match(second.stderr, /spare relay claimed/);
      // The claimed one is passed on: no relay started, by this exec or the next.
      assert.match(second.stderr, /spare relay passed on/);
      assert.doesNotMatch(second.stderr, /spare relay started|docker api: exec relay\.js/);
      const third = await exec(LLM_CALL);
      assert.equal(third.stdout.trim(), "200", third.stderr);
      assert.match(third.stderr, /spare relay claimed/);
      assert.doesNotMatch(third.stderr, /spare relay started|docker api: exec relay\.js/);
      // After the last exec, its spare relay waits in the development sandbox for the next one.
      const record = await withEnv(
        { XDG_STATE_HOME: env.XDG_STATE_HOME },
        () => spareRecord(`sandbox-${name}`),
      );
      assert.ok(
        record && await spareRelayPid(`sandbox-${name}`, record.dir),
        "no spare relay waits after the exec",
      );
      // `down` removes the container, and with it what the host kept for its mount.
      const source = await withEnv(
        { XDG_STATE_HOME: env.XDG_STATE_HOME },
        () => proxyMountSource(`sandbox-${name}`),
      );
      const down = await runCli(["down", "-p", name], { config, env, timeoutMs: 120_000 });
      assert.equal(down.exitCode, 0, down.stderr);
      await assert.rejects(() => Deno.lstat(source), Deno.errors.NotFound);
      await assert.rejects(() => Deno.lstat(`${source}.spare-relay.json`), Deno.errors.NotFound);
    } finally {
      await removeProfile(name);
    }
  },
});
