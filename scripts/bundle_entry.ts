// Entry of the bundled CLI (scripts/bundle.sh): the worker first, then the CLI itself. The bundler
// sets import.meta.main to false in every module but this one, so this one starts the CLI.
// The CLI's first import defers the yaml module (cli/defer_yaml.ts): it comes before the rest.
// As cli.ts: a plain foreground `run` starts its supervisor and waits for it.
import "../cli/defer_yaml.ts";
import "./register_worker.ts";
import { superviseRunFirst } from "../cli/supervise_first.ts";
import { exitSoon, main } from "../cli/main.ts";

exitSoon(await superviseRunFirst(Deno.args) ?? await main(Deno.args));
