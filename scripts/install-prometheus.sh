#!/usr/bin/env bash
# Installs promtool (and prometheus) from the Debian/Ubuntu `prometheus` package when promtool is
# missing; does nothing when it is already on PATH. Needs root (or sudo) only when installing.
# Prints the path of promtool on success.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  command -v promtool
  exit 0
fi

fail() {
  echo "install-prometheus: $*" >&2
  exit 1
}

command -v apt-get >/dev/null 2>&1 \
  || fail "promtool is missing and apt-get is not available; install Prometheus (which ships promtool) by hand"

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || fail "promtool is missing and installing it needs root; run as root or install sudo"
  sudo=(sudo)
fi

echo "install-prometheus: promtool not found; installing the 'prometheus' package with apt-get" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update >&2 \
  || fail "apt-get update failed"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >&2 \
  || fail "apt-get install prometheus failed"

command -v promtool >/dev/null 2>&1 \
  || fail "the prometheus package was installed but promtool is still not on PATH"
command -v promtool
