-- Reconciling: one row per run of the reconciler, and one per anomaly it found.
-- kind: lost, stuck, double_applied, orphan, key_collision, late_duplicate.
-- status: running, success, failed. Times are epoch milliseconds.
CREATE TABLE reconcile_run (
    id             INTEGER      PRIMARY KEY AUTOINCREMENT,
    status         VARCHAR(16)  NOT NULL,
    started_by     VARCHAR(16)  NOT NULL,
    instance_id    VARCHAR(128) NOT NULL,
    consumer_group VARCHAR(128) NOT NULL,
    biz_type       VARCHAR(64)  NOT NULL DEFAULT '',
    since_ms       BIGINT       NOT NULL,
    until_ms       BIGINT       NOT NULL,
    started_at_ms  BIGINT       NOT NULL,
    finished_at_ms BIGINT,
    anomalies      BIGINT       NOT NULL DEFAULT 0,
    error          TEXT
);
CREATE INDEX reconcile_run_started ON reconcile_run (started_at_ms);

CREATE TABLE reconcile_anomaly (
    id             INTEGER      PRIMARY KEY AUTOINCREMENT,
    run_id         BIGINT       NOT NULL,
    kind           VARCHAR(32)  NOT NULL,
    consumer_group VARCHAR(128) NOT NULL,
    biz_type       VARCHAR(64)  NOT NULL,
    biz_id         VARCHAR(128) NOT NULL,
    execute_time   BIGINT       NOT NULL DEFAULT 0,
    first_seen_ms  BIGINT,
    last_seen_ms   BIGINT,
    detail         TEXT         NOT NULL
);
CREATE INDEX reconcile_anomaly_run ON reconcile_anomaly (run_id, kind);
CREATE INDEX reconcile_anomaly_biz_id ON reconcile_anomaly (biz_id);
