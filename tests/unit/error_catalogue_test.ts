/** docs/errors.md lists every `SandboxErrorCode` of lib/errors.ts with the exit code the CLI gives it. */
import assert from "node:assert/strict";
import { exitCodeFor, SandboxError, type SandboxErrorCode } from "../../lib/errors.ts";
import { ROOT } from "../_helpers.ts";

/** The codes of the `SandboxErrorCode` union, read from its source. */
async function declaredCodes(): Promise<SandboxErrorCode[]> {
  const source = await Deno.readTextFile(`${ROOT}/lib/errors.ts`);
  const union = /export type SandboxErrorCode =([\s\S]*?);/.exec(source);
  assert.ok(union, "lib/errors.ts declares no SandboxErrorCode union");
  const codes = [...union[1].matchAll(/\|\s*"([a-z_]+)"/g)].map((m) => m[1] as SandboxErrorCode);
  assert.ok(codes.length > 0, "the SandboxErrorCode union names no code");
  return codes;
}

/** The rows of the catalogue's table: code → exit code. */
async function documentedCodes(): Promise<Map<string, string>> {
  const text = await Deno.readTextFile(`${ROOT}/docs/errors.md`);
  const rows = [...text.matchAll(/^\| `([a-z_]+)`\s*\| (\d+)\s*\|/gm)];
  return new Map(rows.map((m) => [m[1], m[2]]));
}

Deno.test("docs/errors.md has a row for every SandboxError code, with the exit code the CLI gives it", async () => {
  const documented = await documentedCodes();
  for (const code of await declaredCodes()) {
    assert.ok(documented.has(code), `docs/errors.md does not list "${code}"`);
    assert.equal(
      documented.get(code),
      String(exitCodeFor(new SandboxError(code, "x"))),
      `docs/errors.md gives "${code}" the wrong exit code`,
    );
  }
});

Deno.test("docs/errors.md lists no code that lib/errors.ts does not have", async () => {
  const declared = new Set<string>(await declaredCodes());
  for (const code of (await documentedCodes()).keys()) {
    assert.ok(declared.has(code), `docs/errors.md lists "${code}", which lib/errors.ts lacks`);
  }
});
