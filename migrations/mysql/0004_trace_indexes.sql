-- Indexes for the web UI's reads.
-- Key collisions (a duplicate whose body differs from the claim's) are listed newest first; they
-- are rare, so this index stays small in effect but spares a scan of every duplicate.
CREATE INDEX delivery_log_collision ON delivery_log (payload_match, logged_at_ms);
-- The first text of this version (first/) also indexed the example shop's orders; that index is
-- the example's own now (migrations/shop/). The version records its first text's checksum.
