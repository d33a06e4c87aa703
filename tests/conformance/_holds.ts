/**
 * The contract's isolation items that a target declares (`ConformanceTarget.holds`): the pids
 * limit, no network, the relay, the key kept out. Each is checked against reality either way: an
 * item the target holds is attacked and seen to hold, beside its positive twin; an item it
 * declares not held (mode none has no isolation; a pod spec has no pids limit) is seen to be
 * reported as such, or to be reachable — never skipped.
 */
import { bridgeHostAddress, type BridgeInspect } from "../../lib/doctor/listeners.ts";
import assert from "node:assert/strict";
import type { Profile } from "../../lib/config.ts";
import { openSession } from "../../lib/proxy/session.ts";
import type { RunSandbox } from "../../lib/sandbox/provider.ts";
import { docker, upstreamProfile } from "../_helpers.ts";
import { FakeUpstream } from "../unit/_fake_upstream.ts";

/** The `resources.pids` every target's profile sets (`PIDS_YAML`). */
export const PIDS_LIMIT = 128;
/** The `sandbox.resources` entry for `PIDS_LIMIT`, for a target's YAML flow mapping. */
export const PIDS_YAML = `resources: {pids: ${PIDS_LIMIT}}`;

/** An item a target holds (`true`), or why it does not. */
export type Held = true | { not: string };

/** What a target declares of the isolation items. */
export interface Holds {
  /** The profile's pids limit holds; else stats report no limit and more processes start. */
  pidsLimit: Held;
  /** A command cannot connect to this machine; else it connects. */
  noNetwork: Held;
  /** A session opens on the sandbox's relay; else the sandbox has none (`relay` undefined). */
  relay: Held;
  /**
   * The session's key is in no process environment, argv or readable file of the sandbox; else
   * a command reads the environment of the process holding it (this one).
   */
  keyAbsent: Held;
}

/** What the checks need of the opened target. */
export interface HoldsSubject {
  holds: Holds;
  /** The profile its sandboxes are made for (the session's adds the fake upstream). */
  profile: Profile;
  /** This machine's address as a command in the sandbox would route to it (never another's). */
  hostAddress(): Promise<string>;
}

const KEY_ENV = "SANDBOX_TEST_CONFORMANCE_KEY";

/** This machine's address on Docker's default bridge, as a container would route to it. */
export async function bridgeGateway(): Promise<string> {
  const inspected = await docker("network", "inspect", "bridge", "--format", "{{json .}}");
  const address = bridgeHostAddress(JSON.parse(inspected) as BridgeInspect);
  if (!address) throw new Error(`No address of this machine on Docker's bridge: ${inspected}`);
  return address;
}

/** This machine's loopback address (a sandbox with a network namespace has its own loopback). */
export function loopback(): Promise<string> {
  return Promise.resolve("127.0.0.1");
}

/**
 * Starts `$1` `sleep`s in the background; a failed fork ends the shell (dash: exit 2). Prints
 * how many started; the EXIT trap stops them all either way.
 */
const FORK =
  'pids=""; trap \'kill $pids 2>/dev/null\' EXIT; i=0; while [ "$i" -lt "$1" ]; do sleep 120 & pids="$pids $!"; i=$((i + 1)); done; echo "$i"';

/** One HTTP request from inside, printing "<http code> <curl exit code>". */
const CURL = ["curl", "-s", "-m", "20", "-o", "/dev/null", "-w", "%{http_code} %{exitcode}"];

/** The LLM request of a session, from inside. */
const LLM_REQUEST = `curl -s -m 60 -o /dev/null -w '%{http_code} %{exitcode}' ` +
  `-H "Authorization: Bearer $SANDBOX_LLM_TOKEN" "$SANDBOX_LLM_BASE_URL/models"`;

/**
 * The files (of the sandbox user's reading) containing the pattern given on stdin: every
 * process's environment and command line, and every file but under /proc, /sys and /dev whose
 * inode changed since `$1` (epoch seconds; the pattern did not exist before, so no older file can
 * hold it, and a change time cannot be set back as a modification time can). The pattern is held
 * in the shell and given to each grep on stdin, so that it is on no argv. The top-level directories
 * are named too: where Landlock holds (mode local) `/` itself cannot be listed, while what is under
 * the directories it allows can be read.
 */
const FIND = `k=$(cat)
{ for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do echo "$f"; done
  find / /cache /etc /home /opt /root /run /srv /tmp /usr /var /workspace \\
    \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -newerct "@$1" -print 2>/dev/null |
    sort -u
} | while IFS= read -r f; do
  printf '%s' "$k" | grep -qsF --devices=skip -f - "$f" && echo "$f"
done; exit 0`;

/** The pids limit: held (below it processes start, beyond it they do not) or reported absent. */
export async function checkPidsLimit(subject: HoldsSubject, sandbox: RunSandbox): Promise<void> {
  const { provider } = sandbox;
  const fork = (count: number) =>
    provider.exec(["sh", "-c", FORK, "sh", String(count)], { timeoutMs: 120_000 });
  const beyond = PIDS_LIMIT * 2;
  const stats = await provider.stats();
  if (subject.holds.pidsLimit === true) {
    assert.equal(stats.pidsLimit, PIDS_LIMIT, "the provider reports the profile's limit");
    const below = await fork(16);
    assert.equal(below.exitCode, 0, below.stderr);
    assert.equal(below.stdout.trim(), "16");
    const past = await fork(beyond);
    assert.notEqual(past.exitCode, 0, `${beyond} processes started: ${past.stdout}`);
    assert.match(past.stderr, /fork/i);
  } else {
    assert.equal(stats.pidsLimit, 0, "the provider reports no limit");
    const past = await fork(beyond);
    assert.equal(past.exitCode, 0, past.stderr);
    assert.equal(past.stdout.trim(), String(beyond));
  }
}

