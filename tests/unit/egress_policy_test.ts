import assert from "node:assert/strict";
import {
  canonicalHost,
  compileAllowlist,
  compileEgressPolicy,
  isUnspecifiedAddress,
  splitHostPort,
} from "../../lib/proxy/egress_policy.ts";

Deno.test("compileAllowlist() allows an exact host on ports 80 and 443 only", () => {
  const allowed = compileAllowlist(["example.com"]);
  assert.deepEqual(allowed("example.com", 443), { allowed: true, rule: "example.com" });
  assert.deepEqual(allowed("example.com", 80), { allowed: true, rule: "example.com" });
  assert.equal(allowed("example.com", 8443).allowed, false);
  assert.equal(allowed("example.com", 22).allowed, false);
  assert.equal(allowed("www.example.com", 443).allowed, false);
  assert.equal(allowed("example.org", 443).allowed, false);
  assert.equal(allowed("notexample.com", 443).allowed, false);
});

Deno.test("compileAllowlist() matches a wildcard at any depth but not the apex", () => {
  const allowed = compileAllowlist(["*.example.com"]);
  assert.ok(allowed("a.example.com", 443).allowed);
  assert.ok(allowed("a.b.c.example.com", 443).allowed);
  assert.equal(allowed("example.com", 443).allowed, false);
  assert.equal(allowed("badexample.com", 443).allowed, false);
  assert.equal(allowed("example.com.evil.test", 443).allowed, false);
  assert.equal(allowed("a.example.com", 8080).allowed, false);
});

Deno.test("compileAllowlist() with a port allows exactly that port", () => {
  const allowed = compileAllowlist(["api.example.com:8443", "*.internal.test:5000"]);
  assert.deepEqual(allowed("api.example.com", 8443).rule, "api.example.com:8443");
  assert.equal(allowed("api.example.com", 443).allowed, false);
  assert.equal(allowed("api.example.com", 80).allowed, false);
  assert.ok(allowed("db.internal.test", 5000).allowed);
  assert.equal(allowed("db.internal.test", 443).allowed, false);
});

Deno.test("compileAllowlist() compares hosts case-insensitively and ignores a trailing dot", () => {
  const allowed = compileAllowlist(["Example.COM", "*.Docs.Example.org."]);
  assert.ok(allowed("EXAMPLE.com", 443).allowed);
  assert.ok(allowed("example.com.", 443).allowed);
  assert.ok(allowed("API.docs.example.ORG.", 80).allowed);
});

Deno.test("compileAllowlist() allows IP literals only when listed literally", async (t) => {
  await t.step("a listed IPv4 address matches itself and its numeric spellings", () => {
    const allowed = compileAllowlist(["127.0.0.1:8080"]);
    assert.ok(allowed("127.0.0.1", 8080).allowed);
    // Alternative spellings of the same address are the same address.
    assert.ok(allowed("2130706433", 8080).allowed);
    assert.ok(allowed("127.1", 8080).allowed);
    assert.equal(allowed("127.0.0.2", 8080).allowed, false);
    assert.equal(allowed("127.0.0.1", 8081).allowed, false);
  });
  await t.step("a wildcard over numeric labels is refused, so none can match an address", () => {
    for (const pattern of ["*.0.0.1", "*.1", "*.127.0.0.1"]) {
      assert.throws(() => compileAllowlist([pattern]), TypeError, pattern);
    }
    const allowed = compileAllowlist(["*.example.com"]);
    assert.equal(allowed("127.0.0.1", 443).allowed, false);
  });
  await t.step("IPv6 literals are matched in canonical form", () => {
    const allowed = compileAllowlist(["[::1]:8080"]);
    assert.ok(allowed("[0:0:0:0:0:0:0:1]", 8080).allowed);
    assert.ok(allowed("::1", 8080).allowed);
    assert.equal(allowed("[::2]", 8080).allowed, false);
  });
});

Deno.test("compileAllowlist() denies hosts that do not parse instead of guessing", () => {
  const allowed = compileAllowlist(["*.example.com", "example.com"]);
  for (
    const host of [
      "evil.test/x.example.com",
      "evil.test@a.example.com",
      "a b.example.com",
      "",
      ".",
      "a..example.com",
      "é.example.com",
      "a.example.com\u0000",
    ]
  ) {
    assert.equal(allowed(host, 443).allowed, false, host);
  }
  assert.equal(allowed("example.com", 0).allowed, false);
  assert.equal(allowed("example.com", 70_000).allowed, false);
});

Deno.test("compileAllowlist() rejects invalid patterns with a TypeError", () => {
  for (
    const pattern of [
      "",
      "exa mple.com",
      "example.com:0",
      "example.com:99999",
      "example.com:http",
      "a.*.com",
      "**.a.com",
      "http://example.com",
    ]
  ) {
    assert.throws(() => compileAllowlist([pattern]), TypeError, pattern);
  }
});

Deno.test("compileEgressPolicy() in mode none denies everything, even listed hosts", () => {
  const allowed = compileEgressPolicy("none", ["example.com"]);
  assert.deepEqual(allowed("example.com", 443), { allowed: false });
  assert.equal(allowed("127.0.0.1", 80).allowed, false);
});

Deno.test("compileEgressPolicy() in mode full allows every valid host and port", () => {
  const allowed = compileEgressPolicy("full", []);
  assert.deepEqual(allowed("anything.test", 12345), { allowed: true, rule: "*" });
  assert.ok(allowed("10.1.2.3", 22).allowed);
  assert.equal(allowed("not a host", 443).allowed, false);
  assert.equal(allowed("example.com", 0).allowed, false);
});

Deno.test("compileEgressPolicy() in mode allowlist uses the patterns", () => {
  const allowed = compileEgressPolicy("allowlist", ["a.com"]);
  assert.ok(allowed("a.com", 443).allowed);
  assert.equal(allowed("b.com", 443).allowed, false);
});

Deno.test("canonicalHost() lowercases, drops the trailing dot and brackets IPv6", () => {
  assert.deepEqual(canonicalHost("WWW.Example.COM."), "www.example.com");
  assert.deepEqual(canonicalHost("0x7f.0.0.1"), "127.0.0.1");
  assert.deepEqual(canonicalHost("::1"), "[::1]");
  assert.deepEqual(canonicalHost("[::FFFF:7f00:1]"), "[::ffff:7f00:1]");
  assert.deepEqual(canonicalHost("under_score.example.com"), "under_score.example.com");
  assert.deepEqual(canonicalHost("a.com:443"), undefined);
  assert.deepEqual(canonicalHost("256.1.1.1"), undefined);
});

Deno.test("splitHostPort() separates ports from names and IPv6 literals", () => {
  assert.deepEqual(splitHostPort("a.com:443"), { host: "a.com", port: "443" });
  assert.deepEqual(splitHostPort("a.com"), { host: "a.com", port: undefined });
  assert.deepEqual(splitHostPort("[::1]:8080"), { host: "[::1]", port: "8080" });
  assert.deepEqual(splitHostPort("[::1]"), { host: "[::1]", port: undefined });
  assert.deepEqual(splitHostPort("::1"), { host: "::1", port: undefined });
});

Deno.test("isUnspecifiedAddress() recognises every spelling of all interfaces", () => {
  for (const address of ["0.0.0.0", "::", "[::]", "0", "0:0:0:0:0:0:0:0", "", " "]) {
    assert.ok(isUnspecifiedAddress(address), JSON.stringify(address));
  }
  for (const address of ["127.0.0.1", "::1", "172.17.0.1", "localhost"]) {
    assert.equal(isUnspecifiedAddress(address), false, address);
  }
});
