// Part of the bundled CLI only (scripts/bundle.sh): embeds the worker bundle so that the CLI needs
// no checkout. Imported before cli.ts, so the worker is registered before the CLI starts. Its
// SHA-256 (written by bundle.sh) is embedded too: the image hash needs it on every start.
import worker from "../dist/worker.js" with { type: "text" };
import workerSha256 from "../dist/worker.js.sha256" with { type: "text" };
import { setEmbeddedWorker } from "../lib/sandbox/worker_bundle.ts";

setEmbeddedWorker(worker, workerSha256);
