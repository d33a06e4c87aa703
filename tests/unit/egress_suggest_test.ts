import assert from "node:assert/strict";
import type { AccessLogEntry } from "../../lib/proxy/access_log.ts";
import {
  domainOf,
  patternFor,
  readRunAccess,
  suggestAllowlist,
} from "../../lib/proxy/egress_suggest.ts";

function entry(fields: Partial<AccessLogEntry>): AccessLogEntry {
  return {
    time: "2025-01-01T00:00:00Z",
    kind: "egress",
    decision: "deny",
    method: "CONNECT",
    host: "example.com",
    port: 443,
    bytesIn: 0,
    bytesOut: 0,
    durationMs: 1,
    profile: "p",
    runId: "r1",
    reason: '"example.com:443" is not allowed by the allowlist policy of profile "p"',
    ...fields,
  };
}

Deno.test("patternFor() names the port only when a pattern without one would not allow it", () => {
  assert.equal(patternFor("api.example.com", 443), "api.example.com");
  assert.equal(patternFor("api.example.com", 80), "api.example.com");
  assert.equal(patternFor("api.example.com", 8443), "api.example.com:8443");
  assert.equal(patternFor("::1", 8080), "[::1]:8080");
  assert.equal(domainOf("a.b.example.com"), "example.com");
  assert.equal(domainOf("10.1.2.3"), "10.1.2.3");
});

Deno.test("suggestAllowlist() groups the denied hosts by domain with counts, exact patterns only", () => {
  const suggestion = suggestAllowlist([
    entry({ host: "api.example.com" }),
    entry({ host: "api.example.com" }),
    entry({ host: "API.example.com.", runId: "r2" }),
    entry({ host: "cdn.example.com", port: 8080 }),
    entry({ host: "pypi.org", method: "GET", port: 80 }),
    // Not to be counted: allowed, another run, another kind, no host.
    entry({ host: "allowed.org", decision: "allow" }),
    entry({ host: "other-run.org", runId: "r9" }),
    entry({ host: "llm.example", kind: "llm" }),
    entry({ host: "" }),
  ], ["r1", "r2"]);
  assert.equal(suggestion.denied, 5);
  assert.deepEqual(suggestion.domains.map((d) => [d.domain, d.count]), [
    ["example.com", 4],
    ["pypi.org", 1],
  ]);
  assert.deepEqual(suggestion.domains[0].patterns, [
    { pattern: "api.example.com", count: 3, runs: ["r1", "r2"] },
    { pattern: "cdn.example.com:8080", count: 1, runs: ["r1"] },
  ]);
  assert.deepEqual(suggestion.allow, ["api.example.com", "cdn.example.com:8080", "pypi.org"]);
  assert.ok(!suggestion.allow.some((p) => p.includes("*")));
  assert.deepEqual(suggestion.unlifted, []);
});

Deno.test("suggestAllowlist() keeps apart denials an allowlist entry would not lift", () => {
  const suggestion = suggestAllowlist([
    entry({
      host: "internal.example.com",
      reason: '"internal.example.com:443" resolved to an internal address (private)',
    }),
    entry({
      host: "x.org",
      reason: 'is not allowed: network mode "none" of profile "p" allows no egress',
    }),
  ], ["r1"]);
  assert.deepEqual(suggestion.allow, []);
  assert.deepEqual(suggestion.unlifted.map((u) => [u.host, u.why]).sort(), [
    ["internal.example.com", "internal_address"],
    ["x.org", "mode_none"],
  ]);
});

Deno.test("readRunAccess() reads the runs' entries, skips torn lines and names runs with none", async () => {
  const path = await Deno.makeTempFile();
  try {
    await Deno.writeTextFile(
      path,
      [JSON.stringify(entry({})), "{torn", JSON.stringify(entry({ runId: "r3" })), ""].join("\n"),
    );
    const read = await readRunAccess(path, ["r1", "r2"]);
    assert.equal(read.entries.length, 1);
    assert.deepEqual(read.missing, ["r2"]);
    assert.deepEqual((await readRunAccess(`${path}.none`, ["r1"])).missing, ["r1"]);
  } finally {
    await Deno.remove(path);
  }
});
