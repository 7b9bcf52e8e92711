#!/usr/bin/env bash
# Checks the Prometheus side of dashboards/: every rule file with `promtool check rules` (lint
# warnings are errors), the example prometheus.yml with `promtool check config`, and every unit
# test file with `promtool test rules`. Runs them all, then exits non-zero if any failed.
# Needs promtool (scripts/install-prometheus.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=dashboards/prometheus

if ! command -v promtool >/dev/null 2>&1; then
  echo "check-rules: promtool not found on PATH; install it with scripts/install-prometheus.sh" >&2
  exit 2
fi

shopt -s nullglob
rule_files=("$dir"/*.rules.yml)
test_files=("$dir"/tests/*.test.yml)
if ((${#rule_files[@]} == 0)); then
  echo "check-rules: no rule files ($dir/*.rules.yml)" >&2
  exit 1
fi
if ((${#test_files[@]} == 0)); then
  echo "check-rules: no rule tests ($dir/tests/*.test.yml)" >&2
  exit 1
fi

# --lint-fatal turns lint findings into a failure; an older promtool without it only prints
# them, so its output is searched for them instead.
lint=(--lint=all)
lint_fatal=0
if promtool check rules --help 2>&1 | grep -q -- '--lint-fatal'; then
  lint+=(--lint-fatal)
  lint_fatal=1
fi

failed=0
run() {
  local out
  if out=$("$@" 2>&1); then
    printf '%s\n' "$out"
    if ((lint_fatal == 0)) && grep -qi 'duplicate rule' <<<"$out"; then
      echo "check-rules: lint findings in: $*" >&2
      failed=1
    fi
  else
    printf '%s\n' "$out" >&2
    echo "check-rules: FAILED: $*" >&2
    failed=1
  fi
}

run promtool check rules "${lint[@]}" "${rule_files[@]}"
if [[ -f "$dir/prometheus.yml" ]]; then
  run promtool check config "${lint[@]}" "$dir/prometheus.yml"
fi
for test_file in "${test_files[@]}"; do
  run promtool test rules "$test_file"
done

cases=$(cat "${test_files[@]}" | grep -c '^  - name:' || true)
if ((failed)); then
  echo "check-rules: FAILED ($(promtool --version 2>&1 | head -n 1))" >&2
  exit 1
fi
echo "check-rules: ${#rule_files[@]} rule files valid, ${#test_files[@]} test files with $cases test groups passed"
