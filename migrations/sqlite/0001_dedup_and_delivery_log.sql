-- SQLite dialect: AUTOINCREMENT so that ids are never reused after rows move to the archive;
-- VARCHAR lengths are not enforced by SQLite, the gate checks them before any SQL runs.
--
-- The dedup claim table: one row per business key a consumer group has applied.
-- Times are epoch milliseconds (BIGINT) on every backend, so the three stores behave alike.
-- execute_time is NOT NULL with a default because NULLs never collide in a unique index:
-- 0 means "not a delayed message".
CREATE TABLE idempotent_record (
    id             INTEGER      PRIMARY KEY AUTOINCREMENT,
    consumer_group VARCHAR(128) NOT NULL,
    biz_type       VARCHAR(64)  NOT NULL,
    biz_id         VARCHAR(128) NOT NULL,
    execute_time   BIGINT       NOT NULL DEFAULT 0,
    msg_id         VARCHAR(128) NOT NULL,
    uniq_key       VARCHAR(128) NOT NULL DEFAULT '',
    payload_hash   VARCHAR(64)  NOT NULL,
    instance_id    VARCHAR(128) NOT NULL,
    claimed_at_ms  BIGINT       NOT NULL,
    CONSTRAINT idempotent_record_claim_key UNIQUE (consumer_group, biz_type, biz_id, execute_time)
);
CREATE INDEX idempotent_record_biz_id ON idempotent_record (biz_id);
CREATE INDEX idempotent_record_claimed_at ON idempotent_record (claimed_at_ms);

-- Old claims move here. No unique key: a key archived, claimed again by a late duplicate and
-- archived again must not fail the move. The id is the live row's id.
CREATE TABLE idempotent_record_archive (
    id             BIGINT       PRIMARY KEY,
    consumer_group VARCHAR(128) NOT NULL,
    biz_type       VARCHAR(64)  NOT NULL,
    biz_id         VARCHAR(128) NOT NULL,
    execute_time   BIGINT       NOT NULL DEFAULT 0,
    msg_id         VARCHAR(128) NOT NULL,
    uniq_key       VARCHAR(128) NOT NULL DEFAULT '',
    payload_hash   VARCHAR(64)  NOT NULL,
    instance_id    VARCHAR(128) NOT NULL,
    claimed_at_ms  BIGINT       NOT NULL,
    archived_at_ms BIGINT       NOT NULL
);
CREATE INDEX idempotent_record_archive_key
    ON idempotent_record_archive (biz_id, biz_type, consumer_group, execute_time);

-- One row per delivery attempt, whatever its outcome.
CREATE TABLE delivery_log (
    id              INTEGER      PRIMARY KEY AUTOINCREMENT,
    logged_at_ms    BIGINT       NOT NULL,
    instance_id     VARCHAR(128) NOT NULL,
    consumer_group  VARCHAR(128) NOT NULL,
    msg_id          VARCHAR(128) NOT NULL,
    uniq_key        VARCHAR(128) NOT NULL DEFAULT '',
    topic           VARCHAR(255) NOT NULL,
    tags            VARCHAR(255) NOT NULL DEFAULT '',
    queue_id        INTEGER      NOT NULL,
    queue_offset    BIGINT       NOT NULL,
    reconsume_times INTEGER      NOT NULL,
    biz_type        VARCHAR(64)  NOT NULL,
    biz_id          VARCHAR(128) NOT NULL,
    execute_time    BIGINT       NOT NULL DEFAULT 0,
    outcome         VARCHAR(16)  NOT NULL,
    cause           VARCHAR(32),
    layer           VARCHAR(16),
    payload_match   SMALLINT,
    payload_hash    VARCHAR(64),
    error           TEXT,
    latency_us      BIGINT       NOT NULL,
    payload         BLOB
);
CREATE INDEX delivery_log_biz_id ON delivery_log (biz_id, logged_at_ms);
CREATE INDEX delivery_log_msg_id ON delivery_log (msg_id);
CREATE INDEX delivery_log_uniq_key ON delivery_log (uniq_key);
CREATE INDEX delivery_log_logged_at ON delivery_log (logged_at_ms);
CREATE INDEX delivery_log_outcome ON delivery_log (outcome, logged_at_ms);
