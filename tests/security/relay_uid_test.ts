/**
 * The relay runs under a uid of its own (10002), not the agent's (10001). A process of the
 * agent's uid — the run's agent itself, or what an earlier `sandbox exec` left in the development
 * sandbox while the next exec's relay starts — must not be able to read that relay's memory or
 * environment (its traffic and token), ptrace it (to inject code, or fork a child inside the
 * relay's protected tree), or kill it. These tests do
 * each of those as the agent, and the same against a process of the agent's own uid, which works:
 * the kernel (no Yama here) allows it, so the refusals are the uid's doing. And the relay's wrapper
 * keeps no state where the agent could have planted it.
 */
import { relayTransportFor } from "../../lib/sandbox/providers.ts";
import assert from "node:assert/strict";
import { openSession } from "../../lib/proxy/session.ts";
import {
  DockerSandboxProvider,
  RELAY_UID,
  RELAY_USER,
  SANDBOX_UID,
} from "../../lib/sandbox/docker_provider.ts";
import {
  assertDocker,
  docker,
  dockerTest,
  removeProfile,
  tempDir,
  uniqueProfile,
  upstreamProfile,
} from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

console.error("security: relay uid tests starting");

const KEY_ENV = "SANDBOX_TEST_RELAY_UID_KEY";

/**
 * `perl probe.pl PID OP...`, run as the agent: tries each OP on process PID and prints `OP done`
 * or `OP ERRNO-NAME`. mem: open /proc/PID/mem and read 16 bytes of its first readable mapping;
 * environ: read /proc/PID/environ; attach: ptrace(PTRACE_ATTACH); seize: ptrace(PTRACE_SEIZE);
 * kill: SIGKILL.
 */
const PROBE = String.raw`
use strict;
my ($pid, @ops) = @ARGV;
my %ptrace = (x86_64 => 101, aarch64 => 117);
chomp(my $machine = qx(uname -m));
my $PTRACE = $ptrace{$machine} // die "no ptrace number for $machine";
my %names = (1 => "EPERM", 3 => "ESRCH", 13 => "EACCES");
sub failed { my $e = $! + 0; return $names{$e} // "errno$e" }
sub slurp {
  my ($path) = @_;
  open(my $fh, "<:raw", $path) or return undef;
  local $/;
  my $text = <$fh>;
  return defined $text ? $text : "";
}
sub read_mem {
  my ($start) = (slurp("/proc/$pid/maps") // "") =~ /^([0-9a-f]+)-[0-9a-f]+ r/m;
  open(my $mem, "<:raw", "/proc/$pid/mem") or return 0;
  return defined $start && sysseek($mem, hex($start), 0) && sysread($mem, my $bytes, 16) == 16;
}
for my $op (@ops) {
  my $ok = $op eq "mem" ? read_mem()
    : $op eq "environ" ? defined slurp("/proc/$pid/environ")
    : $op eq "attach" ? syscall($PTRACE, 16, $pid + 0, 0, 0) == 0
    : $op eq "seize" ? syscall($PTRACE, 0x4206, $pid + 0, 0, 0) == 0
    : $op eq "kill" ? kill("KILL", $pid)
    : die "unknown op $op";
  print "$op ", ($ok ? "done" : failed()), "\n";
}
`;

/** The relay's deno process (not its wrapper), found as the agent would: by its command line. */
async function relayPid(container: string): Promise<string> {
  const pids = (await docker("exec", container, "pgrep", "-f", "^deno run .*/opt/sandbox/relay.js"))
    .split("\n");
  assert.equal(pids.length, 1, `relay processes: ${pids}`);
  return pids[0];
}

