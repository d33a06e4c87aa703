#!/usr/bin/env bash
# Build dist/sandbox.js: the whole CLI in one file that runs from an empty directory with only
# `deno`, carrying the worker and relay bundles (and their SHA-256), the Dockerfile and the scripts as embedded
# assets. Run it as the installed launcher does (scripts/install.ts): deno run -A --no-config with
# the unstable flags of deno.json, which a bundle cannot carry itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p dist
deno bundle --quiet --platform deno -o dist/worker.js worker/main.ts
sha256sum dist/worker.js | cut -d' ' -f1 >dist/worker.js.sha256
deno bundle --quiet --platform deno -o dist/relay.js relay/main.ts
sha256sum dist/relay.js | cut -d' ' -f1 >dist/relay.js.sha256
deno bundle --quiet --platform deno -o dist/sandbox.js scripts/bundle_entry.ts
echo "dist/sandbox.js: $(du -h dist/sandbox.js | cut -f1)" >&2
