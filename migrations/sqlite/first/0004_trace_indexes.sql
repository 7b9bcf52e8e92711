-- Indexes for the web UI's reads.
-- Key collisions (a duplicate whose body differs from the claim's) are listed newest first; they
-- are rare, so this index stays small in effect but spares a scan of every duplicate.
CREATE INDEX delivery_log_collision ON delivery_log (payload_match, logged_at_ms);
-- The trace page of a payment.confirm key shows the order that payment paid.
CREATE INDEX shop_order_payment_no ON shop_order (payment_no);
