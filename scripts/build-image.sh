#!/usr/bin/env bash
# Builds idemgate's container image, deploy/container/Dockerfile: `idemgate` for the musl target,
# statically linked, in the workspace's own target/, then an image FROM scratch holding only it,
# tagged idemgate:<version>. Needs the musl target (`rustup target add x86_64-unknown-linux-musl`),
# musl-gcc (Debian's musl-tools) for the crates that build C, binutils' strip, and a running
# Docker engine.
# Prints the image's tag.
#
#   scripts/build-image.sh [TAG]
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-musl
version=$(cargo metadata --no-deps --format-version 1 --locked \
  | python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "idemgate-cli"))')
tag=${1:-idemgate:$version}

fail() {
  echo "build-image: $*" >&2
  exit 1
}

rustup target list --installed 2>/dev/null | grep -qx "$target" \
  || fail "the $target target is not installed: rustup target add $target"
command -v musl-gcc >/dev/null 2>&1 || fail "musl-gcc is missing: apt-get install musl-tools"
docker info >/dev/null 2>&1 || fail "no Docker engine answers (docker info)"

# The C of the -sys crates (SQLite, zstd, zlib, aws-lc) is compiled with musl-gcc and linked
# statically, like the Rust code.
CC_x86_64_unknown_linux_musl=musl-gcc \
  cargo build --locked --release --target "$target" -p idemgate-cli --bin idemgate >&2
binary="target/$target/release/idemgate"
file -b "$binary" | grep -q "static" || fail "$binary is not statically linked: $(file -b "$binary")"

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp deploy/container/Dockerfile "$context/"
# Without the line tables (280 MB to 58 MB); the symbols stay, so a backtrace still names functions.
strip --strip-debug -o "$context/idemgate" "$binary"
docker build --quiet --tag "$tag" "$context" >&2
echo "$tag"
