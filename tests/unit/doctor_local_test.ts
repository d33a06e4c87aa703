/** What `sandbox doctor` says holds a local sandbox's limits (lib/doctor/local.ts `limitsHeld`). */
import assert from "node:assert/strict";
import { limitsHeld } from "../../lib/doctor/local.ts";

const RESOURCES = { memoryBytes: 2 * 1024 ** 3, cpus: 1.5, pids: 256 };

Deno.test("limitsHeld() names the cgroup for every limit it holds", () => {
  for (const kind of ["cgroup2", "cgroup1"] as const) {
    const held = limitsHeld(kind, RESOURCES, false);
    assert.equal(held.memory, `2.0 GiB for the sandbox, by its cgroup (${kind})`);
    assert.equal(held.cpu, `1.5 CPU(s), by its cgroup (${kind})`);
    assert.equal(held.pids, `256 processes for the sandbox, by its cgroup (${kind})`);
  }
  assert.match(limitsHeld("cgroup2", { ...RESOURCES, cpus: 0 }, false).cpu, /^not limited/);
});

Deno.test("limitsHeld() says memory and CPU are not limited without a cgroup, and processes not for root", () => {
  const user = limitsHeld("rlimit", RESOURCES, false);
  assert.match(user.memory, /^not limited: no cgroup/);
  assert.match(user.cpu, /^not limited: no cgroup/);
  assert.equal(user.pids, "256 processes of your user, all of them counted (RLIMIT_NPROC)");
  const root = limitsHeld("rlimit", RESOURCES, true);
  assert.equal(root.pids, "not limited: RLIMIT_NPROC does not bind root");
});
