/**
 * Attacks on sandbox mode local (lib/sandbox/local/, docs/local.md), each beside its positive twin:
 * the same action, allowed, succeeding on the same path. They run against real bubblewrap
 * sandboxes (tests/_local.ts gates them: skipped without bwrap, failing loudly under CI).
 */
import assert from "node:assert/strict";
import type { LocalSandbox } from "../../lib/sandbox/local/local_sandbox.ts";
import type { RunSandbox } from "../../lib/sandbox/provider.ts";
import { sandboxLifecycle } from "../../lib/sandbox/providers.ts";
import { processStartTicks, run, type RunResult } from "../../lib/process.ts";
import { landlockSupport } from "../../lib/sandbox/local/landlock.ts";
import { type HostCommand, launcherCommand } from "../../lib/sandbox/local/launcher.ts";
import { LOCAL_UID } from "../../lib/sandbox/local/bwrap.ts";
import { denoCacheDir } from "../../lib/sandbox/local/deno_cache.ts";
import { sha256HexOf } from "../../lib/hash.ts";
import { profileFrom, tempDir, uniqueProfile, withEnv } from "../_helpers.ts";
import { assertLocal, localTest } from "../_local.ts";

console.error("security: mode local tests starting");

/** A mode-local sandbox of a profile whose `sandbox:` is `{mode: local, ...extra}`, released after `fn`. */
async function withLocal<T>(
  extra: string,
  fn: (sandbox: RunSandbox, provider: LocalSandbox) => Promise<T>,
): Promise<T> {
  assertLocal();
  const state = await Deno.makeTempDir({ prefix: "sandbox-local-security-" });
  const previous = Deno.env.get("XDG_STATE_HOME");
  Deno.env.set("XDG_STATE_HOME", state);
  try {
    const name = uniqueProfile("local-sec");
    const yaml = `profiles:\n  ${name}:\n    sandbox: {mode: local${extra}}\n`;
    const lifecycle = await sandboxLifecycle(profileFrom(yaml, name));
    const sandbox = await lifecycle.acquire({ runId: crypto.randomUUID().slice(0, 8) });
    try {
      return await fn(sandbox, sandbox.provider as LocalSandbox);
    } finally {
      await sandbox.release();
    }
  } finally {
    if (previous === undefined) Deno.env.delete("XDG_STATE_HOME");
    else Deno.env.set("XDG_STATE_HOME", previous);
    await Deno.remove(state, { recursive: true });
  }
}

/** Host pids whose command line is exactly `argv`. */
async function hostProcesses(argv: string[]): Promise<number[]> {
  const wanted = argv.join("\0") + "\0";
  const found: number[] = [];
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    // A process that ended during the walk has no command line: not one of ours.
    const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (cmdline === wanted) found.push(Number(entry.name));
  }
  return found;
}

/** Poll until a host process has command line `argv`; their pids. */
async function untilSeen(argv: string[]): Promise<number[]> {
  let found = await hostProcesses(argv);
  for (let attempt = 0; attempt < 300 && found.length === 0; attempt++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    found = await hostProcesses(argv);
  }
  return found;
}

/** Poll until no host process has command line `argv` (a generous cap: the machine is shared). */
async function untilGone(argv: string[]): Promise<number[]> {
  let left = await hostProcesses(argv);
  for (let attempt = 0; attempt < 300 && left.length > 0; attempt++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    left = await hostProcesses(argv);
  }
  return left;
}

/** Run a launcher's host process as local_sandbox.ts does: its environment and nothing else. */
function runOnHost(command: HostCommand): Promise<RunResult> {
  return run(command.argv, { env: command.env, clearEnv: true, timeoutMs: 60_000 });
}

const test = (name: string, fn: () => Promise<void>) =>
  Deno.test({ name: `local: ${name}`, ...localTest(), fn });

