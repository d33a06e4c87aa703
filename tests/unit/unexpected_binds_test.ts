import assert from "node:assert/strict";
import { unexpectedBinds } from "../_helpers.ts";
import { PROXY_MOUNT_PATH } from "../../lib/sandbox/proxy_mount.ts";

const proxy = {
  Type: "bind",
  Source: "/tmp/sandbox-proxy-0123abcd89ef/0123abcd",
  Destination: PROXY_MOUNT_PATH,
  RW: false,
};

Deno.test("unexpectedBinds: the read-only proxy socket directory is the one bind a sandbox may have", () => {
  assert.deepEqual(unexpectedBinds([proxy, { Type: "volume", Destination: "/workspace" }]), []);
  assert.deepEqual(unexpectedBinds(null), []);
});

Deno.test("unexpectedBinds: a writable proxy mount, another destination or another source is reported", () => {
  const writable = { ...proxy, RW: true };
  const elsewhere = { ...proxy, Destination: "/mnt" };
  const hostDir = { ...proxy, Source: "/home/u/project" };
  assert.deepEqual(unexpectedBinds([writable, elsewhere, hostDir]), [writable, elsewhere, hostDir]);
});