Deno.test({
  name:
    "a process of the agent's uid cannot read the relay's memory or environment, ptrace or kill it, on either relay path, while the same works against its own uid's processes; the relay carries requests on",
  ...dockerTest(),
  async fn(t) {
    assertDocker();
    await using upstream = new FakeUpstream({ key: "sk-test-relay-uid" });
    await using dir = await tempDir();
    const name = uniqueProfile("sec-relay-uid");
    const profile = upstreamProfile(name, upstream.baseUrl, KEY_ENV);
    const provider = new DockerSandboxProvider(profile);
    Deno.env.set(KEY_ENV, upstream.key);
    try {
      await provider.ensureRunning();
      await provider.writeFile("/tmp/probe.pl", PROBE);
      for (const transport of ["socket", "stream"] as const) {
        await t.step(`${transport} path`, async () => {
          await using session = await openSession(profile, relayTransportFor(provider), {
            accessLogPath: `${dir.path}/access.ndjson`,
            relayTransport: transport === "stream" ? "stream" : "auto",
          });
          assert.equal(session.relay.transport, transport);
          const relay = await relayPid(provider.containerName);
          // The relay really is another uid's process (read as root: /proc/PID/status is public).
          const status = await docker(
            "exec",
            "--user",
            "0",
            provider.containerName,
            "cat",
            `/proc/${relay}/status`,
          );
          assert.match(status, new RegExp(`^Uid:\\s+${RELAY_UID}\\s`, "m"), status);
          // As the agent: two processes of its own uid (a leftover's daemons, dumpable as any
          // process it runs), then the relay. Each op on its own line.
          const script = [
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & own=$!",
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & other=$!",
            `echo "uid $(id -u)"`,
            "echo '# own'; perl /tmp/probe.pl $own mem environ attach kill",
            "echo '# other'; perl /tmp/probe.pl $other seize kill",
            `echo '# relay'; perl /tmp/probe.pl ${relay} mem environ attach seize kill`,
          ].join("\n");
          const probed = await provider.exec(["sh", "-c", script], { timeoutMs: 30_000 });
          assert.equal(probed.exitCode, 0, probed.stderr);
          assert.deepEqual(probed.stdout.trim().split("\n"), [
            `uid ${SANDBOX_UID}`,
            "# own",
            "mem done",
            "environ done",
            "attach done",
            "kill done",
            "# other",
            "seize done",
            "kill done",
            "# relay",
            "mem EACCES",
            "environ EACCES",
            "attach EPERM",
            "seize EPERM",
            "kill EPERM",
          ], probed.stderr);
          // The relay is the one that was there, and it still carries the session's requests.
          assert.equal(await relayPid(provider.containerName), relay);
          assert.equal(session.relay.starts, 1, "the relay was not restarted");
          const after = await provider.exec([
            "sh",
            "-c",
            `curl -s -m 10 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`,
          ], { env: session.env, timeoutMs: 30_000 });
          assert.equal(after.stdout, "200", after.stderr);
        });
      }
    } finally {
      Deno.env.delete(KEY_ENV);
      await removeProfile(name);
    }
  },
});

Deno.test({
  name:
    "the relay's wrapper uses nothing the agent put in /tmp: not the sandbox user's state directory, not a directory planted under another name, not the shared Deno cache",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using upstream = new FakeUpstream({ key: "sk-test-relay-uid" });
    await using dir = await tempDir();
    const name = uniqueProfile("sec-relay-plant");
    const profile = upstreamProfile(name, upstream.baseUrl, KEY_ENV);
    const provider = new DockerSandboxProvider(profile);
    Deno.env.set(KEY_ENV, upstream.key);
    try {
      await provider.ensureRunning();
      // The agent empties /tmp of the tool's state (as in a fresh container, where the relay can
      // start first) and plants a directory of its own, open to all, under the names a wrapper of
      // another uid could pick, directly and through a symlink.
      const plant = await provider.exec([
        "sh",
        "-c",
        [
          "rm -rf /tmp/.sandbox-exec",
          "mkdir -m 0777 /tmp/planted",
          `ln -s /tmp/planted /tmp/.sandbox-exec-${RELAY_UID}`,
          `mkdir -m 0777 /tmp/.sandbox-exec-relay /tmp/.sandbox-exec-${RELAY_UID}-state`,
          "echo planted",
        ].join("\n"),
      ]);
      assert.equal(plant.stdout.trim(), "planted", plant.stderr);

      // A run's session: its relay is named after the run (\`relay-RUN-…\`).
      const runId = `plant-${crypto.randomUUID().slice(0, 8)}`;
      await using session = await openSession(profile, relayTransportFor(provider), {
        accessLogPath: `${dir.path}/access.ndjson`,
        runId,
      });
      const relay = await relayPid(provider.containerName);
      // What the relay runs with, read as its own uid (the only one that may).
      const environ = await docker(
        "exec",
        "--user",
        RELAY_USER,
        provider.containerName,
        "cat",
        `/proc/${relay}/environ`,
      );
      const denoDir = environ.split("\0").find((entry) => entry.startsWith("DENO_DIR="));
      assert.equal(
        denoDir,
        "DENO_DIR=/opt/sandbox/deno-dir",
        "the relay uses the image's read-only cache",
      );
      // Nothing in /tmp is the relay's, nothing landed in the planted directories, and the
      // sandbox user's state directory was not made by the relay's wrapper.
      const listing = await docker(
        "exec",
        "--user",
        "0",
        provider.containerName,
        "sh",
        "-c",
        `find /tmp -xdev -uid ${RELAY_UID} | sed 's/^/relay-owned /'
        for d in /tmp/planted /tmp/.sandbox-exec-relay /tmp/.sandbox-exec-${RELAY_UID}-state; do echo "$d $(ls -A $d | wc -l)"; done
        test -e /tmp/.sandbox-exec || echo "no state dir"`,
      );
      assert.deepEqual(listing.trim().split("\n"), [
        "/tmp/planted 0",
        "/tmp/.sandbox-exec-relay 0",
        `/tmp/.sandbox-exec-${RELAY_UID}-state 0`,
        "no state dir",
      ]);

      // Twin: the sandbox user's own wrapper makes its state directory again, its own, while the
      // relay runs; the relay carries requests.
      const after = await provider.exec([
        "sh",
        "-c",
        `stat -c '%u %a' /tmp/.sandbox-exec; curl -s -m 10 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`,
      ], { env: session.env, timeoutMs: 30_000 });
      assert.equal(after.stdout, `${SANDBOX_UID} 700\n200`, after.stderr);
    } finally {
      Deno.env.delete(KEY_ENV);
      await removeProfile(name);
    }
  },
});
