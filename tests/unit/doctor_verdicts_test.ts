import assert from "node:assert/strict";
import {
  judgeDisk,
  judgeEscalation,
  judgeKey,
  judgeReach,
  judgeSurvivor,
  nothingIsolated,
} from "../../lib/doctor/verdicts.ts";

const ESCALATION = {
  statusRead: true,
  capEff: "0000000000000000",
  capPrm: "0000000000000000",
  noNewPrivs: true,
  setuidFiles: ["/usr/bin/su"],
  unshare: "refused" as const,
  unshareDetail: "Operation not permitted",
};

Deno.test("judgeKey() is BROKEN when the canary was found, even beside a working twin", () => {
  assert.equal(
    judgeKey({ canaryFound: ["process 12 environ"], tokenFound: true }).status,
    "broken",
  );
  assert.equal(judgeKey({ canaryFound: [], tokenFound: true }).status, "held");
  assert.equal(judgeKey({ canaryFound: [], tokenFound: false }).status, "not_applicable");
});

Deno.test("judgeReach() is BROKEN when the attack reached the service, HELD only beside a twin that did", () => {
  const seen = { reached: [], refused: ["x: HTTP 403"], twinReached: true, twinDetail: "200" };
  assert.equal(judgeReach("egress_allowlist", seen).status, "held");
  assert.equal(judgeReach("egress_allowlist", { ...seen, reached: ["x"] }).status, "broken");
  assert.equal(
    judgeReach("egress_allowlist", { ...seen, twinReached: false }).status,
    "not_applicable",
  );
  assert.equal(
    judgeReach("address_guard", { ...seen, absent: "network mode full: no egress proxy" }).status,
    "broken",
  );
});

Deno.test("judgeEscalation() is BROKEN on capabilities, an effective setuid, or a user namespace", () => {
  assert.equal(judgeEscalation(ESCALATION).status, "held");
  assert.equal(judgeEscalation({ ...ESCALATION, capEff: "00000000a80425fb" }).status, "broken");
  assert.equal(judgeEscalation({ ...ESCALATION, capPrm: "0000000000000001" }).status, "broken");
  assert.equal(judgeEscalation({ ...ESCALATION, noNewPrivs: false }).status, "broken");
  assert.equal(judgeEscalation({ ...ESCALATION, unshare: "succeeded" }).status, "broken");
  assert.equal(
    judgeEscalation({ ...ESCALATION, statusRead: false, capEff: "?", capPrm: "?" }).status,
    "broken",
  );
});

Deno.test("judgeSurvivor() is BROKEN when the setsid child outlived its command or the sandbox", () => {
  const seen = { seenDuring: true, aliveAfterCommand: false, aliveAfterDestroy: false, detail: "" };
  assert.equal(judgeSurvivor(seen).status, "held");
  assert.equal(judgeSurvivor({ ...seen, aliveAfterCommand: true }).status, "broken");
  assert.equal(judgeSurvivor({ ...seen, aliveAfterDestroy: true }).status, "broken");
  assert.equal(judgeSurvivor({ ...seen, seenDuring: false }).status, "not_applicable");
});

Deno.test("judgeSurvivor() in mode local excuses a child alive after its command, never one alive after the release", () => {
  const seen = {
    seenDuring: true,
    aliveAfterCommand: true,
    aliveAfterDestroy: false,
    detail: "",
    leftoversUntilRelease: "mode local keeps leftovers until the release",
  };
  const held = judgeSurvivor(seen);
  assert.equal(held.status, "held");
  assert.match(held.reason, /ended with the sandbox \(mode local keeps leftovers/);
  assert.match(held.evidence[0], /after its command alive, after the sandbox gone/);
  assert.equal(judgeSurvivor({ ...seen, aliveAfterDestroy: true }).status, "broken");
  assert.equal(judgeSurvivor({ ...seen, seenDuring: false }).status, "not_applicable");
  // Without the excuse (a container), the same child is BROKEN.
  assert.equal(judgeSurvivor({ ...seen, leftoversUntilRelease: undefined }).status, "broken");
});

Deno.test("judgeDisk() is BROKEN when the write past the limit ran to its end", () => {
  const seen = { limitBytes: 64, twinCompleted: true, attackCompleted: false, stoppedBy: "limit" };
  assert.equal(judgeDisk(seen).status, "held");
  assert.equal(judgeDisk({ ...seen, attackCompleted: true }).status, "broken");
  assert.equal(judgeDisk({ ...seen, twinCompleted: false }).status, "not_applicable");
});

Deno.test("nothingIsolated() leaves no defence HELD", () => {
  const checks = nothingIsolated("none");
  assert.ok(checks.length >= 8);
  assert.ok(checks.every((c) => c.status !== "held"));
  assert.ok(checks.filter((c) => c.status === "broken").length >= 7);
});
