/**
 * Where this host is on Docker's default bridge (lib/doctor/listeners.ts `bridgeHostAddress`): the
 * gateway the engine reports, else the address of the bridge's interface, which an engine that
 * found docker0 already addressed leaves out of its report; never an address of another host.
 */
import assert from "node:assert/strict";
import { bridgeHostAddress } from "../../lib/doctor/listeners.ts";

const iface = (name: string, address: string, family: "IPv4" | "IPv6" = "IPv4") => ({
  name,
  address,
  family,
  netmask: family === "IPv4" ? "255.255.0.0" : "ffff:ffff:ffff:ffff::",
  scopeid: null,
  cidr: `${address}/16`,
  mac: "02:42:00:00:00:00",
});
const HOST = [iface("lo", "127.0.0.1"), iface("docker0", "172.17.0.1"), iface("eth0", "10.0.0.5")];
const OPTIONS = { "com.docker.network.bridge.name": "docker0" };

Deno.test("the gateway the engine reports, when it is this host's", () => {
  const bridge = { IPAM: { Config: [{ Subnet: "172.17.0.0/16", Gateway: "172.17.0.1" }] } };
  assert.equal(bridgeHostAddress({ ...bridge, Options: OPTIONS }, HOST), "172.17.0.1");
});

Deno.test("no gateway reported: the address of the bridge's interface", () => {
  const bridge = { IPAM: { Config: [{ Subnet: "172.17.0.0/16" }] }, Options: OPTIONS };
  assert.equal(bridgeHostAddress(bridge, HOST), "172.17.0.1");
  // The interface named by the engine, not the first one that has an address.
  const renamed = { ...bridge, Options: { "com.docker.network.bridge.name": "br-test" } };
  assert.equal(bridgeHostAddress(renamed, [...HOST, iface("br-test", "172.30.0.1")]), "172.30.0.1");
});

Deno.test("a gateway that is not this host's (a remote engine) is not taken, nor an IPv6 one", () => {
  const remote = { IPAM: { Config: [{ Gateway: "172.17.0.1" }] }, Options: { other: "x" } };
  assert.equal(bridgeHostAddress(remote, [iface("lo", "127.0.0.1")]), undefined);
  const v6only = { IPAM: { Config: null }, Options: OPTIONS };
  assert.equal(bridgeHostAddress(v6only, [iface("docker0", "fe80::1", "IPv6")]), undefined);
  assert.equal(bridgeHostAddress({}, HOST), undefined);
});
