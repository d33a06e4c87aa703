/**
 * The socket path (a local engine): each container has the proxies' socket directory of its
 * sessions bind-mounted read-only at /run/sandbox-proxy, and the relay inside connects to the
 * sockets directly. These tests do, from inside the sandbox as the agent, what an agent could do
 * with that directory — change it, connect to the sockets without the relay, look for another
 * container's or another session's sockets — and show that it gains nothing, each beside its
 * positive twin on the same path.
 */
import { relayTransportFor } from "../../lib/sandbox/providers.ts";
import assert from "node:assert/strict";
import { openSession, type SandboxSession } from "../../lib/proxy/session.ts";
import { DockerSandboxProvider, SANDBOX_UID } from "../../lib/sandbox/docker_provider.ts";
import { PROXY_MOUNT_PATH, proxyMountSource } from "../../lib/sandbox/proxy_mount.ts";
import { homeDir, userStateDir } from "../../lib/paths.ts";
import { run } from "../../lib/process.ts";
import {
  assertDocker,
  dockerTest,
  profileFrom,
  removeProfile,
  tempDir,
  uniqueProfile,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("security: relay socket path tests starting");

const KEY_ENV = "SANDBOX_TEST_SOCKET_KEY";

/** A server on the host's loopback that counts the requests it answers, by path. */
function countingServer() {
  const seen: string[] = [];
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    (req) => {
      seen.push(new URL(req.url).pathname);
      return new Response("reached");
    },
  );
  return { port: server.addr.port, seen, [Symbol.asyncDispose]: () => server.shutdown() };
}

function profileFor(name: string, upstream: FakeUpstream, port: number) {
  return profileFrom(
    [
      "profiles:",
      `  ${name}:`,
      `    llm: {provider: custom, base_url: "${upstream.baseUrl}", key: {env: ${KEY_ENV}}}`,
      `    sandbox: {network: {mode: allowlist, allow: ["allowed.test:${port}"], hosts: {allowed.test: 127.0.0.1, denied.test: 127.0.0.1}}}`,
    ].join("\n"),
    name,
  );
}

/** `bash -c script` in the sandbox as the agent (the sandbox user), with the session's variables. */
async function agent(
  provider: DockerSandboxProvider,
  session: SandboxSession,
  script: string,
): Promise<string[]> {
  const result = await provider.exec(["bash", "-c", script], {
    env: { ...session.env, S: session.sandboxSocketDir ?? "", M: PROXY_MOUNT_PATH },
    timeoutMs: 60_000,
  });
  assert.equal(result.exitCode, 0, `exit ${result.exitCode}: ${result.stderr}`);
  return result.stdout.trim().split("\n");
}

/** `name: exit code: first line of stderr` for each command, so that a script never stops early. */
const TRY =
  `t() { local name="$1"; shift; local err; err=$("$@" 2>&1 >/dev/null); echo "$name: $?: \${err%%$'\\n'*}"; }`;

/** Everything the agent could do to directory "$1": replace entry "$2", remove entry "$3". */
const CHANGES = `
changes() {
  local d="$1"
  t "create a file" touch "$d/new"
  t "make a directory" mkdir "$d/newdir"
  t "link" ln -s /tmp/elsewhere "$d/link"
  t "replace an entry" mv "$d/$2" "$d/moved"
  t "remove an entry" rm -r "$d/$3"
  t "bind a socket of its own" deno eval --quiet "Deno.listen({ transport: 'unix', path: '$d/llm2.sock' })"
  t "open up the directory" chmod 0777 "$d"
  t "remove the directory" rm -r "$d"
}`;

