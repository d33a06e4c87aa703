import assert from "node:assert/strict";
import { parseRefUpdates, pushViolation, startGitProxy } from "../../lib/proxy/git_proxy.ts";

const enc = new TextEncoder();
const OLD = "1".repeat(40);
const NEW = "2".repeat(40);
const ZERO = "0".repeat(40);

function pkt(line: string): string {
  return (line.length + 4).toString(16).padStart(4, "0") + line;
}

function pushBody(...lines: string[]): Uint8Array {
  return enc.encode(lines.map(pkt).join("") + "0000" + "PACK....");
}

Deno.test("parseRefUpdates() reads every ref update before the flush, capabilities stripped", () => {
  const body = pushBody(`${OLD} ${NEW} refs/heads/run\0report-status side-band-64k\n`, `${ZERO} ${NEW} refs/tags/v1\n`);
  assert.deepEqual(parseRefUpdates(body), [
    { old: OLD, new: NEW, ref: "refs/heads/run" },
    { old: ZERO, new: NEW, ref: "refs/tags/v1" },
  ]);
});

Deno.test("parseRefUpdates() refuses framing it cannot read", () => {
  assert.throws(() => parseRefUpdates(enc.encode("zzzz")));
  assert.throws(() => parseRefUpdates(enc.encode("0030short")));
  assert.throws(() => parseRefUpdates(enc.encode(pkt(`${OLD} ${NEW}\n`) + "0000")));
});

Deno.test("pushViolation() allows only updates of the run's own branch", () => {
  const allowed = "refs/heads/sandbox/run-1";
  assert.equal(pushViolation([{ old: OLD, new: NEW, ref: allowed }], allowed), undefined);
  assert.match(pushViolation([{ old: OLD, new: NEW, ref: "refs/heads/main" }], allowed) ?? "", /refs\/heads\/main/);
  assert.match(
    pushViolation([{ old: OLD, new: NEW, ref: allowed }, { old: ZERO, new: NEW, ref: "refs/tags/x" }], allowed) ?? "",
    /refs\/tags\/x/,
  );
  assert.match(pushViolation([{ old: OLD, new: ZERO, ref: allowed }], allowed) ?? "", /deleting/);
  assert.match(pushViolation([], allowed) ?? "", /no ref updates/);
});

Deno.test("the git proxy refuses requests without the session token and pushes to other refs, forwarding neither", async () => {
  let forwarded = 0;
  const remote = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () => {
    forwarded++;
    return new Response("ok");
  });
  const proxy = await startGitProxy({
    hostnames: ["127.0.0.1"],
    grants: new Map([["sbx_token", {
      url: `http://127.0.0.1:${remote.addr.port}/repo.git`,
      authorization: () => Promise.resolve("Basic c2VjcmV0"),
      pushRef: "refs/heads/sandbox/run-1",
    }]]),
    profile: "p",
    runId: "run-1",
  });
  try {
    const base = proxy.url("127.0.0.1");
    const anonymous = await fetch(`${base}/info/refs?service=git-upload-pack`);
    await anonymous.body?.cancel();
    assert.equal(anonymous.status, 401);

    const push = (ref: string) =>
      fetch(`${base}/git-receive-pack`, {
        method: "POST",
        headers: { authorization: "Bearer sbx_token", "content-type": "application/x-git-receive-pack-request" },
        body: pushBody(`${OLD} ${NEW} ${ref}\0report-status\n`) as BodyInit,
      });
    const refused = await push("refs/heads/main");
    assert.equal(refused.status, 403);
    assert.match(await refused.text(), /may push only "refs\/heads\/sandbox\/run-1"/);
    assert.equal(forwarded, 0);

    const allowed = await push("refs/heads/sandbox/run-1");
    assert.equal(allowed.status, 200);
    await allowed.body?.cancel();
    assert.equal(forwarded, 1);
  } finally {
    await proxy.close();
    await remote.shutdown();
  }
});
