/**
 * `sandbox doctor` against sandboxes weakened where no profile option reaches: the defences the
 * configuration cannot turn off (escalation, survivors, the disk limit) really broken, one at a
 * time, and reported BROKEN with exit 3 — each beside its twin, the same doctor through the same
 * docker client with nothing weakened, where every defence is HELD.
 *
 * The weakening is a docker client the test puts first on PATH (a script, so every call goes
 * through it, none through the engine's socket: see lib/sandbox/engine_api.ts), as a wrapper of
 * the `docker` command would: it hands everything to the real client, except, by mode —
 * - `escalation`: `docker create` without `--cap-drop ALL` and `--security-opt no-new-privileges`
 *   (the image's setuid programs work again);
 * - `survivor`: `docker exec` of a bash command without the `sandbox-exec` wrapper (its variables
 *   renamed as the wrapper would; nothing kills what the command leaves behind);
 * - `disk`: a volume's `size` option (the kernel quota) silently dropped while `docker volume
 *   inspect` still reports it, as a storage driver that ignores the option would: the host trusts
 *   the quota and watches nothing.
 * The same weakening given to the library as `DoctorOptions.docker` instead reaches the sandbox too.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
import { runDoctor } from "../../lib/doctor/doctor.ts";
import {
  assertDocker,
  dockerTest,
  explain,
  profileFrom,
  removeProfile,
  runCli,
  tempDir,
  uniqueProfile,
  withEnv,
  writeConfig,
} from "../_helpers.ts";

console.error("security: doctor (weakened sandbox) tests starting");

type Weakening = "none" | "escalation" | "survivor" | "disk";

/** The shim's bash: `$real` is the real client, `$dir` keeps the quotas it pretends to give. */
const SHIM = String.raw`
weaken=$1; shift
if [ "$weaken" = escalation ] && [ "$1" = create ]; then
  args=(); all=("$@")
  for ((i = 0; i < ${"$"}{#all[@]}; i++)); do
    a=${"$"}{all[i]}; b=${"$"}{all[i+1]:-}
    if { [ "$a" = --cap-drop ] && [ "$b" = ALL ]; } ||
       { [ "$a" = --security-opt ] && [ "$b" = no-new-privileges ]; }; then i=$((i + 1)); continue; fi
    args+=("$a")
  done
  exec "$real" "${"$"}{args[@]}"
fi
if [ "$weaken" = survivor ] && [ "$1" = exec ] && [[ " $* " == *" sandbox-exec "*" bash -c "* ]]; then
  args=(); all=("$@")
  for ((i = 0; i < ${"$"}{#all[@]}; i++)); do
    a=${"$"}{all[i]}; b=${"$"}{all[i+1]:-}
    if [ "$a" = sandbox-exec ] && [ "${"$"}{all[i+2]:-}" = bash ]; then i=$((i + 1)); continue; fi
    # The variables the wrapper would have renamed (docker_env.ts): renamed here, still by name.
    if [ "$a" = --env ] && [[ "$b" == SANDBOX_EXEC_ENV_* ]]; then
      export "${"$"}{b#SANDBOX_EXEC_ENV_}=${"$"}{!b}"; args+=(--env "${"$"}{b#SANDBOX_EXEC_ENV_}"); i=$((i + 1)); continue
    fi
    args+=("$a")
  done
  exec "$real" "${"$"}{args[@]}"
fi
if [ "$weaken" = disk ] && [ "$1 $2" = "volume create" ]; then
  args=(); all=("$@"); size=
  for ((i = 0; i < ${"$"}{#all[@]}; i++)); do
    if [ "${"$"}{all[i]}" = --opt ] && [[ "${"$"}{all[i+1]:-}" == size=* ]]; then
      size=${"$"}{all[i+1]#size=}; i=$((i + 1)); continue
    fi
    args+=("${"$"}{all[i]}")
  done
  "$real" "${"$"}{args[@]}" || exit $?
  [ -z "$size" ] || printf %s "$size" >"$dir/${"$"}{all[-1]}.size"
  exit 0
fi
if [ "$weaken" = disk ] && [ "$1 $2" = "volume inspect" ] && [ $# = 3 ] && [ -f "$dir/$3.size" ]; then
  out=$("$real" "$@") || { printf '%s\n' "$out"; exit 1; }
  printf '%s\n' "$out" | jq --arg size "$(cat "$dir/$3.size")" '.[0].Options = ((.[0].Options // {}) + {size: $size})'
  exit 0
fi
exec "$real" "$@"
`;

interface Check {
  id: string;
  status: "held" | "broken" | "not_applicable";
  reason: string;
  evidence: string[];
}

