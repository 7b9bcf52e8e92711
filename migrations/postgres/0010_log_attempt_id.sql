-- The attempt a log row written on its own records (a duplicate, a failure, a dead letter, an
-- invalid delivery). Such a row is written again on a fresh connection when the answer to its
-- insert is lost; if the insert had committed, the unique index finds the attempt there and the
-- second write adds nothing. A processed row is written inside the gate's transaction and
-- carries no attempt: the index keeps only the rows that have one.
--
-- Building the index reads the whole log once: on a big log, apply this migration
-- (`idemgate migrate`) in a quiet moment.
ALTER TABLE delivery_log ADD COLUMN attempt_id VARCHAR(32);
CREATE UNIQUE INDEX delivery_log_attempt ON delivery_log (attempt_id) WHERE attempt_id IS NOT NULL;
