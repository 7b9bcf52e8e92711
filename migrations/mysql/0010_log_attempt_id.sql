-- The attempt a log row written on its own records (a duplicate, a failure, a dead letter, an
-- invalid delivery). Such a row is written again on a fresh connection when the answer to its
-- insert is lost; if the insert had committed, the unique index finds the attempt there and the
-- second write adds nothing. A processed row is written inside the gate's transaction and
-- carries no attempt (NULL).
--
-- Building the index reads the whole log once: on a big log, apply this migration
-- (`idemgate migrate`) in a quiet moment.
-- MySQL/MariaDB have no partial index: every row has an entry, NULL for a processed one (a
-- unique index takes NULL as often as it comes).
ALTER TABLE delivery_log
    ADD COLUMN attempt_id VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD UNIQUE KEY delivery_log_attempt (attempt_id);