test("a value in the host's environment is in no process, command line or file inside; a variable given to a command is (twin)", async () => {
  const canary = `canary-${crypto.randomUUID()}`;
  Deno.env.set("SANDBOX_LOCAL_CANARY", canary);
  try {
    await withLocal("", async (sandbox) => {
      const { provider } = sandbox;
      const look =
        `cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c -- "$1";
        grep -rls -- "$1" /workspace /home/sandbox /tmp /run/sandbox-proxy /etc /opt 2>/dev/null | wc -l`;
      // "[c]anary-…" matches the canary, not itself: the search's own command line is no hit.
      const attack = await provider.exec(["sh", "-c", look, "sh", `[c]${canary.slice(1)}`]);
      assert.deepEqual(attack.stdout.trim().split("\n"), ["0", "0"], attack.stderr);
      const twin = await provider.exec(["sh", "-c", 'echo "$SANDBOX_LOCAL_CANARY"'], {
        env: { SANDBOX_LOCAL_CANARY: canary },
      });
      assert.equal(twin.stdout.trim(), canary);
      const inherited = await provider.exec(["sh", "-c", 'echo "${SANDBOX_LOCAL_CANARY:-unset}"']);
      assert.equal(inherited.stdout.trim(), "unset");
    });
  } finally {
    Deno.env.delete("SANDBOX_LOCAL_CANARY");
  }
});

test("a command's environment is on no command line of the host while it runs, and its launcher has nothing of the host's environment; the command has exactly its own (twin)", async () => {
  const canary = `canary-${crypto.randomUUID()}`;
  Deno.env.set("SANDBOX_LOCAL_CANARY", canary);
  try {
    await withLocal("", async (_sandbox, provider) => {
      const token = `token-${crypto.randomUUID()}`;
      const child = provider.spawnInside(["sh", "-c", "env; echo; exec sleep 60"], {
        env: { SANDBOX_LLM_TOKEN: token },
      });
      try {
        const seen: string[] = [];
        for await (const line of child.lines()) {
          if (line === "") break;
          seen.push(line);
        }
        // The twin: the command has its variables, and nothing the host or the launcher added.
        assert.deepEqual(
          seen.filter((line) => !/^(PWD|SHLVL|_)=/.test(line)).sort(),
          Object.entries({ ...provider.env, SANDBOX_LLM_TOKEN: token })
            .map(([name, value]) => `${name}=${value}`).sort(),
        );
        // The attack: any user of the host reads every process's command line (`ps`). The
        // launcher, its parent on the host, has the token in its environment, readable by this
        // user alone, and nothing else of the host's but PATH.
        const onCommandLines: string[] = [];
        const launchers: string[] = [];
        for await (const entry of Deno.readDir("/proc")) {
          if (!/^\d+$/.test(entry.name)) continue;
          const read = (file: string) =>
            Deno.readTextFile(`/proc/${entry.name}/${file}`).catch(() => "");
          const cmdline = await read("cmdline");
          if (cmdline.includes(token)) {
            onCommandLines.push(`${entry.name}: …${cmdline.split("\0").slice(-4).join(" ")}`);
          }
          const environ = await read("environ");
          if (environ.includes(`=${token}`) && environ.includes("SANDBOX_COMMAND_ENV_")) {
            launchers.push(environ);
          }
        }
        assert.deepEqual(onCommandLines, []);
        assert.equal(launchers.length, 1, "one launcher holds the command's environment");
        const names = launchers[0].split("\0").filter(Boolean).map((entry) => entry.split("=")[0]);
        assert.deepEqual(
          names.filter((name) => name !== "PATH" && !name.startsWith("SANDBOX_COMMAND_ENV_")),
          [],
        );
        assert.ok(!launchers[0].includes(canary), "the host's environment reached the launcher");
      } finally {
        child.kill();
        await child.finished;
      }
    });
  } finally {
    Deno.env.delete("SANDBOX_LOCAL_CANARY");
  }
});

