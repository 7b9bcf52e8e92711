-- A lighter log. Most rows are `processed` deliveries, and no reader looks for those by outcome
-- or by payload mismatch: the lists, the conflict counts and replay read the other outcomes,
-- and a processed delivery is found by bizId, msgId or UNIQ_KEY. So these two indexes keep
-- entries only for the rows they serve, and a processed delivery's log row costs two index
-- insertions fewer. The readers repeat the indexes' conditions word for word, so that every
-- planner (SQLite's matches them literally) can use them.
--
-- Building them reads the whole log once and holds off writes to it while it runs: on a big
-- log, apply this migration (`idemgate migrate`) in a quiet moment.
DROP INDEX delivery_log_outcome;
CREATE INDEX delivery_log_outcome ON delivery_log (outcome, logged_at_ms) WHERE outcome <> 'processed';
DROP INDEX delivery_log_collision;
CREATE INDEX delivery_log_collision ON delivery_log (logged_at_ms) WHERE payload_match = 0;
