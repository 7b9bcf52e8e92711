#!/usr/bin/env bash
# The test command: starts what the tests need, installs what they run (once per machine),
# then runs every test. A missing service or tool fails the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# No module may import another in a cycle: the layers in ARCHITECTURE.md hold.
scripts/check-cycles.py
scripts/services.sh
scripts/install-prometheus.sh >/dev/null
scripts/install-rocketmq.sh >/dev/null
scripts/install-chromium.sh >/dev/null
cargo test --locked --all-targets "$@"
