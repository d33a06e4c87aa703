// Part of the bundled CLI only (scripts/bundle.sh): embeds the worker and relay bundles so that
// the CLI needs no checkout. Imported before cli.ts, so they are registered before the CLI starts.
// dist/embedded.ts is written by scripts/embed_bundles.ts: each bundle brotli-compressed, in
// base64 (behind a function, read only to build an image), with its SHA-256.
import { relay, worker } from "../dist/embedded.ts";
import { setEmbeddedRelay, setEmbeddedWorker } from "../lib/sandbox/worker_bundle.ts";

setEmbeddedWorker(worker);
setEmbeddedRelay(relay);
