#!/usr/bin/env bash
# Installs promtool (and prometheus) from the Debian/Ubuntu `prometheus` package when promtool is
# missing; does nothing when it is already on PATH. Prints the path of promtool on success.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v promtool >/dev/null 2>&1; then
  ./apt-install.sh install-prometheus prometheus
  command -v promtool >/dev/null 2>&1 \
    || { echo "install-prometheus: the prometheus package was installed but promtool is still not on PATH" >&2; exit 1; }
fi
command -v promtool
