-- The record of what the consumers did, the evidence a redelivery's sub-cause is read from
-- (src/instances/): each instance's run (one row per start: its heartbeat, and how it stopped:
-- 'clean', or 'crash' when its heartbeat ended without a clean stop), and the events of its
-- runs (started, stopped, crashed, assigned, revoked, ack_failed, consume_timeout), each with
-- the queue or partition it names. The archive deletes both past the log's retention.
-- The log keeps, beside a delivery, the stored copy it was read from when that is not its own
-- msgId (a retry copy's first copy), and a redelivery's sub-cause. Adding columns that may be
-- NULL, without an index, rewrites no row.
ALTER TABLE delivery_log ADD COLUMN stored_copy VARCHAR(128) NULL;
ALTER TABLE delivery_log ADD COLUMN sub_cause VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL;

CREATE TABLE consumer_instance (
    instance_id     VARCHAR(128) NOT NULL,
    started_at_ms   BIGINT       NOT NULL,
    consumer_group  VARCHAR(128) NOT NULL,
    broker          VARCHAR(16)  NOT NULL,
    heartbeat_at_ms BIGINT       NOT NULL,
    stopped_at_ms   BIGINT       NULL,
    stop            VARCHAR(16)  NULL,
    PRIMARY KEY (instance_id, started_at_ms)
);
CREATE INDEX consumer_instance_group ON consumer_instance (consumer_group, heartbeat_at_ms);

CREATE TABLE consumer_event (
    id              BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at_ms           BIGINT       NOT NULL,
    consumer_group  VARCHAR(128) NOT NULL,
    instance_id     VARCHAR(128) NOT NULL,
    kind            VARCHAR(24)  NOT NULL,
    queue           VARCHAR(320) NOT NULL DEFAULT '',
    detail          VARCHAR(500) NOT NULL DEFAULT ''
);
CREATE INDEX consumer_event_instance ON consumer_event (instance_id, at_ms);
CREATE INDEX consumer_event_group ON consumer_event (consumer_group, at_ms);
