#!/usr/bin/env bash
# Build dist/sandbox.js: the whole CLI in one file that runs from an empty directory with only
# `deno`, carrying the worker and relay bundles, the Dockerfile and the scripts as embedded assets.
# The two bundles go in gzipped and in base64, with their SHA-256 (the image hash needs it on every
# start): the CLI decompresses them only when it builds an image, so its own start stays light.
# Run it as the installed launcher does (scripts/install.ts): deno run -A --no-config with the
# unstable flags of deno.json, which a bundle cannot carry itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p dist
for name in worker relay; do
  deno bundle --quiet --platform deno -o "dist/$name.js" "$name/main.ts"
  sha256sum "dist/$name.js" | cut -d' ' -f1 >"dist/$name.js.sha256"
  gzip -9 -n -c "dist/$name.js" | base64 -w0 >"dist/$name.js.gz.b64"
done
deno bundle --quiet --platform deno -o dist/sandbox.js scripts/bundle_entry.ts
deno run --quiet --no-config --allow-read=dist --allow-write=dist scripts/bundle_post.ts dist/sandbox.js
echo "dist/sandbox.js: $(du -h dist/sandbox.js | cut -f1)" >&2
