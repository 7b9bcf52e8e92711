#!/usr/bin/env python3
"""Writes the pgbench scripts of scripts/bench-ceiling.sh into the folder given.

One transaction is one group of 32 deliveries of stock.deduct over 16 SKUs: 22 fresh keys
and 10 copies of keys claimed 40 groups earlier (30% duplicates, as `bench broker` sends).
The stock rows are locked in SKU order first, as the batch form of stock.deduct does."""
import sys

out = sys.argv[1]
K = "(SELECT i, CASE WHEN i < 10 THEN (:g - 40) * 32 + i ELSE :g * 32 + i END AS k FROM generate_series(0, 31) i) x"
LOCK = ("SELECT sku FROM shop_stock WHERE sku IN (" + ", ".join(f"'SKU-{i}'" for i in range(16))
        + ") ORDER BY sku FOR UPDATE;")


def effect(where):
    return [
        "UPDATE shop_stock s SET quantity = s.quantity - d.q FROM (SELECT 'SKU-' || (k % 16) AS sku, "
        f"count(*) AS q FROM {K} {where} GROUP BY 1) d WHERE s.sku = d.sku;",
        "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) "
        f"SELECT 'D-' || k, 'SKU-' || (k % 16), 1, 1700000000000 + k FROM {K} {where};",
    ]


def claims(table, wide=False):
    cols = "consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms"
    vals = ("'bench', 'stock.deduct', 'D-' || k, 0, 'M-' || k || '-' || :g, 'U-' || k || '-' || :g, "
            "md5(k::text), 'i1', 1700000000000 + k")
    if wide:
        cols += ", topic, tags, queue_id, queue_offset, reconsume_times, latency_us"
        vals += ", 'shop', 'stock', 0, k, 0, 100"
    return f"INSERT INTO {table} ({cols}) SELECT {vals} FROM {K} ON CONFLICT DO NOTHING;"


def log(where=""):
    return ("INSERT INTO log_today (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, "
            "queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, payload_hash, "
            "latency_us) SELECT 1700000000000 + k, 'i1', 'bench', 'M-' || k || '-' || :g, "
            "'U-' || k || '-' || :g, 'shop', 'stock', 0, k, 0, 'stock.deduct', 'D-' || k, 0, "
            f"CASE WHEN i < 10 THEN 'duplicate' ELSE 'processed' END, md5(k::text), 100 FROM {K} {where};")


FRESH = "WHERE i >= 10"
VARIANTS = {
    "alone": [LOCK] + effect(""),
    "floor": [claims("claim_pk"), LOCK] + effect(FRESH),
    "wide": [claims("claim_wide", wide=True), LOCK] + effect(FRESH) + [log("WHERE i < 10")],
    "by_biz_id": [claims("claim_by_biz_id"), LOCK] + effect(FRESH) + [log()],
    "today": [claims("claim_today"), LOCK] + effect(FRESH) + [log()],
}
for name, body in VARIANTS.items():
    with open(f"{out}/{name}.sql", "w") as f:
        f.write("\n".join(["SELECT nextval('grp') AS g \\gset", "BEGIN;"] + body + ["COMMIT;"]) + "\n")
