#!/usr/bin/env bash
# Installs the RocketMQ name server and broker (the Rust port, from crates.io) once per machine,
# outside the clone, and reuses them afterwards. Prints the install root on success.
#
#   IDEMGATE_ROCKETMQ_ROOT   where the binaries go (default ~/.cache/idemgate/rocketmq-1.0.0)
set -euo pipefail

version=1.0.0
root="${IDEMGATE_ROCKETMQ_ROOT:-$HOME/.cache/idemgate/rocketmq-$version}"
namesrv="$root/bin/rocketmq-namesrv-rust"
broker="$root/bin/rocketmq-broker-rust"

if [[ -x "$namesrv" && -x "$broker" ]]; then
  echo "$root"
  exit 0
fi

echo "installing rocketmq-namesrv and rocketmq-broker $version into $root (about 18 minutes on 2 cores)" >&2
mkdir -p "$root"
# A private target dir keeps the broker's build out of the project's own target/.
CARGO_TARGET_DIR="$root/build" cargo install --locked \
  "rocketmq-namesrv@$version" "rocketmq-broker@$version" --root "$root" >&2
rm -rf "$root/build"
[[ -x "$namesrv" && -x "$broker" ]] || { echo "rocketmq install did not produce $namesrv and $broker" >&2; exit 1; }
echo "$root"
