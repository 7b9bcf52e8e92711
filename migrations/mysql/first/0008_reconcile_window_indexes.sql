-- The reconciler's stock-ledger check reads the ledger rows of its window; this index is how,
-- instead of a scan of the whole ledger, which only grows.
CREATE INDEX shop_stock_ledger_applied_at ON shop_stock_ledger (applied_at_ms);
