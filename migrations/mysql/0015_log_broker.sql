-- The kind of broker that delivered each row's message: 'rabbitmq' or 'kafka'; NULL for
-- RocketMQ, and for rows logged before this column. The trace page reads a row's coordinates by
-- it (exchange, routing key and delivery tag; topic, partition and offset; topic, queue and
-- offset). Adding a column that may be NULL, without an index, rewrites no row.
ALTER TABLE delivery_log ADD COLUMN broker VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL;
