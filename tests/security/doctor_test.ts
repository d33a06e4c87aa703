/**
 * `sandbox doctor` through the CLI against the real engine: every defence HELD on the default
 * profile (exit 0), and BROKEN, with exit 3, on profiles weakened through existing options —
 * `network.mode: full` (the sandbox has a network: the host's bridge gateway answers, no egress
 * proxy) and `network.hosts` mapping `localhost` to the loopback (the address guard lets an
 * allowed name through, as the user asked). Its sandbox is gone afterwards, whatever the outcome.
 */
import assert from "node:assert/strict";
import { run } from "../../lib/process.ts";
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

console.error("security: doctor tests starting");

interface Check {
  id: string;
  status: "held" | "broken" | "not_applicable";
  reason: string;
  evidence: string[];
}

async function doctor(prefix: string, sandboxYaml: string) {
  const dir = await tempDir();
  const profile = uniqueProfile(prefix);
  const config = await writeConfig(
    dir.path,
    `profiles:\n  ${profile}:\n    sandbox: ${sandboxYaml}\n`,
  );
  try {
    const result = await runCli(["doctor", "-p", profile, "--json"], {
      config,
      env: { XDG_STATE_HOME: `${dir.path}/state` },
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
    console.error(`doctor ${prefix}: ${(report!.durationMs / 1000).toFixed(1)}s`);
    return { result, report: report!, status, leftover: left.stdout.trim() };
  } finally {
    await removeProfile(profile);
    await dir[Symbol.asyncDispose]();
  }
}

Deno.test({
  name: "doctor reports every defence HELD on the default profile, exits 0 and leaves no container",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const { result, report, status, leftover } = await doctor("doc-default", "{}");
    assert.equal(result.exitCode, 0, explain(result));
    assert.deepEqual(status, {
      key: "held",
      host_service: "held",
      egress_allowlist: "held",
      address_guard: "held",
      escalation: "held",
      survivor: "held",
      disk: "held",
      git_grant: "not_applicable",
    }, explain(result));
    assert.deepEqual(report.broken, []);
    // Each HELD stands beside its twin that got through.
    const twins = report.checks.filter((c) => c.status === "held").map((c) => c.evidence.at(-1));
    for (const twin of twins) assert.doesNotMatch(twin ?? "", /not reached|failed|never/);
    assert.equal(leftover, "", "the doctor's sandbox was left behind");
    assert.match(result.stderr, /doctor: destroying the throwaway sandbox/);
  },
});

Deno.test({
  name:
    "doctor reports the network defences BROKEN with exit 3 on a profile with network mode full",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const { result, report, status, leftover } = await doctor(
      "doc-full",
      "{network: {mode: full}}",
    );
    assert.equal(result.exitCode, 3, explain(result));
    assert.equal(status.egress_allowlist, "broken", explain(result));
    assert.equal(status.address_guard, "broken", explain(result));
    // The sandbox reaches the host's bridge gateway, where the ordinary container (the twin) does.
    assert.equal(status.host_service, "broken", explain(result));
    // What the network does not touch still holds.
    assert.equal(status.key, "held");
    assert.equal(status.escalation, "held");
    assert.ok(report.broken.includes("host_service"));
    assert.match(result.stderr, /defence\(s\) of profile .* are broken: .*host_service/);
    assert.equal(leftover, "");
  },
});

Deno.test({
  name:
    "doctor reports the address guard BROKEN when network.hosts maps localhost to the loopback, while the allowlist holds",
  ...dockerTest(),
  async fn() {
    assertDocker();
    const { result, status } = await doctor(
      "doc-hosts",
      "{network: {hosts: {localhost: 127.0.0.1}}}",
    );
    assert.equal(result.exitCode, 3, explain(result));
    assert.equal(status.address_guard, "broken", explain(result));
    assert.equal(status.egress_allowlist, "held", explain(result));
    assert.equal(status.host_service, "held", explain(result));
  },
});

Deno.test({
  name: "doctor says nothing is isolated in sandbox mode none and exits 3",
  ...dockerTest(),
  async fn() {
    const { result, status } = await doctor("doc-none", "{mode: none}");
    assert.equal(result.exitCode, 3, explain(result));
    for (const [id, value] of Object.entries(status)) {
      assert.equal(value, id === "git_grant" ? "not_applicable" : "broken", id);
    }
  },
});
