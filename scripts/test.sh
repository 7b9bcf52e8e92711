#!/usr/bin/env bash
# The test command: starts what the tests need, then runs every test. A missing service fails
# the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo test --locked --all-targets "$@"
