/**
 * `sandbox doctor` on profiles in sandbox mode local, against real bubblewrap (tests/_local.ts
 * gates them): every defence HELD on the default profile, exit 0; and each defence that no profile
 * option turns off really weakened, one at a time, reported BROKEN with exit 3 — beside the twin,
 * the same doctor through the same wrappers weakening nothing.
 *
 * The weakening is a program the test puts first on PATH (mode local finds `bwrap` and the `perl`
 * of its command launcher there, and its disk watch runs `du` there), as a wrapper installed on a
 * machine would:
 * - `seccomp`: a `perl` that runs the launcher without its seccomp step (no filter: `unshare`
 *   works again);
 * - `network`: the holder's `bwrap --unshare-all` given `--share-net` (the sandbox has the host's
 *   network, its loopback included);
 * - `disk`: a `du` that says every directory is empty (the watch sees nothing grow).
 * No such wrapper weakens the survivor row alone: commands kept out of the sandbox's pid
 * namespace leave nothing either, the release killing what is left in the sandbox's cgroup.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { landlockSupport } from "../../lib/sandbox/local/landlock.ts";
import {
  explain,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  writeConfig,
} from "../_helpers.ts";
import { assertLocal, localTest } from "../_local.ts";

console.error("security: doctor (mode local) tests starting");

type Weakening = "none" | "seccomp" | "network" | "disk";

const LAUNCHER = new URL("../../lib/sandbox/local/launcher.ts", import.meta.url).pathname;

/** `bwrap`, by weakening: every argument handed to the real one but what the weakening drops. */
const BWRAP_SHIM = String.raw`
args=(); all=("$@")
for ((i = 0; i < ${"$"}{#all[@]}; i++)); do
  a=${"$"}{all[i]}
  args+=("$a")
  if [ "$weaken" = network ] && [ "$a" = --unshare-all ]; then args+=(--share-net); fi
done
exec "$real" "${"$"}{args[@]}"
`;

/** `perl`, by weakening: the launcher's program without its seccomp step. */
const PERL_SHIM = String.raw`
if [ "$weaken" = seccomp ] && [ "$1" = -e ]; then
  program=${"$"}{2//"${"$"}step"/}
  shift 2
  exec "$real" -e "$program" "$@"
fi
exec "$real" "$@"
`;

/** `du -sk -- DIR` that reports DIR empty. */
const DU_SHIM = String.raw`printf '0\t%s\n' "${"$"}{@: -1}"`;

interface Check {
  id: string;
  status: "held" | "broken" | "not_applicable";
  reason: string;
  evidence: string[];
}

interface Report {
  checks: Check[];
  broken: string[];
  durationMs: number;
  local: {
    limits: string;
    seccomp: string;
    memory: string;
    landlock: string;
    bwrap: string | null;
  };
}

/** The bundles are built once, into a state directory every test of this file shares. */
const state = await Deno.makeTempDir({ prefix: "sandbox-doctor-local-" });
globalThis.addEventListener("unload", () => Deno.removeSync(state, { recursive: true }));

async function shimDir(dir: string, weakening: Weakening): Promise<string> {
  const bin = `${dir}/bin`;
  await Deno.mkdir(bin);
  const quote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`;
  const real = (await run(["bash", "-c", "command -v bwrap"])).stdout.trim();
  assert.ok(real, "no bwrap on PATH");
  await Deno.writeTextFile(
    `${bin}/bwrap`,
    `#!/usr/bin/env bash\nreal=${quote(real)}\nweaken=${weakening}\n${BWRAP_SHIM}`,
    { mode: 0o755 },
  );
  const realPerl = (await run(["bash", "-c", "command -v perl"])).stdout.trim();
  const step =
    'syscall($seccomp, 1, 0, pack("S x6 P", length($program) / 8, $program)) == 0 or fail("seccomp");';
  assert.ok((await Deno.readTextFile(LAUNCHER)).includes(step), "the launcher's seccomp step");
  await Deno.writeTextFile(
    `${bin}/perl`,
    `#!/usr/bin/env bash\nreal=${quote(realPerl)}\nweaken=${weakening}\nstep=${
      quote(step)
    }\n${PERL_SHIM}`,
    { mode: 0o755 },
  );
  if (weakening === "disk") {
    await Deno.writeTextFile(`${bin}/du`, `#!/usr/bin/env bash\n${DU_SHIM}\n`, { mode: 0o755 });
  }
  return bin;
}

