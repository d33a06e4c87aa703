import assert from "node:assert/strict";
import { parseRegistry, pushedReference } from "../../lib/sandbox/image_push.ts";
import { SandboxError } from "../../lib/errors.ts";

Deno.test("a registry is host[:port][/path], named without its trailing slash", () => {
  assert.equal(parseRegistry("registry.example.com"), "registry.example.com");
  assert.equal(parseRegistry("127.0.0.1:5000/team/"), "127.0.0.1:5000/team");
  assert.equal(parseRegistry("localhost/a/b-c"), "localhost/a/b-c");
  assert.equal(parseRegistry("[::1]:5000"), "[::1]:5000");
  assert.equal(parseRegistry("ghcr.io/org_x"), "ghcr.io/org_x");
});

Deno.test("a registry that names no host, has a scheme or a bad part is a usage error", () => {
  for (
    const bad of [
      "team",
      "team/images",
      "https://ghcr.io",
      "ghcr.io/Org",
      "a b",
      "",
      "h.io:0",
      "h.io:70000",
    ]
  ) {
    assert.throws(
      () => parseRegistry(bad),
      (error) =>
        error instanceof SandboxError && error.code === "usage" && !error.message.includes("\n"),
      bad,
    );
  }
});

Deno.test("a pushed image keeps its name and tag under the registry", () => {
  assert.equal(
    pushedReference("127.0.0.1:5000/t", "sandbox-runtime:abc"),
    "127.0.0.1:5000/t/sandbox-runtime:abc",
  );
});
