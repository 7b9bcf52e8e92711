#!/usr/bin/env bash
# The ceiling of the batch path on PostgreSQL, in SQL alone: what a group of 32 deliveries costs
# the database with the handler alone (no claim, no log), with the cheapest claim there can be
# (keyed by its primary key, nothing else indexed, no log row: below what idemgate promises),
# with the claim row carrying the processed delivery's log entry (log rows for the rest only),
# with today's claim table keyed by biz_id first, and with today's tables. No client work at all:
# pgbench sends each group as one transaction of a few statements.
#
# For each layout it prints groups per second and the CPU time PostgreSQL spent per message (all
# its processes, from /proc: backends that exited count through the postmaster's children), the
# median over --rounds rounds run in turn, each on emptied tables. The CPU time per message is
# the figure that holds on a busy machine; msg/s is the one to compare on a quiet one.
#
#   scripts/bench-ceiling.sh [ROUNDS] [GROUPS_PER_CLIENT]     (default 3 rounds, 300 groups x 4 clients)
#   PGHOST / PGPORT / PGUSER as for psql (default 127.0.0.1:5432, postgres); needs a local server.
set -euo pipefail
cd "$(dirname "$0")/ceiling"
rounds=${1:-3}
groups=${2:-300}
clients=4
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
db=idemgate_ceiling
for tool in psql pgbench python3; do command -v $tool >/dev/null || { echo "bench-ceiling: $tool is missing" >&2; exit 1; }; done
work=$(mktemp -d)
trap 'rm -rf "$work"; psql -qd postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
./gen.py "$work"
psql -qd postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
psql -qd $db -v ON_ERROR_STOP=1 -f tables.sql >/dev/null
postmaster=$(pgrep -o -x postgres) || { echo "bench-ceiling: no local PostgreSQL server process" >&2; exit 1; }
ticks=$(getconf CLK_TCK)
# CPU ticks of the postmaster's live children and of those it has reaped.
cpu() {
  local t
  t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$postmaster/stat")
  for p in $(pgrep -P "$postmaster"); do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$t"
}
variants="alone floor wide by_biz_id today"
messages=$((groups * clients * 32))
for round in $(seq 1 "$rounds"); do
  for v in $variants; do
    psql -qd $db -c "TRUNCATE shop_stock_ledger, claim_today, claim_by_biz_id, claim_pk, claim_wide, log_today;
      ALTER SEQUENCE grp RESTART 100; CHECKPOINT" >/dev/null
    before=$(cpu)
    out=$(pgbench -n -c $clients -j 2 -t "$groups" -f "$work/$v.sql" $db 2>&1) || { echo "$out" >&2; exit 1; }
    after=$(cpu)
    tps=$(grep -oP 'tps = \K[0-9.]+' <<<"$out")
    failed=$(grep -oP 'number of failed transactions: \K[0-9]+' <<<"$out" || echo 0)
    [[ "$failed" == 0 ]] || { echo "bench-ceiling: $v: $failed transactions failed" >&2; exit 1; }
    echo "$v $tps $(( (after - before) * 1000000 / ticks / messages ))" >>"$work/results"
    echo "round $round: $v $(awk -v t="$tps" 'BEGIN{printf "%.0f", t*32}') msg/s, $(( (after - before) * 1000000 / ticks / messages )) µs of PostgreSQL CPU per message" >&2
  done
done
python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v, tps, us = line.split()
    rows.setdefault(v, []).append((float(tps) * 32, int(us)))
names = {
    "alone": "handler alone: every delivery applied, no claim, no log (unsafe)",
    "floor": "claim keyed by its primary key only, no log row (below the guarantees)",
    "wide": "claim row carries the processed delivery's log entry; log rows for duplicates only",
    "by_biz_id": "today's claim with the unique key leading with biz_id (no biz_id index) + today's log",
    "today": "today: claim (primary key + 3 indexes) + log row (primary key + 4 indexes + 2 partial)",
}
base_rate = statistics.median(r for r, _ in rows["alone"])
base_cpu = statistics.median(u for _, u in rows["alone"])
print("| layout | msg/s | × handler alone | PostgreSQL CPU µs/msg | handler alone's CPU ÷ this |")
print("|---|---|---|---|---|")
for v in ["alone", "floor", "wide", "by_biz_id", "today"]:
    rate = statistics.median(r for r, _ in rows[v])
    cpu = statistics.median(u for _, u in rows[v])
    print(f"| {names[v]} | {rate:,.0f} | {rate / base_rate:.2f} | {cpu} | {base_cpu / cpu:.2f} |")
PY
