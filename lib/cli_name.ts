/**
 * How the user runs the CLI, for the hints in messages ("Start it with: sandbox up"): `sandbox`
 * (installed by `deno task install`), or what a launcher put in `$SANDBOX_PROGRAM` — the checkout's
 * `./sandbox` script sets its own path, so that a hint is a command that works as printed.
 */
export function cliName(): string {
  return Deno.env.get("SANDBOX_PROGRAM") || "sandbox";
}
