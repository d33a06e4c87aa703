#!/bin/sh
# devcontainer-prelude.sh USER WORKSPACE_FOLDER PACKAGES — run as root at build time, on a
# devcontainer's image, before the sandbox layer goes on top.
#
# - PACKAGES (Debian names, may be empty): what the sandbox layer needs and the image lacks.
# - USER (may be empty): the devcontainer's user. It becomes uid/gid 10001, the sandbox's uid, so
#   that the devcontainer's own user is who runs everything (its files follow it); created when the
#   image has no such user. Its home becomes /home/sandbox, the writable tmpfs of a running sandbox.
# - WORKSPACE_FOLDER (may be empty): made a symbolic link to /workspace/.devcontainer-workspace,
#   which each run points at its own worktree; left alone when the image already has files there.
set -eu
user="$1"
workspace="$2"
packages="$3"
uid=10001

if [ -n "$packages" ]; then
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086 # a list of package names
  apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages >/dev/null
  rm -rf /var/lib/apt/lists/*
fi

if [ -n "$user" ]; then
  if entry=$(getent passwd "$user"); then
    name=$(echo "$entry" | cut -d: -f1)
    old_uid=$(echo "$entry" | cut -d: -f3)
    old_gid=$(echo "$entry" | cut -d: -f4)
    if [ "$old_uid" != "$uid" ]; then
      if other=$(getent passwd "$uid"); then
        echo "sandbox: uid $uid belongs to ${other%%:*} in this image: cannot give it to $name" >&2
        exit 1
      fi
      usermod -u "$uid" "$name"
      find / -xdev -uid "$old_uid" -exec chown -h "$uid" {} + 2>/dev/null || true
    fi
    if [ "$old_gid" != "$uid" ]; then
      group=$(getent group "$old_gid" | cut -d: -f1)
      if [ "$group" = "$name" ] && ! getent group "$uid" >/dev/null; then
        groupmod -g "$uid" "$group"
        find / -xdev -gid "$old_gid" -exec chgrp -h "$uid" {} + 2>/dev/null || true
      else
        getent group "$uid" >/dev/null || groupadd -g "$uid" sandbox
        usermod -g "$uid" "$name"
      fi
    fi
    usermod -d /home/sandbox "$name"
  else
    getent group "$uid" >/dev/null || groupadd -g "$uid" "$user"
    useradd -u "$uid" -g "$uid" -d /home/sandbox -M -s /bin/sh "$user"
  fi
fi

if [ -n "$workspace" ]; then
  if [ -d "$workspace" ] && [ ! -L "$workspace" ] && [ -z "$(ls -A "$workspace")" ]; then
    rmdir "$workspace"
  fi
  if [ ! -e "$workspace" ] && [ ! -L "$workspace" ]; then
    mkdir -p "$(dirname "$workspace")"
    ln -s /workspace/.devcontainer-workspace "$workspace"
  fi
fi
