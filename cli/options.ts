/** Options several commands share (commander's `Option`: loaded only when commander is). */
import { Option } from "commander";

export const jsonOption = () => new Option("--json", "machine-readable output on stdout");
export const profileOption = () =>
  new Option(
    "-p, --profile <name>",
    'profile to use (default: $SANDBOX_PROFILE, default_profile, or "default")',
  );
