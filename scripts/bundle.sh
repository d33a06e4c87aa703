#!/usr/bin/env bash
# Build dist/sandbox.js: the whole CLI in one file that runs from an empty directory with only
# `deno`, carrying the worker and relay bundles, the Dockerfile and the scripts as embedded assets.
# And dist/sandbox-start.js (~5 KB), what the installed launcher runs: a plain foreground `run`
# starts its supervisor from there before anything parses the ~5 MB of dist/sandbox.js (the
# supervisor does, once); every other command line imports dist/sandbox.js from beside it.
# The two bundles go in brotli-compressed and in base64, in comments at the end of dist/sandbox.js
# (lib/sandbox/bundle_trailer.ts), with their SHA-256 in dist/embedded.ts (the image hash needs it on
# every start): the CLI reads and decompresses them only when it builds an image.
# Run it as the installed launcher does (scripts/install.ts): deno run -A --no-config with the
# unstable flags of deno.json, which a bundle cannot carry itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p dist
# Every bundle is finished by bundle_post.ts (worker_bundle.ts does the same from a checkout); the
# CLI's is minified too (a smaller source starts faster). The worker and relay are not: minified,
# the worker started only ~7% sooner, and its readable source is what tests/security/deno_cache_test.ts
# attacks as an agent would.
bundle() {
  deno bundle --quiet --platform deno "${@:3}" -o "$2" "$1"
  deno run --quiet --no-config --allow-read=dist --allow-write=dist scripts/bundle_post.ts "$2" \
    $([ "$2" = dist/sandbox.js ] && echo --require-ascii)
}
bundle worker/main.ts dist/worker.js
bundle relay/main.ts dist/relay.js
deno run --quiet --no-config --allow-read=dist --allow-write=dist scripts/embed_bundles.ts dist
bundle scripts/bundle_entry.ts dist/sandbox.js --minify --keep-names
# The worker and relay go last, in comments that dist/embedded.ts reads back to build an image.
cat dist/embedded.trailer >>dist/sandbox.js
bundle scripts/bundle_start.ts dist/sandbox-start.js --minify --keep-names
echo "dist/sandbox.js: $(du -h dist/sandbox.js | cut -f1)" >&2