test("a server on the host's loopback is unreachable; a Unix socket in the proxies' directory is reached (twin)", async () => {
  await withLocal("", async (sandbox, provider) => {
    const server = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const socketPath = `${provider.dirs.proxy}/twin.sock`;
    const unix = Deno.listen({ transport: "unix", path: socketPath });
    const answer = async (listener: Deno.Listener) => {
      for await (const conn of listener) {
        await conn.write(new TextEncoder().encode("reached\n")).catch(() => 0);
        conn.close();
      }
    };
    const serving = Promise.all([answer(server), answer(unix)]);
    try {
      const connect = (target: string) =>
        sandbox.provider.exec([
          "deno",
          "eval",
          `const c = await Deno.connect(${target}); const b = new Uint8Array(16); ` +
          `const n = await c.read(b); console.log(new TextDecoder().decode(b.subarray(0, n ?? 0)).trim());`,
        ], { timeoutMs: 60_000 });
      const port = (server.addr as Deno.NetAddr).port;
      const attack = await connect(`{ hostname: "127.0.0.1", port: ${port} }`);
      assert.notEqual(attack.exitCode, 0, attack.stdout);
      assert.match(attack.stderr, /refused|unreachable/i);
      const twin = await connect(`{ transport: "unix", path: "/run/sandbox-proxy/twin.sock" }`);
      assert.equal(twin.stdout.trim(), "reached", twin.stderr);
      const links = await sandbox.provider.exec([
        "sh",
        "-c",
        "tail -n +3 /proc/net/dev | cut -d: -f1",
      ]);
      assert.deepEqual(links.stdout.trim().split(/\s+/), ["lo"]);
    } finally {
      server.close();
      unix.close();
      await serving.catch(() => {}); // a closed listener ends its loop with an error: expected
    }
  });
});

test("the user's home is invisible and the system unwritable; the checkout, home and /tmp of the sandbox are writable (twin)", async () => {
  const home = Deno.env.get("HOME") ?? "/root";
  const secret = `${home}/.sandbox-local-secret-${crypto.randomUUID().slice(0, 8)}`;
  await Deno.writeTextFile(secret, "host secret\n");
  try {
    await withLocal("", async (sandbox) => {
      const { provider } = sandbox;
      const users = await provider.exec(["sh", "-c", "cat /etc/passwd; whoami"]);
      assert.doesNotMatch(users.stdout, /^daemon:/m, "the host's user names are not listed");
      assert.match(users.stdout, /\nsandbox\n$/, "twin: the sandbox's own user is");
      const read = await provider.exec(["cat", "--", secret]);
      assert.notEqual(read.exitCode, 0);
      assert.equal(read.stdout, "");
      await provider.copyIn(secret, "/workspace/copied");
      assert.equal((await provider.exec(["cat", "/workspace/copied"])).stdout, "host secret\n");
      // bwrap's own layer, apart from Landlock's (which refuses the same writes): the root is
      // mounted read-only.
      const root = await provider.exec([
        "sh",
        "-c",
        `awk '$5 == "/" { print $6 }' /proc/self/mountinfo`,
      ]);
      assert.match(root.stdout, /^ro(,|$)/m, `the root's mount options: ${root.stdout}`);
      const marker = `m-${crypto.randomUUID().slice(0, 8)}`;
      for (const dir of ["/", "/usr/local", "/etc", "/opt/sandbox", home, "/run/sandbox-proxy"]) {
        const write = await provider.exec(["touch", `${dir}/${marker}`]);
        assert.notEqual(write.exitCode, 0, `${dir} is writable`);
        assert.equal(await Deno.lstat(`${dir}/${marker}`).then(() => true, () => false), false);
      }
      for (const dir of ["/workspace", "/home/sandbox", "/tmp"]) {
        const write = await provider.exec(["touch", `${dir}/${marker}`]);
        assert.equal(write.exitCode, 0, `${dir}: ${write.stderr}`);
      }
    });
  } finally {
    await Deno.remove(secret);
  }
});

