-- MySQL/MariaDB dialect. Key columns use utf8mb4_bin: the default case-insensitive collation
-- would make 'order-1' and 'ORDER-1' collide in the unique index, and a collision there means a
-- business effect silently skipped. Times are epoch milliseconds (BIGINT) on every backend.
-- execute_time is NOT NULL with a default because NULLs never collide in a unique index:
-- 0 means "not a delayed message".
CREATE TABLE idempotent_record (
    id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_group VARCHAR(128) NOT NULL,
    biz_type       VARCHAR(64)  NOT NULL,
    biz_id         VARCHAR(128) NOT NULL,
    execute_time   BIGINT       NOT NULL DEFAULT 0,
    msg_id         VARCHAR(128) NOT NULL,
    uniq_key       VARCHAR(128) NOT NULL DEFAULT '',
    payload_hash   VARCHAR(64)  NOT NULL,
    instance_id    VARCHAR(128) NOT NULL,
    claimed_at_ms  BIGINT       NOT NULL,
    UNIQUE KEY idempotent_record_claim_key (consumer_group, biz_type, biz_id, execute_time),
    KEY idempotent_record_biz_id (biz_id),
    KEY idempotent_record_claimed_at (claimed_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Old claims move here. No unique key: a key archived, claimed again by a late duplicate and
-- archived again must not fail the move. The id is the live row's id.
CREATE TABLE idempotent_record_archive (
    id             BIGINT       NOT NULL PRIMARY KEY,
    consumer_group VARCHAR(128) NOT NULL,
    biz_type       VARCHAR(64)  NOT NULL,
    biz_id         VARCHAR(128) NOT NULL,
    execute_time   BIGINT       NOT NULL DEFAULT 0,
    msg_id         VARCHAR(128) NOT NULL,
    uniq_key       VARCHAR(128) NOT NULL DEFAULT '',
    payload_hash   VARCHAR(64)  NOT NULL,
    instance_id    VARCHAR(128) NOT NULL,
    claimed_at_ms  BIGINT       NOT NULL,
    archived_at_ms BIGINT       NOT NULL,
    KEY idempotent_record_archive_key (biz_id, biz_type, consumer_group, execute_time)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per delivery attempt, whatever its outcome.
CREATE TABLE delivery_log (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    logged_at_ms    BIGINT       NOT NULL,
    instance_id     VARCHAR(128) NOT NULL,
    consumer_group  VARCHAR(128) NOT NULL,
    msg_id          VARCHAR(128) NOT NULL,
    uniq_key        VARCHAR(128) NOT NULL DEFAULT '',
    topic           VARCHAR(255) NOT NULL,
    tags            VARCHAR(255) NOT NULL DEFAULT '',
    queue_id        INT          NOT NULL,
    queue_offset    BIGINT       NOT NULL,
    reconsume_times INT          NOT NULL,
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
    payload         MEDIUMBLOB,
    KEY delivery_log_biz_id (biz_id, logged_at_ms),
    KEY delivery_log_msg_id (msg_id),
    KEY delivery_log_uniq_key (uniq_key),
    KEY delivery_log_logged_at (logged_at_ms),
    KEY delivery_log_outcome (outcome, logged_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
