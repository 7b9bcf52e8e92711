#!/usr/bin/env bash
# Installs tansu, an Apache Kafka-compatible broker (from crates.io), once per machine, outside
# the clone, and reuses it afterwards. Prints the path of the binary on success. The Kafka tests
# (crates/idemgate-cli/tests/end_to_end/kafka.rs) and `idemgate-bench broker --kind kafka` start
# it with its in-memory storage (`memory://`, the `dynostore` feature).
#
#   IDEMGATE_TANSU_ROOT   where the binary goes (default ~/.cache/idemgate/tansu-0.6.0)
set -euo pipefail

version=0.6.0
root="${IDEMGATE_TANSU_ROOT:-$HOME/.cache/idemgate/tansu-$version}"
bin="$root/bin/tansu"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

echo "installing tansu $version into $root (a long build: 27 minutes on 2 cores with another build beside it)" >&2
mkdir -p "$root"
# A private target dir keeps the broker's build out of the project's own target/.
CARGO_TARGET_DIR="$root/build" cargo install --locked "tansu@$version" \
  --no-default-features --features dynostore --root "$root" >&2
rm -rf "$root/build"
[[ -x "$bin" ]] || { echo "tansu install did not produce $bin" >&2; exit 1; }
echo "$bin"