Deno.test({
  name:
    "on the socket path, the agent cannot change the mounted directory, reaches the proxies only as the relay does, and a session's sockets are its own and gone when it closes",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using upstream = new FakeUpstream({ key: "sk-test-socket" });
    await using server = countingServer();
    await using dir = await tempDir();
    const name = uniqueProfile("sec-socket");
    const profile = profileFor(name, upstream, server.port);
    const provider = new DockerSandboxProvider(profile);
    Deno.env.set(KEY_ENV, "sk-test-socket");
    try {
      await provider.ensureRunning();
      await using session = await openSession(profile, relayTransportFor(provider), {
        accessLogPath: `${dir.path}/access.ndjson`,
      });
      assert.equal(session.relay.transport, "socket");
      const sandboxDir = session.sandboxSocketDir!;
      assert.match(sandboxDir, new RegExp(`^${PROXY_MOUNT_PATH}/[0-9a-f]{8}$`));
      assert.equal(
        session.socketDir,
        `${await proxyMountSource(provider.containerName)}/${sandboxDir.split("/").pop()}`,
      );

      await t.step(
        "the agent (another uid than the files' owner) can create, replace, remove or re-permission nothing in it; the same commands succeed in a directory of its own",
        async () => {
          const lines = await agent(
            provider,
            session,
            `${TRY}\n${CHANGES}
          echo "uid $(id -u)"
          echo "modes $(stat -c '%a %u' "$M" "$S" "$S/llm.sock" | paste -sd ' ')"
          t "list the mounted directory" ls "$M"
          echo "-- mounted"; changes "$M" "$(basename "$S")" "$(basename "$S")"
          echo "-- session"; changes "$S" llm.sock egress.sock
          # The twin: the same in a directory the agent owns, with entries like those.
          mkdir -p /tmp/twin/a /tmp/twin/b && touch /tmp/twin/a/llm.sock
          echo "-- own"; changes /tmp/twin a b`,
          );
          const host = Deno.uid();
          assert.equal(lines[0], `uid ${SANDBOX_UID}`);
          assert.equal(
            lines[1],
            `modes 711 ${host} 711 ${host} 666 ${host}`,
            "the modes the sandbox sees",
          );
          assert.match(lines[2], /^list the mounted directory: 2: .*Permission denied/);
          const section = (label: string) => {
            const at = lines.indexOf(`-- ${label}`);
            return lines.slice(at + 1, at + 9);
          };
          for (const label of ["mounted", "session"]) {
            for (const line of section(label)) {
              // The mount is read-only: refused whatever the permissions say.
              assert.match(
                line,
                /: [1-9]\d*: .*Read-only file system/,
                `${label}: ${line}\n${lines.join("\n")}`,
              );
            }
          }
          for (const line of section("own")) {
            assert.match(line, /: 0:\s*$/, `own directory: ${line}`);
          }
          // Nothing changed on the host either, and the session still works on the socket path.
          assert.deepEqual([...Deno.readDirSync(session.socketDir)].map((e) => e.name).sort(), [
            "egress.sock",
            "llm.sock",
          ]);
          const [after] = await agent(
            provider,
            session,
            `curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`,
          );
          assert.equal(after, "200");
        },
      );

      await t.step(
        "the sandbox's mount table shows neither the user's home nor the state directory, while the mount is there and the relay uses it (twin)",
        async () => {
          const [mountinfo, user] = await Promise.all([
            agent(provider, session, "cat /proc/self/mountinfo"),
            run(["id", "-un"]).then((r) => r.stdout.trim()),
          ]);
          const line = mountinfo.find((l) => l.split(" ")[4] === PROXY_MOUNT_PATH);
          assert.ok(line, `no mount at ${PROXY_MOUNT_PATH}:\n${mountinfo.join("\n")}`);
          // Field 4 is the mounted directory's path in its filesystem: the host path, or its tail.
          assert.match(line.split(" ")[3], /(^|\/)sandbox-proxy-[0-9a-f]{16}\/[0-9a-f]{12}$/, line);
          const text = mountinfo.join("\n");
          const home = homeDir();
          for (
            const revealing of [
              userStateDir(),
              ...(home !== "/" ? [`${home}/`] : []),
              ...(user && user !== "root" ? [user] : []),
            ]
          ) {
            assert.ok(!text.includes(revealing), `the mount table shows "${revealing}": ${line}`);
          }
          assert.equal(session.relay.transport, "socket");
        },
      );

      await t.step(
        "a connection straight to a socket, past the relay, meets the same checks: without the token 401, outside the allowlist 403; with them, served",
        async () => {
          const before = upstream.requests.length;
          const lines = await agent(
            provider,
            session,
            `
          code() { curl -s -m 10 -o /dev/null -w '%{http_code}' "$@"; echo; }
          auth=(-H "Authorization: Bearer $SANDBOX_LLM_TOKEN")
          # The credential proxy: through the relay, then straight to its socket.
          code "$SANDBOX_LLM_BASE_URL/models"
          code --unix-socket "$S/llm.sock" http://sandbox/proxy/v1/models
          code "\${auth[@]}" "$SANDBOX_LLM_BASE_URL/models"
          code "\${auth[@]}" --unix-socket "$S/llm.sock" http://sandbox/proxy/v1/models
          # The egress proxy: a name outside the allowlist, then one in it (absolute-form requests).
          code -x "$HTTP_PROXY" http://denied.test:${server.port}/relay-denied
          code --unix-socket "$S/egress.sock" --request-target http://denied.test:${server.port}/socket-denied http://denied.test:${server.port}/socket-denied
          code -x "$HTTP_PROXY" http://allowed.test:${server.port}/relay-allowed
          code --unix-socket "$S/egress.sock" --request-target http://allowed.test:${server.port}/socket-allowed http://allowed.test:${server.port}/socket-allowed`,
          );
          assert.deepEqual(lines, ["401", "401", "200", "200", "403", "403", "200", "200"]);
          assert.equal(
            upstream.requests.length - before,
            2,
            "only the requests with the token reach the upstream",
          );
          assert.deepEqual(server.seen, ["/relay-allowed", "/socket-allowed"]);
        },
      );

      await t.step(
        "two sessions on one container each have their own sockets: one's token is refused by the other's proxies, on either path",
        async () => {
          await using other = await openSession(profile, relayTransportFor(provider), {
            accessLogPath: `${dir.path}/access.ndjson`,
          });
          assert.equal(other.relay.transport, "socket");
          assert.notEqual(other.sandboxSocketDir, sandboxDir);
          assert.notEqual(other.env.SANDBOX_LLM_BASE_URL, session.env.SANDBOX_LLM_BASE_URL);
          const lines = await agent(
            provider,
            session,
            `
          code() { curl -s -m 10 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$@"; echo; }
          code "$SANDBOX_LLM_BASE_URL/models"
          code --unix-socket "$S/llm.sock" http://sandbox/proxy/v1/models
          code "${other.env.SANDBOX_LLM_BASE_URL}/models"
          code --unix-socket "${other.sandboxSocketDir}/llm.sock" http://sandbox/proxy/v1/models`,
          );
          assert.deepEqual(lines, ["200", "200", "401", "401"]);
        },
      );

      await t.step(
        "closing the session removes its sockets, on the host and in the sandbox",
        async () => {
          const closing = await openSession(profile, relayTransportFor(provider), {
            accessLogPath: `${dir.path}/access.ndjson`,
          });
          const probe =
            `test -S "${closing.sandboxSocketDir}/llm.sock" && echo present || echo absent`;
          assert.deepEqual(await agent(provider, session, probe), ["present"]);
          await closing.close();
          await assert.rejects(() => Deno.stat(closing.socketDir), Deno.errors.NotFound);
          assert.deepEqual(await agent(provider, session, probe), ["absent"]);
        },
      );
    } finally {
      Deno.env.delete(KEY_ENV);
      await removeProfile(name);
    }
  },
});

