#!/usr/bin/env bash
# Installs tansu, an Apache Kafka-compatible broker (from crates.io), once per machine, outside
# the clone, and reuses it afterwards. Prints the path of the binary on success. The Kafka tests
# (crates/idemgate-cli/tests/end_to_end/brokers.rs, kafka.rs) and `idemgate-bench broker --kind
# kafka` start it with its in-memory storage (`memory://`, the `dynostore` feature).
#
# tansu 0.6.0 differs from Kafka in two ways the tests meet; the build patches both, in copies of
# the published crates, and crates/idemgate-cli/tests/end_to_end/kafka.rs holds the broker to each:
#
# - scripts/patches/tansu-0.6.0-fetch-inside-batch.patch (tansu-storage): a fetch at an offset
#   inside a record batch was answered with the *next* batch, so a consumer whose committed offset
#   fell inside a batch skipped the rest of it. Kafka's log answers with the batch that holds the
#   offset (`a_fetch_inside_a_batch_starts_at_its_offset`).
# - scripts/patches/tansu-0.6.0-sync-without-leader.patch (tansu-broker): once a dead leader was
#   dropped from a forming group, a follower's SyncGroup, which carries no assignments, formed the
#   group with every partition unassigned, for good. Kafka's coordinator has the member rejoin and
#   elects a leader (`a_restart_one_second_after_a_sigkill_...`).
#
#   IDEMGATE_TANSU_ROOT   where the binary goes (default ~/.cache/idemgate/tansu-0.6.0-p2)
set -euo pipefail
cd "$(dirname "$0")/.."
patches="$PWD/scripts/patches"

version=0.6.0
root="${IDEMGATE_TANSU_ROOT:-$HOME/.cache/idemgate/tansu-$version-p2}"
bin="$root/bin/tansu"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
command -v patch >/dev/null || { echo "install-tansu: patch(1) is missing (apt-get install patch)" >&2; exit 1; }

echo "installing tansu $version (patched: a fetch inside a batch, a SyncGroup without a leader) into $root (a long build: about 27 minutes on 2 cores)" >&2
mkdir -p "$root"
work="$root/src"
rm -rf "$work"
mkdir -p "$work/fetch/src"
# tansu-storage's and tansu-broker's published sources, through cargo's own registry client,
# patched in copies.
cat >"$work/fetch/Cargo.toml" <<TOML
[package]
name = "tansu-sources"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
tansu-storage = { version = "=$version", default-features = false, features = ["dynostore"] }
tansu-broker = { version = "=$version", default-features = false }
TOML
echo 'fn main() {}' >"$work/fetch/src/main.rs"
( cd "$work/fetch" && cargo fetch -q >&2 )
metadata=$(cargo metadata --format-version 1 --manifest-path "$work/fetch/Cargo.toml")
source_of() {
  python3 -c 'import json,sys,os; m=json.load(sys.stdin); print(next(os.path.dirname(p["manifest_path"]) for p in m["packages"] if p["name"]==sys.argv[1]))' "$1" <<<"$metadata"
}
for crate in tansu-storage:fetch-inside-batch tansu-broker:sync-without-leader; do
  name=${crate%%:*}
  cp -r "$(source_of "$name")" "$work/$name"
  chmod -R u+w "$work/$name"
  ( cd "$work/$name" && patch -p1 --forward <"$patches/tansu-$version-${crate#*:}.patch" >&2 )
done
# A private target dir keeps the broker's build out of the project's own target/; the patch
# table moves only the two patched crates to their copies.
CARGO_TARGET_DIR="$root/build" cargo install "tansu@$version" \
  --config "patch.crates-io.tansu-storage.path=\"$work/tansu-storage\"" \
  --config "patch.crates-io.tansu-broker.path=\"$work/tansu-broker\"" \
  --no-default-features --features dynostore --root "$root" >&2
rm -rf "$root/build" "$work"
[[ -x "$bin" ]] || { echo "tansu install did not produce $bin" >&2; exit 1; }
echo "$bin"
