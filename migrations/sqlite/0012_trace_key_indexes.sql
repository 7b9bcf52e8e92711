-- A key's trace reads its deliveries by the whole key (bizId, biz_type, group, execute_time),
-- never by the bizId alone: a bizId can name several keys, and one key can have millions of
-- deliveries (a message redelivered without end, a producer resending in a loop). Each read of
-- the trace is then a probe or a range of at most a page, whatever the key's size.
--
-- delivery_log_key: the timeline, a page at a time in its own order, its first and last
-- delivery, and the keys a bizId names, found one probe each. It replaces delivery_log_biz_id,
-- whose leading column it keeps, so every read by bizId alone still has its index.
-- delivery_log_key_outcome: the summary's counts, one range per outcome, duplicate cause and
-- collision, each read up to the summary's count limit.
--
-- Building them reads the whole log once and holds off writes to it while it runs: on a big
-- log, apply this migration (`idemgate migrate`) in a quiet moment.
CREATE INDEX delivery_log_key
    ON delivery_log (biz_id, biz_type, consumer_group, execute_time, logged_at_ms, id);
CREATE INDEX delivery_log_key_outcome
    ON delivery_log (biz_id, biz_type, consumer_group, execute_time, outcome, cause, payload_match, logged_at_ms);
DROP INDEX delivery_log_biz_id;
