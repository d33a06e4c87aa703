/**
 * The gate of sandbox mode local's tests: bubblewrap (installed by scripts/provision.sh) and user
 * namespaces. Without them the tests are skipped on a developer machine, but under CI (`CI` set)
 * they fail loudly instead, like Docker tests (`dockerTest` in _helpers.ts).
 */
import { localTools } from "../lib/sandbox/local/bwrap.ts";
import { IN_CI } from "./_helpers.ts";

/** Why mode local cannot run here (its probe's message), or undefined when it can. */
export const LOCAL_UNAVAILABLE: string | undefined = await localTools().then(
  () => undefined,
  (error) => error instanceof Error ? error.message : String(error),
);

/** Options for a test that needs mode local. */
export function localTest(): { ignore: boolean } {
  return { ignore: LOCAL_UNAVAILABLE !== undefined && !IN_CI };
}

/** Fail with a clear message when CI runs a mode-local test where bubblewrap cannot run. */
export function assertLocal(): void {
  if (LOCAL_UNAVAILABLE !== undefined) {
    throw new Error(
      `CI is set but mode local cannot run: ${LOCAL_UNAVAILABLE} (scripts/provision.sh)`,
    );
  }
}