test("no escalation: no capabilities, no new privileges, no new namespaces, host processes out of sight; the sandbox's own processes are seen (twin)", async () => {
  await withLocal("", async (sandbox) => {
    const { provider } = sandbox;
    const status = (await provider.exec(["cat", "/proc/self/status"])).stdout;
    assert.match(status, /^CapEff:\s+0000000000000000$/m);
    assert.match(status, /^CapPrm:\s+0000000000000000$/m);
    assert.match(status, /^NoNewPrivs:\s+1$/m);
    assert.match(status, /^CapBnd:\s+0000000000000000$/m);
    const nested = await provider.exec(["unshare", "--user", "--map-root-user", "true"]);
    assert.notEqual(nested.exitCode, 0);
    assert.match(nested.stderr, /Operation not permitted/);
    const onHost = await run(["unshare", "--user", "--map-root-user", "true"]);
    assert.equal(onHost.exitCode, 0, `twin: the host may: ${onHost.stderr}`);
    const mine = `${Deno.pid}`;
    const all = await provider.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]);
    assert.doesNotMatch(all.stdout, /deno test|security\/local_mode_test/);
    const trace = await provider.exec([
      "perl",
      "-e",
      '$! = 0; syscall(101, 16, $ARGV[0], 0, 0); print $!+0, "\\n"',
      mine,
    ]);
    assert.equal(trace.stdout.trim(), "1", "ptrace answers EPERM");
    const held = provider.execBytes(["sh", "-c", "echo started; exec sleep 4731"]);
    const reader = held.stdout.getReader();
    assert.equal(new TextDecoder().decode((await reader.read()).value), "started\n");
    const seen = await provider.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]);
    assert.match(seen.stdout, /sleep 4731/);
    reader.releaseLock();
    await held.stop();
    await held.stdout.cancel();
  });
});

test("host sysctls and device nodes are read-only inside (a command of root's sandbox is the host's uid 0): a sysctl opened for writing, a device's mode or times changed, are refused; reading both and writing to a device work (twin)", async () => {
  await withLocal("", async (_sandbox, provider) => {
    // Harmless if the defence fails: the value written back is the one read, the mode the one set.
    const attack = await provider.exec([
      "sh",
      "-c",
      `
      perl -e 'sysopen(my $f, "/proc/sys/fs/lease-break-time", 1) or die "sysctl: $!\\n"; print "sysctl opened\\n"'
      [ -e /proc/sysrq-trigger ] && { perl -e 'sysopen(my $f, "/proc/sysrq-trigger", 1) or die "sysrq: $!\\n"; print "sysrq opened\\n"'; }
      chmod 0666 /dev/null && echo chmod done
      touch /dev/null && echo touch done
      true`,
    ]);
    const said = `${attack.stdout}${attack.stderr}`;
    assert.doesNotMatch(said, /opened|done/, said);
    assert.match(said, /sysctl: Read-only file system/);
    assert.match(said, /chmod: .*Read-only file system/);
    const twin = await provider.exec([
      "sh",
      "-c",
      `
      cat /proc/sys/fs/lease-break-time >/dev/null && echo sysctl read
      echo x >/dev/null && echo null written
      head -c 8 /dev/urandom | wc -c`,
    ]);
    assert.equal(twin.stdout, "sysctl read\nnull written\n8\n", twin.stderr);
  });
});

test("a socket of a family no network namespace confines (AF_VSOCK) and io_uring are refused; an inet socket is made (twin)", async () => {
  await withLocal("", async (_sandbox, provider) => {
    const probe = (code: string) => provider.exec(["perl", "-e", code]);
    const vsock = await probe('socket(my $s, 40, 1, 0) or die "$!\\n"; print "made\\n"');
    assert.equal(vsock.stdout, "", "a vsock socket was made");
    assert.match(vsock.stderr, /Address family not supported/);
    const ring = await probe(
      'my $params = pack("x120"); my $fd = syscall(425, 8, $params); print $fd < 0 ? "$!\\n" : "ring\\n"',
    );
    assert.match(ring.stdout, /Function not implemented/, ring.stderr);
    const inet = await probe('socket(my $s, 2, 1, 0) or die "$!\\n"; print "made\\n"');
    assert.equal(inet.stdout, "made\n", inet.stderr);
  });
});

test("terminal injection (TIOCSTI) is refused; another terminal ioctl reaches the kernel (twin)", async () => {
  await withLocal("", async ({ provider }) => {
    const ioctl = (request: number) =>
      provider.exec([
        "perl",
        "-e",
        `my $b = "x" x 8; $! = 0; ioctl(STDIN, ${request}, $b); print $!+0, "\\n"`,
      ]);
    assert.equal((await ioctl(0x5412)).stdout.trim(), "1", "TIOCSTI answers EPERM");
    assert.equal((await ioctl(0x5413)).stdout.trim(), "25", "TIOCGWINSZ answers ENOTTY");
  });
});

