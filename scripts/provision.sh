#!/usr/bin/env bash
# Provision what a fresh Debian 12 machine lacks to build and test sandbox:
# Deno (from npm), bubblewrap (mode local), a Docker engine (Debian's docker.io, started if none is
# running) and the locally built base image. Idempotent: every step checks first.
set -euo pipefail

DENO_VERSION="${DENO_VERSION:-2.9.6}"
# Where dockerd started by this script (machines without systemd) writes its log.
DOCKERD_LOG="${SANDBOX_DOCKERD_LOG:-/var/log/sandbox-dockerd.log}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf 'provision: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_deno() {
  if command -v deno >/dev/null 2>&1; then
    log "deno $(deno --version | head -1 | cut -d' ' -f2) present"
    return
  fi
  log "installing deno@${DENO_VERSION} from npm"
  npm install -g --silent "deno@${DENO_VERSION}" >/dev/null
  command -v deno >/dev/null 2>&1 || { log "deno is not on PATH after npm install"; exit 1; }
}

docker_ready() { docker info >/dev/null 2>&1; }

ensure_docker() {
  if docker_ready; then
    log "docker engine reachable"
    return
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing docker.io from Debian packages"
    apt_install docker.io
  fi
  if ! docker_ready; then
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      # systemd runs the engine from now on, and after every reboot; its log: journalctl -u docker
      log "starting docker.service with systemd (enabled at boot)"
      as_root systemctl enable --now docker.service >&2 || log "systemctl could not start docker.service"
      wait_for_docker
      docker_ready || { log "docker engine did not come up; see: journalctl -u docker"; exit 1; }
    else
      # No systemd (a container, WSL without it): dockerd runs in the background until the machine
      # stops. After a reboot, run this script again (or the command below) to start it.
      log "starting dockerd without systemd: it will NOT start again after a reboot (run scripts/provision.sh again); log: $DOCKERD_LOG"
      as_root sh -c "nohup dockerd >>'$DOCKERD_LOG' 2>&1 &"
      wait_for_docker
      docker_ready || { log "docker engine did not come up; see $DOCKERD_LOG"; tail -20 "$DOCKERD_LOG" >&2 || true; exit 1; }
    fi
  fi
  log "docker engine reachable"
}

wait_for_docker() {
  for _ in $(seq 1 60); do
    docker_ready && return
    sleep 0.5
  done
}

# Devcontainer mode builds images with @devcontainers/cli, which sandbox fetches from npm on first
# use into its own cache; fetching it here lets the tests run offline. Keep the version in step
# with DEVCONTAINER_CLI in lib/sandbox/devcontainer/image.ts.
ensure_devcontainer_cli() {
  local spec="npm:@devcontainers/cli@0.89.0"
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/sandbox/devcontainer-cli"
  if DENO_DIR="$dir" deno run --allow-all --no-config --no-lock --cached-only --quiet "$spec" --version >/dev/null 2>&1; then
    log "@devcontainers/cli present"
    return
  fi
  log "fetching @devcontainers/cli from npm"
  DENO_DIR="$dir" deno cache --no-config --no-lock --quiet "$spec"
}

# Sandbox mode local isolates with bubblewrap (docs/local.md): Debian's package, when missing.
ensure_bubblewrap() {
  if command -v bwrap >/dev/null 2>&1; then
    log "bubblewrap $(bwrap --version | cut -d' ' -f2) present"
    return
  fi
  log "installing bubblewrap from Debian packages (sandbox mode local)"
  apt_install bubblewrap
}

# bench/local_bench.ts compares mode local with srt (@anthropic-ai/sandbox-runtime, which the bench
# fetches from npm itself); srt refuses to start on Linux without socat and ripgrep.
ensure_srt_dependencies() {
  if command -v socat >/dev/null 2>&1 && command -v rg >/dev/null 2>&1; then
    log "socat and ripgrep present"
    return
  fi
  log "installing socat and ripgrep from Debian packages (the srt comparison of bench/local_bench.ts)"
  apt_install socat ripgrep
}

# The agent CLIs' pinned tarballs (Claude Code, Codex), into the tool's npm cache: the agents' image
# layers and mode local unpack them, and the tests then reach no registry. Without a registry, the
# tests that run the agents fail and say what to bring instead.
ensure_agent_packages() {
  deno run --allow-all --quiet --config "$here/../deno.json" "$here/fetch_agent_packages.ts" ||
    log "warning: the agent CLIs' npm tarballs could not be fetched (tests of Claude Code and Codex will fail)"
}

# The tests of `sandbox image push` push to a registry of their own on loopback: Debian's.
ensure_docker_registry() {
  if command -v docker-registry >/dev/null 2>&1 || [ -x /usr/bin/docker-registry ]; then
    log "docker-registry present"
    return
  fi
  log "installing docker-registry from Debian packages"
  apt_install docker-registry
}

ensure_deno
ensure_bubblewrap
ensure_srt_dependencies
ensure_devcontainer_cli
ensure_docker_registry
ensure_agent_packages
ensure_docker
"$here/build-base-image.sh"