/** No network: a listener on this machine hears nothing from the sandbox, and answers this machine. */
export async function checkNoNetwork(subject: HoldsSubject, sandbox: RunSandbox): Promise<void> {
  const address = await subject.hostAddress();
  assert.ok(
    Deno.networkInterfaces().some((each) => each.address === address),
    `${address} is an address of this machine`,
  );
  const heard: string[] = [];
  await using server = Deno.serve(
    { hostname: address, port: 0, onListen: () => {} },
    (request) => {
      heard.push(new URL(request.url).pathname);
      return new Response("listening\n");
    },
  );
  const url = `http://${address}:${server.addr.port}`;
  const inside = await sandbox.provider.exec([...CURL, `${url}/from-sandbox`], {
    timeoutMs: 120_000,
  });
  const [code, exit] = inside.stdout.trim().split(" ");
  if (subject.holds.noNetwork === true) {
    assert.equal(code, "000", `the sandbox reached ${url}: ${inside.stdout}`);
    assert.notEqual(exit, "0");
    assert.deepEqual(heard, [], "the listener heard the sandbox");
  } else {
    assert.equal(code, "200", `the sandbox did not reach ${url}: ${inside.stdout}${inside.stderr}`);
    assert.deepEqual(heard, ["/from-sandbox"]);
  }
  // The twin: this machine itself connects to the same listener.
  const answer = await fetch(`${url}/from-host`);
  assert.equal(await answer.text(), "listening\n");
  assert.ok(heard.includes("/from-host"));
}

/**
 * The relay and the key: a session on the sandbox's relay answers a request from inside, its key
 * reaching the upstream and found nowhere in the sandbox. Declared otherwise, the sandbox has no
 * relay, and a command reads the environment of the process holding the key.
 */
export async function checkRelayAndKey(subject: HoldsSubject, sandbox: RunSandbox): Promise<void> {
  const { provider } = sandbox;
  const before = Math.floor(Date.now() / 1000) - 1;
  await using upstream = new FakeUpstream();
  const previous = Deno.env.get(KEY_ENV);
  Deno.env.set(KEY_ENV, upstream.key);
  try {
    if (subject.holds.relay !== true) {
      assert.equal(sandbox.relay, undefined, "the sandbox has no relay, as declared");
    }
    if (subject.holds.keyAbsent !== true) {
      const holder = await provider.exec(["cat", `/proc/${Deno.pid}/environ`]);
      assert.equal(holder.exitCode, 0, `the key holder's environment: ${holder.stderr}`);
    }
    if (subject.holds.relay !== true) return;
    const llm = upstreamProfile(subject.profile.name, upstream.baseUrl, KEY_ENV).llm;
    const dir = await Deno.makeTempDir({ prefix: "sandbox-conformance-log-" });
    try {
      await using session = await openSession({ ...subject.profile, llm }, sandbox.relay!, {
        accessLogPath: `${dir}/access.ndjson`,
      });
      const answer = await provider.exec(["sh", "-c", LLM_REQUEST], {
        env: session.env,
        timeoutMs: 120_000,
      });
      assert.equal(answer.stdout, "200 0", `through the relay: ${answer.stdout}${answer.stderr}`);
      const forwarded = upstream.requests.at(-1);
      assert.equal(forwarded?.headers.get("authorization"), `Bearer ${upstream.key}`);
      if (subject.holds.keyAbsent === true) {
        await checkKeyAbsent(sandbox, upstream.key, {
          env: session.env,
          since: before,
        });
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  } finally {
    if (previous === undefined) Deno.env.delete(KEY_ENV);
    else Deno.env.set(KEY_ENV, previous);
  }
}

/** Where the twin of the key's search writes the session's token (writable in every target). */
const TOKEN_FILE = "/tmp/conformance-token.txt";

/** The key is nowhere the sandbox user reads; the same search finds the session's token. */
async function checkKeyAbsent(
  sandbox: RunSandbox,
  key: string,
  { env, since }: { env: Record<string, string>; since: number },
): Promise<void> {
  const find = (pattern: string) =>
    sandbox.provider.exec(["sh", "-c", FIND, "sh", String(since)], {
      stdin: pattern,
      env,
      timeoutMs: 300_000,
    });
  const forKey = await find(key);
  assert.equal(forKey.stdout, "", `the key is in the sandbox: ${forKey.stdout}`);
  // The twin: the token, in the searching command's own environment and in a file written now,
  // is found in both.
  await sandbox.provider.writeFile(TOKEN_FILE, env.SANDBOX_LLM_TOKEN);
  const forToken = await find(env.SANDBOX_LLM_TOKEN);
  assert.match(forToken.stdout, /^\/proc\/\d+\/environ$/m, forToken.stderr);
  assert.match(forToken.stdout, new RegExp(`^${TOKEN_FILE}$`, "m"), forToken.stderr);
}
