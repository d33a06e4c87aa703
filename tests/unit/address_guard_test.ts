import assert from "node:assert/strict";
import {
  internalAddressReason,
  parseIpAddress,
  parseLocalAddresses,
  resolveDestination,
} from "../../lib/proxy/address_guard.ts";

Deno.test("internalAddressReason() names the class of every internal IPv4 range", () => {
  const cases: [string, string][] = [
    ["0.0.0.0", "an unspecified address"],
    ["0.1.2.3", "an unspecified address"],
    ["10.0.0.1", "a private address"],
    ["10.255.255.255", "a private address"],
    ["100.64.0.0", "a shared (CGNAT) address"],
    ["100.127.255.255", "a shared (CGNAT) address"],
    ["127.0.0.1", "a loopback address"],
    ["127.255.0.9", "a loopback address"],
    ["169.254.0.1", "a link-local address"],
    ["169.254.169.254", "a cloud metadata address"],
    ["168.63.129.16", "a cloud metadata address"],
    ["100.100.100.200", "a cloud metadata address"],
    ["172.16.0.1", "a private address"],
    ["172.31.255.255", "a private address"],
    ["192.0.0.8", "a reserved address"],
    ["192.0.2.1", "a reserved address"],
    ["192.168.0.1", "a private address"],
    ["198.18.0.1", "a reserved address"],
    ["198.51.100.1", "a reserved address"],
    ["203.0.113.1", "a reserved address"],
    ["224.0.0.251", "a multicast address"],
    ["239.255.255.250", "a multicast address"],
    ["240.0.0.1", "a reserved address"],
    ["255.255.255.255", "the broadcast address"],
  ];
  for (const [address, why] of cases) assert.equal(internalAddressReason(address), why, address);
});

Deno.test("internalAddressReason() allows ordinary public IPv4 addresses, up to the range edges", () => {
  for (
    const address of [
      "1.1.1.1",
      "9.255.255.255",
      "11.0.0.0",
      "100.63.255.255",
      "100.128.0.0",
      "126.255.255.255",
      "128.0.0.0",
      "169.253.255.255",
      "172.15.255.255",
      "172.32.0.0",
      "192.167.255.255",
      "192.169.0.0",
      "223.255.255.255",
    ]
  ) {
    assert.equal(internalAddressReason(address), undefined, address);
  }
});

Deno.test("internalAddressReason() judges IPv6, and IPv6 forms carrying IPv4 by what they carry", () => {
  const cases: [string, string | undefined][] = [
    ["::", "an unspecified address"],
    ["::1", "a loopback address"],
    ["[::1]", "a loopback address"],
    ["0:0:0:0:0:0:0:1", "a loopback address"],
    ["::ffff:127.0.0.1", "a loopback address (IPv4-mapped IPv6)"],
    ["::ffff:7f00:1", "a loopback address (IPv4-mapped IPv6)"],
    ["::FFFF:10.0.0.1", "a private address (IPv4-mapped IPv6)"],
    ["::ffff:0:127.0.0.1", "a loopback address (IPv4-translated IPv6)"],
    ["::127.0.0.1", "a loopback address (IPv4-compatible IPv6)"],
    ["::8.8.8.8", "a reserved address (IPv4-compatible IPv6)"],
    ["64:ff9b::127.0.0.1", "a loopback address (NAT64)"],
    ["64:ff9b::a9fe:a9fe", "a cloud metadata address (NAT64)"],
    ["64:ff9b:1::808:808", "a reserved address (local-use NAT64)"],
    ["2002:c0a8:101::1", "a private address (6to4)"],
    ["fd00:ec2::254", "a cloud metadata address"],
    ["fc00::1", "a unique-local address"],
    ["fdff:ffff::1", "a unique-local address"],
    ["fe80::1", "a link-local address"],
    ["febf::1", "a link-local address"],
    ["fec0::1", "a reserved address"],
    ["ff02::1", "a multicast address"],
    ["100::1", "a reserved address"],
    ["2001:db8::1", "a reserved address"],
    ["2001::1", "a reserved address"],
    ["1::1", "a reserved address"],
    ["4000::1", "a reserved address"],
    // Ordinary global unicast, and the forms that deliver to a public IPv4 address.
    ["2606:4700:4700::1111", undefined],
    ["2a00:1450:4001::200e", undefined],
    ["::ffff:8.8.8.8", undefined],
    ["64:ff9b::8.8.8.8", undefined],
    ["2002:808:808::1", undefined],
  ];
  for (const [address, why] of cases) assert.equal(internalAddressReason(address), why, address);
});

