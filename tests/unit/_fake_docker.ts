/**
 * A fake `docker` CLI for unit tests: a bash script that records every argv and answers as the
 * test's `respond` snippet says. The snippet is bash, sourced with the argv in "$@"; `CALLS` is
 * the log path, so a response can depend on earlier calls (e.g. inspect after run).
 */
import { tempDir } from "../_helpers.ts";

export interface FakeDocker extends AsyncDisposable {
  /** Path of the fake `docker` program. */
  program: string;
  /** Directory holding it, for putting first on PATH. */
  dir: string;
  /** Every recorded argv, oldest first. */
  calls(): Promise<string[][]>;
  /** The recorded calls whose argv starts with `prefix`. */
  callsStartingWith(...prefix: string[]): Promise<string[][]>;
  /** The environment each call ran with, in the order of `calls()`. */
  environments(): Promise<Record<string, string>[]>;
}

const SEPARATOR = "\x1f";

export async function fakeDocker(respond: string): Promise<FakeDocker> {
  const dir = await tempDir("fake-docker-");
  const program = `${dir.path}/docker`;
  const calls = `${dir.path}/calls.log`;
  await Deno.writeTextFile(
    program,
    `#!/usr/bin/env bash
CALLS='${calls}'
{ printf '%s\\x1f' "$@"; printf '\\n'; } >>"$CALLS"
env -0 >"$CALLS.env.$(wc -l <"$CALLS")"
called() { grep -q "^$1" "$CALLS"; }
${respond}
exit 0
`,
  );
  await Deno.chmod(program, 0o755);
  const readCalls = async () => {
    const text = await Deno.readTextFile(calls).catch(() => "");
    return text.split("\n").filter(Boolean).map((line) => line.split(SEPARATOR).slice(0, -1));
  };
  return {
    program,
    dir: dir.path,
    calls: readCalls,
    async callsStartingWith(...prefix: string[]) {
      return (await readCalls()).filter((argv) => prefix.every((p, i) => argv[i] === p));
    },
    async environments() {
      const count = (await readCalls()).length;
      return await Promise.all(Array.from({ length: count }, async (_, i) => {
        const text = await Deno.readTextFile(`${calls}.env.${i + 1}`).catch(() => "");
        return Object.fromEntries(
          text.split("\0").filter(Boolean).map((
            entry,
          ) => [entry.slice(0, entry.indexOf("=")), entry.slice(entry.indexOf("=") + 1)]),
        );
      }));
    },
    [Symbol.asyncDispose]: () => dir[Symbol.asyncDispose](),
  };
}

/** `docker container inspect` output for a container in `status` with the given labels. */
export function inspectJson(name: string, status: string, labels: Record<string, string>): string {
  return JSON.stringify([{
    Id: `${name}-id-0123456789`,
    Name: `/${name}`,
    Created: "2026-01-01T00:00:00Z",
    Image: "sha256:image",
    State: { Status: status, Running: status === "running", Health: { Status: "healthy" } },
    Config: { Image: "sandbox-runtime:x", Labels: labels },
    HostConfig: { PidsLimit: 512, Memory: 4294967296 },
  }]);
}
