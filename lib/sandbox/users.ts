/** The users inside the sandbox image (the Dockerfile, scripts/sandbox-exec). */

/** The sandbox user, created by the Dockerfile. */
export const SANDBOX_UID = 10001;
export const SANDBOX_USER = `${SANDBOX_UID}:${SANDBOX_UID}`;
/**
 * The relay's uid (no passwd entry needed): not the sandbox user's, so that nothing the agent runs
 * can read the relay's memory or environment, ptrace, signal or kill it (scripts/sandbox-exec).
 */
export const RELAY_UID = 10002;
export const RELAY_USER = `${RELAY_UID}:${RELAY_UID}`;
