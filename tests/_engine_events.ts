/** What the engine was asked to do in a container, from `docker events` (real engine tests). */
import assert from "node:assert/strict";
import { run } from "../lib/process.ts";
import { explain } from "./_helpers.ts";

/** The commands the engine was asked to exec in `container` between two instants (its health checks aside). */
export async function execsBetween(container: string, since: Date, until: Date): Promise<string[]> {
  const events = await run([
    "docker",
    "events",
    "--since",
    since.toISOString(),
    "--until",
    until.toISOString(),
    "--filter",
    `container=${container}`,
    "--filter",
    "event=exec_create",
    "--format",
    "{{.Action}}",
  ], { timeoutMs: 30_000 });
  assert.equal(events.exitCode, 0, explain(events));
  return events.stdout.split("\n").filter((line) => line && !/sandbox-exec health /.test(line));
}
