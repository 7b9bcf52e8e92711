-- Whether a delivery's kept body was cut at the size limit (4 MiB, delivery_log::MAX_KEPT_PAYLOAD):
-- replay refuses a cut body, since what is kept is not the message. Until now only a note at the
-- end of the error text said so, and a handler's own error can hold the same words.
ALTER TABLE delivery_log ADD COLUMN payload_truncated SMALLINT NOT NULL DEFAULT 0;

-- Rows logged before this column: a body was cut exactly when the log appended its note
-- " [body of N bytes cut to 4194304]" at the very end of the error and kept exactly 4194304
-- bytes. Only dead letters and invalid deliveries keep a body.
UPDATE delivery_log SET payload_truncated = 1
WHERE outcome IN ('dead_lettered', 'invalid')
  AND error LIKE '%[body of % bytes cut to 4194304]'
  AND LENGTH(payload) = 4194304;