test("a command is never started in the namespaces of a process that took the holder's pid, nor after the holder ended; at the holder's own pid and start it runs (twin)", async () => {
  await withLocal("", async (_sandbox, provider) => {
    const marker = `${provider.dirs.workspace}/ran`;
    const launch = (holder: { pid: number; startTicks: number }) =>
      runOnHost(
        launcherCommand({
          perl: provider.tools.perl,
          holder,
          uid: LOCAL_UID,
          seccompFile: `${provider.dirs.files}/seccomp.bpf`,
          cgroupJoins: provider.limits.cgroupJoins,
          rlimits: provider.limits.rlimits,
          cwd: "/",
          env: { PATH: "/usr/bin:/bin" },
          // Inside the sandbox it writes /workspace/ran; anywhere else, this host path.
          argv: ["sh", "-c", `echo ran >/workspace/ran 2>/dev/null || echo ran >${marker}`],
        }),
      );
    // A process of this user whose pid the launcher is given, as if it had taken a dead
    // holder's pid: its start differs, so its namespaces (the host's) are not entered.
    const impostor = await launch({ pid: Deno.pid, startTicks: provider.holderStart });
    assert.equal(impostor.exitCode, 125, impostor.stderr);
    assert.match(impostor.stderr, /the sandbox has ended \(process \d+ is another\)/);
    assert.equal(await Deno.stat(marker).then(() => true, () => false), false);
    const twin = await launch({ pid: provider.holderPid, startTicks: provider.holderStart });
    assert.equal(twin.exitCode, 0, twin.stderr);
    assert.equal(await Deno.readTextFile(marker), "ran\n");
    // The holder ended (its own command killed from inside): no command starts any more.
    await provider.exec(["sh", "-c", "kill -9 $(cat /proc/2/stat | cut -d' ' -f1)"]);
    const deadline = Date.now() + 10_000;
    while (await Deno.stat(`/proc/${provider.holderPid}`).then(() => true, () => false)) {
      assert.ok(Date.now() < deadline, "the holder outlived its command");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await assert.rejects(() => provider.exec(["true"]), /is not running/);
    const late = await launch({ pid: provider.holderPid, startTicks: provider.holderStart });
    assert.equal(late.exitCode, 125, late.stderr);
    assert.match(late.stderr, /the sandbox has ended/);
  });
});

test('the launcher knows a process by its pid and start time whatever its name: one whose name holds ") " is taken at its own start and refused at another (twin)', async () => {
  await withLocal("", async (_sandbox, provider) => {
    // A process of this test's (the host's) namespaces, named so that a parser reading after the
    // first ") " of /proc/PID/stat takes the wrong field for its start.
    const named = new Deno.Command("perl", {
      args: ["-e", '$0 = "x) 1 2 3"; sleep 60'],
      stdin: "null",
    }).spawn();
    try {
      for (let i = 0; i < 250; i++) {
        const stat = await Deno.readTextFile(`/proc/${named.pid}/stat`);
        if (stat.includes("(x) 1 2 3)")) break;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const start = await processStartTicks(named.pid);
      assert.ok(start, "the named process's start");
      const launch = (startTicks: number) =>
        runOnHost(launcherCommand({
          perl: provider.tools.perl,
          holder: { pid: named.pid, startTicks },
          uid: LOCAL_UID,
          seccompFile: `${provider.dirs.files}/seccomp.bpf`,
          cgroupJoins: [],
          rlimits: [],
          cwd: "/",
          env: { PATH: "/usr/bin:/bin" },
          argv: ["true"],
        }));
      // Taken: past the check of its start, the launcher stops only at the next one (its child's
      // parent is in its pid namespace: this process is in no sandbox), which says nothing.
      const own = await launch(start);
      assert.equal(own.exitCode, 125, own.stderr);
      assert.equal(own.stderr, "");
      const other = await launch(start + 1);
      assert.equal(other.exitCode, 125, other.stderr);
      assert.match(other.stderr, /is another/);
    } finally {
      named.kill();
      await named.status;
    }
  });
});

test("a setsid survivor does not outlive the sandbox; until the release it lives (twin)", async () => {
  const argv = ["sleep", "4732"];
  await withLocal("", async ({ provider }) => {
    const started = await provider.exec([
      "sh",
      "-c",
      "setsid sh -c 'exec sleep 4732' </dev/null >/dev/null 2>&1 &",
    ]);
    assert.equal(started.exitCode, 0);
    assert.equal((await untilSeen(argv)).length, 1, "the survivor left its command and lives");
  });
  assert.deepEqual(await untilGone(argv), []);
});

test("a timed-out command's detached setsid child is killed with it; a command that ends by itself keeps its own (twin)", async () => {
  await withLocal("", async ({ provider }) => {
    const detach = (seconds: number, then: string) =>
      `setsid sh -c 'exec sleep ${seconds}' </dev/null >/dev/null 2>&1 & ${then}`;
    const ended = await provider.exec(["sh", "-c", detach(4734, "true")]);
    assert.equal(ended.exitCode, 0);
    assert.equal((await untilSeen(["sleep", "4734"])).length, 1, "twin: it outlives its command");
    const stopped = await provider.exec(["sh", "-c", detach(4735, "exec sleep 300")], {
      timeoutMs: 1_500,
    });
    assert.equal(stopped.timedOut, true);
    assert.deepEqual(await hostProcesses(["sleep", "4735"]), [], "gone when the timeout returns");
  });
});

test("the sandbox dies with the process that owns it, SIGKILL included; until then it lives (twin)", async () => {
  assertLocal();
  const argv = ["sleep", "4733"];
  const state = await Deno.makeTempDir({ prefix: "sandbox-local-owner-" });
  const owner = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL("./_local_owner.ts", import.meta.url).pathname],
    env: { XDG_STATE_HOME: state },
    stdout: "piped",
  }).spawn();
  try {
    const reader = owner.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let said = "";
    while (!said.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) break;
      said += value;
    }
    const holder = Number(/^ready (\d+)$/m.exec(said)?.[1]);
    assert.ok(holder > 0, `the owner said: ${said}`);
    assert.equal((await untilSeen(argv)).length, 1, "the sandbox's survivor lives");
    owner.kill("SIGKILL");
    await owner.status;
    reader.releaseLock();
    await owner.stdout.cancel().catch(() => {}); // its writer is dead: nothing left to read
    assert.deepEqual(await untilGone(argv), []);
    let state = "";
    for (let attempt = 0; attempt < 300; attempt++) {
      // Gone (or a zombie its new parent has yet to reap): no process of the sandbox runs.
      state = (await Deno.readTextFile(`/proc/${holder}/stat`).catch(() => "")).split(" ")[2] ?? "";
      if (state === "" || state === "Z") break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.ok(state === "" || state === "Z", `the holder's init is still ${state}`);
  } finally {
    try {
      owner.kill("SIGKILL");
    } catch {
      // Killed by the test already.
    }
    await Deno.remove(state, { recursive: true });
  }
});

