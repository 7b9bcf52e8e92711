-- MySQL/MariaDB dialect. Archiving: the lease that lets one instance archive at a time, and the
-- record of every run. Times are epoch milliseconds (BIGINT), as everywhere else.

-- One row per lease name. An instance holds it while expires_at_ms is in the future; a run that
-- crashed leaves it behind and it simply expires. No external coordinator is needed.
CREATE TABLE archive_lease (
    name           VARCHAR(64)  NOT NULL PRIMARY KEY,
    holder         VARCHAR(200) NOT NULL,
    acquired_at_ms BIGINT       NOT NULL,
    expires_at_ms  BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per pass of a run: kind 'dedup' (claims moved to idempotent_record_archive) or 'log'
-- (delivery_log rows deleted). status: running, success, failed, skipped (another instance held
-- the lease). A run that never finished is marked failed by the next one that takes the lease.
CREATE TABLE archive_run (
    id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    kind           VARCHAR(16)  NOT NULL,
    status         VARCHAR(16)  NOT NULL,
    started_by     VARCHAR(16)  NOT NULL,
    instance_id    VARCHAR(128) NOT NULL,
    started_at_ms  BIGINT       NOT NULL,
    finished_at_ms BIGINT,
    cutoff_ms      BIGINT       NOT NULL,
    rows_moved     BIGINT       NOT NULL DEFAULT 0,
    batches        BIGINT       NOT NULL DEFAULT 0,
    error          TEXT,
    note           TEXT,
    KEY archive_run_kind_started (kind, started_at_ms),
    KEY archive_run_status (status)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
