// Entry of the bundled CLI (scripts/bundle.sh): the worker first, then the CLI itself. The bundler
// sets import.meta.main to false in every module but this one, so this one starts the CLI.
// The CLI's first import defers the yaml module (cli/defer_yaml.ts): it comes before the rest.
import "../cli/defer_yaml.ts";
import "./register_worker.ts";
import { exitSoon, main } from "../cli.ts";

exitSoon(await main(Deno.args));