Deno.test("internalAddressReason() refuses this host's own addresses, in any form", () => {
  const local = parseLocalAddresses(["81.2.69.161", "2a01:4f8::7", "fe80::1", "garbage"]);
  assert.equal(internalAddressReason("81.2.69.161", local), "one of this host's own addresses");
  assert.equal(internalAddressReason("2a01:4f8:0::7", local), "one of this host's own addresses");
  assert.equal(
    internalAddressReason("::ffff:81.2.69.161", local),
    "one of this host's own addresses (IPv4-mapped IPv6)",
  );
  assert.equal(internalAddressReason("81.2.69.162", local), undefined);
  assert.equal(internalAddressReason("2a01:4f8::8", local), undefined);
});

Deno.test("internalAddressReason() refuses what does not parse instead of guessing", () => {
  for (
    const address of [
      "",
      "localhost",
      "127.1",
      "2130706433",
      "0x7f.0.0.1",
      "010.0.0.1",
      "256.0.0.1",
      "1.2.3.4.5",
      "1:2:3:4:5:6:7:8:9",
      "1::2::3",
      "1:2:3:4:5:6:7::8:9",
      "::ffff:1.2.3",
      "1.2.3.4::",
      "fe80::1%eth0",
      "12345::",
    ]
  ) {
    assert.equal(
      internalAddressReason(address),
      "an address the proxy cannot parse",
      JSON.stringify(address),
    );
  }
});

Deno.test("parseIpAddress() reads compressed IPv6 with and without an IPv4 tail", () => {
  assert.deepEqual(
    parseIpAddress("1:2::7:8"),
    new Uint8Array([0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 8]),
  );
  assert.deepEqual(
    parseIpAddress("::ffff:1.2.3.4"),
    new Uint8Array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 1, 2, 3, 4]),
  );
  assert.deepEqual(parseIpAddress("1:2:3:4:5:6:7::"), parseIpAddress("1:2:3:4:5:6:7:0"));
  assert.deepEqual(parseIpAddress("10.0.0.1"), new Uint8Array([10, 0, 0, 1]));
});

Deno.test("resolveDestination() looks a name up once and keeps only the answers it may use", async () => {
  const lookups: string[] = [];
  const destination = await resolveDestination("app.test", {
    hosts: new Map(),
    resolve: (name) => {
      lookups.push(name);
      return Promise.resolve(["127.0.0.1", "81.2.69.160", "81.2.69.160", "10.0.0.1"]);
    },
    localAddresses: () => [],
    signal: new AbortController().signal,
  });
  assert.deepEqual(lookups, ["app.test"]);
  assert.deepEqual(destination, {
    kind: "connect",
    addresses: ["81.2.69.160"],
    source: "dns",
    refused: [
      { address: "127.0.0.1", why: "a loopback address" },
      { address: "10.0.0.1", why: "a private address" },
    ],
  });
});

Deno.test("resolveDestination() honours network.hosts and checks literals without a lookup", async () => {
  const options = {
    hosts: new Map([["db.test", "[::1]"]]),
    resolve: () => Promise.reject(new Error("no lookup expected")),
    localAddresses: () => [],
    signal: new AbortController().signal,
  };
  assert.deepEqual(await resolveDestination("db.test", options), {
    kind: "connect",
    addresses: ["::1"],
    source: "hosts",
    refused: [],
  });
  assert.deepEqual(await resolveDestination("127.0.0.1", options), {
    kind: "internal",
    source: "literal",
    refused: [{ address: "127.0.0.1", why: "a loopback address" }],
  });
  assert.deepEqual(await resolveDestination("[2606:4700::1]", options), {
    kind: "connect",
    addresses: ["2606:4700::1"],
    source: "literal",
    refused: [],
  });
  await assert.rejects(resolveDestination("other.test", options), /no lookup expected/);
});

Deno.test("resolveDestination() raises when a lookup answers nothing", async () => {
  await assert.rejects(
    resolveDestination("empty.test", {
      hosts: new Map(),
      resolve: () => Promise.resolve([]),
      localAddresses: () => [],
      signal: new AbortController().signal,
    }),
    /no address for "empty.test"/,
  );
});
