#!/usr/bin/env bash
# Installs jsonnet (the Debian/Ubuntu `jsonnet` package) when it is missing; does nothing when it
# is already on PATH. Prints the path of jsonnet on success. scripts/generate-mixin.sh and the
# dashboards tests run it.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v jsonnet >/dev/null 2>&1; then
  ./apt-install.sh install-jsonnet jsonnet
  command -v jsonnet >/dev/null 2>&1 \
    || { echo "install-jsonnet: the jsonnet package was installed but jsonnet is still not on PATH" >&2; exit 1; }
fi
command -v jsonnet