/** A directory holding `docker`: the shim for `weakening` in front of the real client. */
async function shimDir(dir: string, weakening: Weakening): Promise<string> {
  const real = (await run(["bash", "-c", "command -v docker"])).stdout.trim();
  assert.ok(real, "no docker client on PATH");
  const bin = `${dir}/bin`;
  await Deno.mkdir(bin);
  const quote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`;
  await Deno.writeTextFile(
    `${bin}/docker`,
    `#!/usr/bin/env bash\nreal=${quote(real)}\ndir=${
      quote(bin)
    }\nset -- ${weakening} "$@"\n${SHIM}`,
    { mode: 0o755 },
  );
  return bin;
}

async function weakenedDoctor(weakening: Weakening) {
  const dir = await tempDir();
  const profile = uniqueProfile(`doc-w-${weakening}`);
  const config = await writeConfig(dir.path, `profiles:\n  ${profile}:\n    sandbox: {}\n`);
  try {
    const bin = await shimDir(dir.path, weakening);
    const result = await runCli(["doctor", "-p", profile, "--json"], {
      config,
      env: { XDG_STATE_HOME: `${dir.path}/state`, PATH: `${bin}:${Deno.env.get("PATH")}` },
      timeoutMs: 300_000,
    });
    const left = await run([
      "docker",
      "ps",
      "-aq",
      "--filter",
      `label=dev.sandbox.profile=${profile}`,
    ]);
    let report: { checks: Check[]; broken: string[]; durationMs: number } | undefined;
    try {
      report = JSON.parse(result.stdout);
    } catch {
      assert.fail(`doctor printed no JSON report\n${explain(result)}`);
    }
    const status = Object.fromEntries(report!.checks.map((c) => [c.id, c.status]));
    const check = (id: string) => report!.checks.find((c) => c.id === id)!;
    console.error(`doctor weakened ${weakening}: ${(report!.durationMs / 1000).toFixed(1)}s`);
    return { result, report: report!, status, check, leftover: left.stdout.trim() };
  } finally {
    await removeProfile(profile);
    await dir[Symbol.asyncDispose]();
  }
}

/** Every check of the default profile, with `broken` BROKEN. */
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
    "twin: through the same docker client with nothing weakened, every defence is HELD and doctor exits 0",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const { result, status, leftover } = await weakenedDoctor("none");
    assert.equal(result.exitCode, 0, explain(result));
    assert.deepEqual(status, expected(), explain(result));
    assert.equal(leftover, "");
  },
});

Deno.test({
  name:
    "doctor reports escalation BROKEN with exit 3 when the sandbox keeps no-new-privileges off (setuid programs work)",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const { result, status, check, leftover } = await weakenedDoctor("escalation");
    assert.equal(result.exitCode, 3, explain(result));
    assert.deepEqual(status, expected("escalation"), explain(result));
    assert.match(check("escalation").reason, /setuid programs/);
    assert.match(check("escalation").evidence[0], /NoNewPrivs 0/);
    assert.match(result.stderr, /are broken: escalation$/m);
    assert.equal(leftover, "");
  },
});

Deno.test({
  name:
    "doctor reports the survivor BROKEN with exit 3 when commands run without the wrapper that kills what they leave",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const { result, status, check, leftover } = await weakenedDoctor("survivor");
    assert.equal(result.exitCode, 3, explain(result));
    assert.deepEqual(status, expected("survivor"), explain(result));
    assert.match(check("survivor").reason, /outlived its command/);
    assert.match(result.stderr, /are broken: survivor$/m);
    assert.equal(leftover, "");
  },
});

Deno.test({
  name:
    "doctor reports the disk BROKEN with exit 3 when the engine reports a workspace quota it does not enforce",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const { result, report, status, check, leftover } = await weakenedDoctor("disk");
    assert.equal(result.exitCode, 3, explain(result));
    assert.deepEqual(status, expected("disk"), explain(result));
    assert.match(check("disk").evidence[0], /ran to its end/);
    // What the engine claimed is what the environment block shows.
    assert.equal(
      (report as unknown as { environment: { diskQuota: boolean } }).environment.diskQuota,
      true,
    );
    assert.equal(leftover, "");
  },
});

Deno.test({
  name:
    "the library's docker option reaches the sandbox itself: a client given as DoctorOptions.docker (not on PATH) that drops no-new-privileges makes escalation BROKEN",
  ...dockerTest(),
  async fn() {
    assertDocker();
    await using dir = await tempDir();
    const name = uniqueProfile("doc-w-lib");
    const bin = await shimDir(dir.path, "escalation");
    try {
      const report = await withEnv(
        { XDG_STATE_HOME: `${dir.path}/state` },
        () =>
          runDoctor(profileFrom(`profiles:\n  ${name}:\n    sandbox: {}\n`, name), {
            docker: `${bin}/docker`,
          }),
      );
      const status = Object.fromEntries(report.checks.map((c) => [c.id, c.status]));
      assert.deepEqual(status, expected("escalation"), JSON.stringify(report.checks, null, 1));
      assert.deepEqual(report.broken, ["escalation"]);
    } finally {
      await removeProfile(name);
    }
  },
});
