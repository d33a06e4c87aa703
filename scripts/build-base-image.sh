#!/usr/bin/env bash
# Build the sandbox base image from Debian packages, for machines that cannot
# pull from a registry. Cached by tag: does nothing when the image exists.
#   usage: build-base-image.sh [TAG]     (default sandbox-base:bookworm)
set -euo pipefail

tag="${1:-${SANDBOX_BASE_IMAGE:-sandbox-base:bookworm}}"
suite="${SANDBOX_BASE_SUITE:-bookworm}"
mirror="${SANDBOX_BASE_MIRROR:-http://deb.debian.org/debian}"
packages="git,ca-certificates,curl,procps"

log() { printf 'build-base-image: %s\n' "$*" >&2; }

if "${DOCKER:-docker}" image inspect "$tag" >/dev/null 2>&1; then
  log "$tag present"
  exit 0
fi

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

rootfs="$(mktemp -d /tmp/sandbox-rootfs.XXXXXX)"
trap 'as_root rm -rf "$rootfs"' EXIT

log "debootstrap $suite ($packages) into $rootfs, about 40 s"
as_root debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >/dev/null
# Trim what a sandbox never needs: apt caches and docs.
as_root rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*

log "importing as $tag"
as_root tar -C "$rootfs" -c . | "${DOCKER:-docker}" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
log "$tag built"
