#!/usr/bin/env bash
# nftables for the partition scenarios (crates/idemgate-cli/tests/partitions): installed once
# per machine; iproute2 (`ip netns`, veth pairs) is part of the base system.
set -euo pipefail
if command -v nft >/dev/null; then
  exit 0
fi
echo "installing nftables" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq nftables >&2
command -v nft >/dev/null || { echo "nftables did not install nft" >&2; exit 1; }