test("writing past resources.disk in the sandbox's /tmp (on the host's disk) stops the sandbox's commands; below it nothing stops (twin)", async () => {
  await withLocal(", resources: {disk: 8m}", async (sandbox, provider) => {
    let stopped: { code?: string } | undefined;
    const watch = sandbox.watchDisk({ onAbort: (reason) => stopped = reason });
    const reason = () => stopped;
    try {
      const small = await provider.exec(["sh", "-c", "head -c 2m /dev/zero >/tmp/small"]);
      assert.equal(small.exitCode, 0, small.stderr);
      await new Promise((resolve) => setTimeout(resolve, 2_500));
      assert.ok(!reason(), "stopped below the limit");
      const big = await provider.exec(["sh", "-c", "head -c 32m /dev/zero >/tmp/big"]);
      assert.equal(big.exitCode, 0, big.stderr);
      const deadline = Date.now() + 15_000;
      while (!reason() && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.equal(
        reason()?.code,
        "disk_limit",
        "32 MB in /tmp did not stop the sandbox (disk: 8m)",
      );
    } finally {
      await watch.close();
    }
  });
});

test("pids and memory limits hold where a cgroup enforces them; below them commands run (twin)", async () => {
  await withLocal(", resources: {pids: 32, memory: 96m}", async (sandbox, provider) => {
    const spawnMany = (n: number) =>
      sandbox.provider.exec([
        "sh",
        "-c",
        `i=0; while [ $i -lt ${n} ]; do sleep 20 & i=$((i+1)); done; kill $(jobs -p) 2>/dev/null; wait`,
      ], { timeoutMs: 120_000 });
    const few = await spawnMany(8);
    assert.equal(few.stderr, "");
    const many = await spawnMany(64);
    assert.match(many.stderr, /fork/i, "the 64 processes hit the limit of 32");
    const hog = (size: string) =>
      sandbox.provider.exec(["sh", "-c", `head -c ${size} /dev/zero | tail -n 1 | wc -c`], {
        timeoutMs: 120_000,
      });
    if (Deno.uid() === 0) {
      // Root, where a cgroup hierarchy has the memory controller, gets that cgroup: never rlimits.
      const has = (path: string) => Deno.stat(path).then(() => true, () => false);
      const offered = await has("/sys/fs/cgroup/cgroup.controllers")
        ? "cgroup2"
        : await has("/sys/fs/cgroup/memory/cgroup.procs")
        ? "cgroup1"
        : "rlimit";
      assert.equal(provider.limits.kind, offered);
    }
    const small = await hog("16m");
    assert.equal(small.stdout.trim(), String(16 * 1024 * 1024));
    if (provider.limits.kind === "rlimit") {
      // Without a cgroup memory is not limited: the sandbox says so rather than pretend.
      assert.equal((await provider.stats()).memoryLimitBytes, 0);
    } else {
      const big = await hog("400m");
      assert.equal(big.oomKilled, true, `${big.exitCode} ${big.stdout} ${big.stderr}`);
    }
  });
});

test("a run's Deno cache is its own copy: what one run writes there reaches neither the warmed cache nor the next run; its copy is the warmed one, in use and writable (twin)", async () => {
  // A cache directory of the test's own: with the defence broken, the poison must not stay.
  await using cache = await tempDir("sandbox-local-deno-cache-");
  await withEnv({ XDG_CACHE_HOME: cache.path }, poisonedCacheStaysInItsRun);
});

async function poisonedCacheStaysInItsRun(): Promise<void> {
  const sum = "sha256sum /tmp/deno-dir/v8_code_cache_v2 | cut -d' ' -f1";
  const warmed = `${await denoCacheDir()}/v8_code_cache_v2`;
  const first = await withLocal("", async (_sandbox, provider) => {
    const seen = await provider.exec(["sh", "-c", `echo "$DENO_DIR"; ${sum}`]);
    assert.equal(seen.exitCode, 0, seen.stderr);
    // The attack: poison the cache a later run's worker would load its compiled code from.
    const poison = await provider.exec([
      "sh",
      "-c",
      `echo poisoned >/tmp/deno-dir/v8_code_cache_v2 && ${sum}`,
    ]);
    assert.equal(poison.exitCode, 0, `its own copy is writable (twin): ${poison.stderr}`);
    return { seen: seen.stdout.trim().split("\n"), poisoned: poison.stdout.trim() };
  });
  const warmedSum = await sha256HexOf(await Deno.readFile(warmed));
  assert.deepEqual(
    first.seen,
    ["/tmp/deno-dir", warmedSum],
    "the run starts from the warmed cache",
  );
  assert.notEqual(first.poisoned, warmedSum);
  assert.equal((await Deno.stat(warmed)).mode! & 0o777, 0o444, "the warmed cache stays read-only");
  const next = await withLocal("", (_sandbox, provider) => provider.exec(["sh", "-c", sum]));
  assert.equal(next.stdout.trim(), warmedSum, "the next run gets the warmed cache, not the poison");
}

test("a descriptor the host process leaves inheritable is not open in a command; a host child has it (twin)", async () => {
  // A descriptor opened without close-on-exec, as a parent of the CLI (a shell's `exec 7<file`,
  // a CI runner) may leave one: libc's open(2) directly, since Deno marks its own close-on-exec.
  const libc = Deno.dlopen("libc.so.6", {
    open: { parameters: ["buffer", "i32"], result: "i32" },
    close: { parameters: ["i32"], result: "i32" },
  });
  const fd = libc.symbols.open(new TextEncoder().encode("/dev/null\0"), 0 /* O_RDONLY */);
  assert.ok(fd > 2, `open(2) failed: ${fd}`);
  const probe = ["sh", "-c", `test -e /proc/self/fd/${fd} && echo open || echo closed`];
  try {
    const host = await run(probe);
    assert.equal(host.stdout.trim(), "open", "a host child inherits the descriptor");
    await withLocal("", async (sandbox) => {
      const inside = await sandbox.provider.exec(probe);
      assert.equal(inside.stdout.trim(), "closed", inside.stderr);
    });
  } finally {
    libc.symbols.close(fd);
    libc.close();
  }
});

/** The kernel's Landlock ABI by the syscall itself (libc's syscall(2)): 0 where it has none. */
function kernelLandlockAbi(): number {
  const libc = Deno.dlopen("libc.so.6", {
    syscall: { parameters: ["i64", "i64", "i64", "i64"], result: "i64" },
  });
  try {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    const abi = Number(libc.symbols.syscall(444n, 0n, 0n, 1n));
    return abi > 0 ? abi : 0;
  } finally {
    libc.close();
  }
}

test("Landlock refuses a path the sandbox's mounts show but its ruleset does not name; the checkout beside it is written, and without Landlock the same path is (twins)", async () => {
  const abi = kernelLandlockAbi();
  const support = await landlockSupport();
  assert.deepEqual(support, abi > 0 ? { abi } : support, "the sandbox sees the kernel's Landlock");
  await withLocal("", async (_sandbox, provider) => {
    const script = 'cat "$1/existing"; echo written >"$1/new" && echo wrote; ls "$1" >/dev/null';
    // One more mount in the sandbox's filesystem (the holder's mount namespace, which every
    // command enters): a directory mounted over /run, which the mounts show and
    // the Landlock ruleset does not name (it names /run/sandbox-proxy only). Its source is the
    // sandbox's /tmp, where the host puts it first.
    await Deno.mkdir(`${provider.dirs.tmp}/extra`);
    await Deno.writeTextFile(`${provider.dirs.tmp}/extra/existing`, "bound but not allowed\n");
    const mounted = await run([
      "nsenter",
      `--target=${provider.holderPid}`,
      "--user",
      "--mount",
      "--",
      "mount",
      "--bind",
      "/tmp/extra",
      "/run",
    ]);
    assert.equal(mounted.exitCode, 0, mounted.stderr);
    // The command as the sandbox starts it (`commandFor`), or by a launcher without the Landlock step.
    const commandWithExtra = (dir: string, landlock: boolean) => {
      const command = ["sh", "-c", script, "sh", dir];
      const env = { PATH: "/usr/bin:/bin" };
      return runOnHost(
        landlock ? provider.commandFor(command, "/workspace", env) : launcherCommand({
          perl: provider.tools.perl,
          holder: { pid: provider.holderPid, startTicks: provider.holderStart },
          uid: LOCAL_UID,
          seccompFile: `${provider.dirs.files}/seccomp.bpf`,
          cgroupJoins: provider.limits.cgroupJoins,
          rlimits: provider.limits.rlimits,
          cwd: "/workspace",
          env,
          argv: command,
        }),
      );
    };
    const attack = await commandWithExtra("/run", true);
    const inside = `${attack.stdout}${attack.stderr}`;
    if (abi === 0) {
      // No Landlock on this kernel: the mount namespace stands alone, and says so.
      assert.ok("absent" in provider.landlock);
      assert.match(inside, /wrote/);
      return;
    }
    assert.deepEqual(provider.landlock, { abi });
    assert.doesNotMatch(inside, /bound but not allowed|wrote/);
    assert.match(attack.stderr, /Permission denied/);
    assert.equal(
      await Deno.lstat(`${provider.dirs.tmp}/extra/new`).then(() => true, () => false),
      false,
    );
    await Deno.writeTextFile(`${provider.dirs.workspace}/existing`, "the checkout\n");
    const twin = await commandWithExtra("/workspace", true);
    assert.equal(twin.stdout, "the checkout\nwrote\n", twin.stderr);
    const bare = await commandWithExtra("/run", false);
    assert.equal(bare.stdout, "bound but not allowed\nwrote\n", `mounts alone: ${bare.stderr}`);
  });
});
