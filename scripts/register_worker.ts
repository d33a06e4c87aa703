// Part of the bundled CLI only (scripts/bundle.sh): embeds the worker and relay bundles so that
// the CLI needs no checkout. Imported before cli.ts, so they are registered before the CLI starts.
// They are embedded brotli-compressed, in base64 (decompressed only to build an image), with their SHA-256
// (written by bundle.sh): the image hash needs it on every start.
import worker from "../dist/worker.js.br.b64" with { type: "text" };
import workerSha256 from "../dist/worker.js.sha256" with { type: "text" };
import relay from "../dist/relay.js.br.b64" with { type: "text" };
import relaySha256 from "../dist/relay.js.sha256" with { type: "text" };
import { setEmbeddedRelay, setEmbeddedWorker } from "../lib/sandbox/worker_bundle.ts";

setEmbeddedWorker(worker, workerSha256);
setEmbeddedRelay(relay, relaySha256);
