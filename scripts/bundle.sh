#!/usr/bin/env bash
# Build dist/sandbox.js: the whole CLI in one file that runs from an empty directory with only
# `deno`, carrying the worker bundle, the Dockerfile and the scripts as embedded assets.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p dist
deno bundle --quiet --platform deno -o dist/worker.js worker/main.ts
deno bundle --quiet --platform deno -o dist/sandbox.js scripts/bundle_entry.ts
echo "dist/sandbox.js: $(du -h dist/sandbox.js | cut -f1)" >&2
