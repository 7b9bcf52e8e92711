-- The W3C trace id of the delivery's message, read from the `traceparent` property a producer's
-- tracing sets (OpenTelemetry's RocketMQ instrumentation writes one): 32 lowercase hex digits,
-- so that the trace page can link to the trace in Tempo or Jaeger and a search by trace id
-- finds the key. NULL when the message carries none, or one that cannot be read, and for rows
-- logged before this column.
--
-- MySQL/MariaDB have no partial index: every row has an entry, NULL for a row without a trace
-- id. A search by trace id reads it with `trace_id = ?`, a probe whatever the NULLs.
--
-- Building the index reads the whole log once: on a big log, apply this migration
-- (`idemgate migrate`) in a quiet moment.
ALTER TABLE delivery_log
    ADD COLUMN trace_id VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD KEY delivery_log_trace_id (trace_id);
