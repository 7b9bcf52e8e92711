#!/usr/bin/env bash
# Installs tansu, an Apache Kafka-compatible broker (from crates.io), once per machine, outside
# the clone, and reuses it afterwards. Prints the path of the binary on success. The Kafka tests
# (crates/idemgate-cli/tests/end_to_end/brokers.rs, kafka.rs) and `idemgate-bench broker --kind
# kafka` start it with its in-memory storage (`memory://`, the `dynostore` feature).
#
# tansu 0.6.0 answers a fetch at an offset inside a record batch with the *next* batch (or
# nothing), so a consumer whose committed offset falls inside a batch silently skips the rest of
# it. Kafka's own log answers with the batch that holds the offset. The build applies
# scripts/patches/tansu-0.6.0-fetch-inside-batch.patch to tansu-storage, which does the same;
# crates/idemgate-cli/tests/end_to_end/kafka.rs (`a_fetch_inside_a_batch_starts_at_its_offset`)
# holds the installed broker to it.
#
#   IDEMGATE_TANSU_ROOT   where the binary goes (default ~/.cache/idemgate/tansu-0.6.0-p1)
set -euo pipefail
cd "$(dirname "$0")/.."
patch_file="$PWD/scripts/patches/tansu-0.6.0-fetch-inside-batch.patch"

version=0.6.0
root="${IDEMGATE_TANSU_ROOT:-$HOME/.cache/idemgate/tansu-$version-p1}"
bin="$root/bin/tansu"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
command -v patch >/dev/null || { echo "install-tansu: patch(1) is missing (apt-get install patch)" >&2; exit 1; }

echo "installing tansu $version (patched: fetch inside a batch) into $root (a long build: about 27 minutes on 2 cores)" >&2
mkdir -p "$root"
work="$root/src"
rm -rf "$work"
mkdir -p "$work/fetch/src"
# tansu-storage's published source, through cargo's own registry client, patched in a copy.
cat >"$work/fetch/Cargo.toml" <<TOML
[package]
name = "tansu-sources"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
tansu-storage = { version = "=$version", default-features = false, features = ["dynostore"] }
TOML
echo 'fn main() {}' >"$work/fetch/src/main.rs"
( cd "$work/fetch" && cargo fetch -q >&2 )
storage=$(cargo metadata --format-version 1 --manifest-path "$work/fetch/Cargo.toml" \
  | python3 -c 'import json,sys,os; m=json.load(sys.stdin); print(next(os.path.dirname(p["manifest_path"]) for p in m["packages"] if p["name"]=="tansu-storage"))')
cp -r "$storage" "$work/tansu-storage"
chmod -R u+w "$work/tansu-storage"
( cd "$work/tansu-storage" && patch -p1 --forward <"$patch_file" >&2 )
# A private target dir keeps the broker's build out of the project's own target/; the patch
# table moves only tansu-storage to the patched copy.
CARGO_TARGET_DIR="$root/build" cargo install "tansu@$version" \
  --config "patch.crates-io.tansu-storage.path=\"$work/tansu-storage\"" \
  --no-default-features --features dynostore --root "$root" >&2
rm -rf "$root/build" "$work"
[[ -x "$bin" ]] || { echo "tansu install did not produce $bin" >&2; exit 1; }
echo "$bin"
