#!/usr/bin/env bash
# Writes the shipped monitoring files from the jsonnet mixin in mixin/:
#   DIR/idemgate.json                       the Grafana dashboard
#   DIR/prometheus/recording.rules.yml      the recording rules
#   DIR/prometheus/alerts.rules.yml         the alerts
# `scripts/generate-mixin.sh [DIR [JSONNET_OPTION...]]`. DIR is dashboards/ by default; the
# options go to every jsonnet run, such as a configuration of your own over the defaults of
# mixin/config.libsonnet:
#   scripts/generate-mixin.sh out --tla-code config='{idemgateSelector: "job=\"payments-idemgate\""}'
# Needs jsonnet (scripts/install-jsonnet.sh installs it). A file is only replaced once its
# jsonnet has run without an error.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dashboards}
shift || true

if ! command -v jsonnet >/dev/null 2>&1; then
  echo "generate-mixin: jsonnet not found on PATH; install it with scripts/install-jsonnet.sh" >&2
  exit 2
fi

mkdir -p "$out/prometheus"
build() { # entry point under mixin/build, output file, jsonnet options...
  local entry=$1 file=$2
  shift 2
  local tmp
  tmp=$(mktemp "$file.XXXXXX")
  if jsonnet "$@" "$root/mixin/build/$entry" >"$tmp"; then
    mv "$tmp" "$file"
  else
    rm -f "$tmp"
    echo "generate-mixin: jsonnet failed on mixin/build/$entry" >&2
    exit 1
  fi
}
build idemgate.json.jsonnet "$out/idemgate.json" "$@"
build recording.rules.jsonnet "$out/prometheus/recording.rules.yml" --string "$@"
build alerts.rules.jsonnet "$out/prometheus/alerts.rules.yml" --string "$@"
echo "generate-mixin: wrote $out/idemgate.json, $out/prometheus/recording.rules.yml and $out/prometheus/alerts.rules.yml"
