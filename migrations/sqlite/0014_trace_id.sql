-- The W3C trace id of the delivery's message, read from the `traceparent` property a producer's
-- tracing sets (OpenTelemetry's RocketMQ instrumentation writes one): 32 lowercase hex digits,
-- so that the trace page can link to the trace in Tempo or Jaeger and a search by trace id
-- finds the key. NULL when the message carries none, or one that cannot be read, and for rows
-- logged before this column.
--
-- The index keeps only the rows that carry a trace id, as delivery_log_attempt does: a log of
-- messages sent without tracing costs no index insertion per row. A search by trace id reads
-- it with `trace_id = ?`, which only a row with a trace id can match.
--
-- Building the index reads the whole log once: on a big log, apply this migration
-- (`idemgate migrate`) in a quiet moment.
ALTER TABLE delivery_log ADD COLUMN trace_id TEXT;
CREATE INDEX delivery_log_trace_id ON delivery_log (trace_id) WHERE trace_id IS NOT NULL;
