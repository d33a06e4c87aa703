// Entry of the bundled CLI (scripts/bundle.sh): the worker first, then the CLI itself. The bundler
// sets import.meta.main to false in every module but this one, so this one starts the CLI.
import "./register_worker.ts";
import { main } from "../cli.ts";

Deno.exit(await main(Deno.args));
