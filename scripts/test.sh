#!/usr/bin/env bash
# The test command: starts what the tests need, installs what they run (once per machine),
# then runs every test. A missing service or tool fails the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# No module may import another in a cycle, in any crate: the layers in ARCHITECTURE.md hold.
# (Between crates, cargo itself refuses a cycle.)
for src in src crates/*/src; do scripts/check-cycles.py "$src"; done
scripts/services.sh
scripts/install-prometheus.sh >/dev/null
# tests/service/dashboards.rs: the shipped dashboard and rules regenerated from mixin/.
scripts/install-jsonnet.sh >/dev/null
scripts/install-rocketmq.sh >/dev/null
# crates/idemgate-cli/tests/end_to_end/brokers.rs: the Kafka suite's broker.
scripts/install-tansu.sh >/dev/null
scripts/install-chromium.sh >/dev/null
# crates/idemgate-cli/tests/deploy: systemd-analyze, kubernetes-validate and the prometheus-operator schemas.
scripts/install-deploy-checks.sh >/dev/null
# crates/idemgate-cli/tests/galera: a three-node MariaDB Galera cluster behind HAProxy.
scripts/install-galera.sh >/dev/null
# crates/idemgate-cli/tests/partitions: network namespaces, veth pairs and nftables rules.
scripts/install-nftables.sh >/dev/null
# The scenarios on a two-broker cluster (crates/idemgate-cli/tests/end_to_end/cluster.rs) take minutes; they run here and
# when this is set by hand.
export IDEMGATE_CLUSTER_SCENARIOS=1
cargo test --locked --workspace --all-targets "$@"
