// Entry of the installed launcher's first file (scripts/bundle.sh → dist/sandbox-start.js): a plain
// foreground `sandbox run` starts its supervisor (cli/supervise_first.ts) before the CLI's bundle
// (dist/sandbox.js, ~5 MB) is parsed — the supervisor parses it anyway, and this process only
// waits for it. Every other command line is the bundle's, loaded from beside this file.
import { superviseRunFirst } from "../cli/supervise_first.ts";

const code = await superviseRunFirst(Deno.args);
if (code !== undefined) setTimeout(() => Deno.exit(code), 0);
else await import(new URL("./sandbox.js", import.meta.url).href);