async function localDoctor(weakening: Weakening, sandboxYaml = "{mode: local}") {
  assertLocal();
  await using dir = await tempDir();
  const profile = uniqueProfile(`doc-l-${weakening}`);
  const config = await writeConfig(
    dir.path,
    `profiles:\n  ${profile}:\n    sandbox: ${sandboxYaml}\n`,
  );
  try {
    const bin = await shimDir(dir.path, weakening);
    const result = await runCli(["doctor", "-p", profile, "--json"], {
      config,
      env: { XDG_STATE_HOME: state, PATH: `${bin}:${Deno.env.get("PATH")}` },
      timeoutMs: 300_000,
    });
    let report: Report | undefined;
    try {
      report = JSON.parse(result.stdout);
    } catch {
      assert.fail(`doctor printed no JSON report\n${explain(result)}`);
    }
    const status = Object.fromEntries(report!.checks.map((c) => [c.id, c.status]));
    const check = (id: string) => report!.checks.find((c) => c.id === id)!;
    console.error(`doctor local ${weakening}: ${(report!.durationMs / 1000).toFixed(1)}s`);
    const left = await Array.fromAsync(Deno.readDir(`${state}/sandbox/local`)).catch(() => []);
    return { result, report: report!, status, check, leftover: left.map((e) => e.name) };
  } finally {
    await removeProfile(profile);
  }
}

/** Every check of the default local profile, with `broken` BROKEN. */
function expected(broken?: string): Record<string, string> {
  const all: Record<string, string> = {
    key: "held",
    host_service: "held",
    egress_allowlist: "held",
    address_guard: "held",
    escalation: "held",
    survivor: "held",
    disk: "held",
    git_grant: "not_applicable",
  };
  if (broken) all[broken] = "broken";
  return all;
}

Deno.test({
  name:
    "twin: doctor on a default mode-local profile reports every defence HELD, exits 0 and leaves no sandbox",
  ...localTest(),
  async fn() {
    const { result, report, status, check, leftover } = await localDoctor("none");
    assert.equal(result.exitCode, 0, explain(result));
    assert.deepEqual(status, expected(), explain(result));
    assert.deepEqual(report.broken, []);
    // Each HELD stands beside its twin that got through.
    for (const c of report.checks.filter((c) => c.status === "held")) {
      assert.doesNotMatch(c.evidence.at(-1) ?? "", /not reached|failed|never/, c.id);
    }
    assert.match(check("survivor").reason, /ended with (the sandbox|its command)/);
    assert.match(report.local.seccomp, /^filter applied/);
    assert.match(report.local.bwrap ?? "", /bubblewrap/);
    const landlock = await landlockSupport();
    assert.equal(
      report.local.landlock,
      "abi" in landlock ? `applied (ABI ${landlock.abi})` : `absent: ${landlock.absent}`,
    );
    assert.deepEqual(leftover, [], "the doctor's sandbox was left behind");
    assert.match(result.stderr, /doctor: releasing the throwaway sandbox/);
  },
});

Deno.test({
  name:
    "doctor reports escalation BROKEN with exit 3 when the launcher applies no seccomp filter (unshare works)",
  ...localTest(),
  async fn() {
    const { result, report, status, check, leftover } = await localDoctor("seccomp");
    assert.equal(result.exitCode, 3, explain(result));
    assert.deepEqual(status, expected("escalation"), explain(result));
    assert.match(check("escalation").reason, /user namespace/);
    assert.equal(report.local.seccomp, "not applied");
    assert.match(result.stderr, /are broken: escalation$/m);
    assert.deepEqual(leftover, []);
  },
});

Deno.test({
  name:
    "doctor reports the host service BROKEN with exit 3 when the sandbox shares the host's network",
  ...localTest(),
  async fn() {
    const { result, status, check, leftover } = await localDoctor("network");
    assert.equal(result.exitCode, 3, explain(result));
    assert.deepEqual(status, expected("host_service"), explain(result));
    assert.match(check("host_service").reason, /reached 127\.0\.0\.1:/);
    assert.deepEqual(leftover, []);
  },
});

Deno.test({
  name: "doctor reports the disk BROKEN with exit 3 when the host's du sees nothing grow",
  ...localTest(),
  async fn() {
    const { result, status, check, leftover } = await localDoctor("disk");
    assert.equal(result.exitCode, 3, explain(result));
    assert.deepEqual(status, expected("disk"), explain(result));
    assert.match(check("disk").evidence[0], /ran to its end/);
    assert.deepEqual(leftover, []);
  },
});

Deno.test({
  name:
    "doctor calls the egress rows NOT APPLICABLE in network mode full, where the local sandbox has only its loopback (exit 0)",
  ...localTest(),
  async fn() {
    const full = "{mode: local, network: {mode: full}}";
    const { result, status, check, leftover } = await localDoctor("none", full);
    assert.equal(result.exitCode, 0, explain(result));
    assert.deepEqual(status, {
      ...expected(),
      egress_allowlist: "not_applicable",
      address_guard: "not_applicable",
    }, explain(result));
    assert.match(check("egress_allowlist").reason, /interfaces: lo/);
    assert.deepEqual(leftover, []);
  },
});

Deno.test({
  name:
    "doctor reports the egress rows BROKEN with exit 3 in network mode full when the sandbox shares the host's network",
  ...localTest(),
  async fn() {
    const full = "{mode: local, network: {mode: full}}";
    const { result, status, leftover } = await localDoctor("network", full);
    assert.equal(result.exitCode, 3, explain(result));
    assert.equal(status.egress_allowlist, "broken", explain(result));
    assert.equal(status.address_guard, "broken", explain(result));
    assert.equal(status.host_service, "broken", explain(result));
    assert.deepEqual(leftover, []);
  },
});