Deno.test({
  name:
    "a sandbox sees only its own container's sockets: another container's session directory does not exist in it",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream({ key: "sk-test-socket" });
    await using server = countingServer();
    await using dir = await tempDir();
    const names = [uniqueProfile("sec-socket-a"), uniqueProfile("sec-socket-b")];
    Deno.env.set(KEY_ENV, "sk-test-socket");
    try {
      const opened: { provider: DockerSandboxProvider; session: SandboxSession }[] = [];
      for (const name of names) {
        const profile = profileFor(name, upstream, server.port);
        const provider = new DockerSandboxProvider(profile);
        await provider.ensureRunning();
        const session = await openSession(profile, relayTransportFor(provider), {
          accessLogPath: `${dir.path}/access.ndjson`,
        });
        opened.push({ provider, session });
        assert.equal(session.relay.transport, "socket");
      }
      try {
        const [a, b] = opened;
        assert.notEqual(
          await proxyMountSource(a.provider.containerName),
          await proxyMountSource(b.provider.containerName),
        );
        const probe = (dir: string) => `test -S "${dir}/llm.sock" && echo present || echo absent`;
        // The attack: from A, B's socket by its path (which A cannot list, and here is told).
        // Its twin: A's own, the same way.
        assert.deepEqual(
          await agent(
            a.provider,
            a.session,
            `${probe(b.session.sandboxSocketDir!)}; ${probe(a.session.sandboxSocketDir!)}`,
          ),
          ["absent", "present"],
        );
        assert.deepEqual(
          await agent(
            b.provider,
            b.session,
            `${probe(a.session.sandboxSocketDir!)}; ${probe(b.session.sandboxSocketDir!)}`,
          ),
          ["absent", "present"],
        );
      } finally {
        for (const { session } of opened) await session.close();
      }
    } finally {
      Deno.env.delete(KEY_ENV);
      for (const name of names) await removeProfile(name);
    }
  },
});
