#!/usr/bin/env bash
# Installs Debian packages for the test tools: `scripts/apt-install.sh NAME PACKAGE...`. NAME
# prefixes the messages. Tries the install first and refreshes the package lists only when that
# fails (a fresh machine has none). Needs root, or sudo.
set -euo pipefail

name=$1
shift

fail() {
  echo "$name: $*" >&2
  exit 1
}

command -v apt-get >/dev/null 2>&1 || fail "$* missing and apt-get is not available; install it by hand"

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || fail "installing $* needs root; run as root or install sudo"
  sudo=(sudo)
fi

apt() {
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@" >&2
}

echo "$name: installing $* with apt-get" >&2
if ! apt install -y --no-install-recommends "$@"; then
  apt update || fail "apt-get update failed"
  apt install -y --no-install-recommends "$@" || fail "apt-get install $* failed"
fi
