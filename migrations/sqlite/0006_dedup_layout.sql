-- How the claims are laid out: one row, written once by the first process that runs the gate
-- on this database. shards = 0 means the single table idempotent_record; N > 0 means the
-- tables idempotent_record_00 … idempotent_record_{N-1}, chosen by a stable hash of the key.
-- A later start with another N is refused: keys would land in other tables than their claims.
CREATE TABLE dedup_layout (
    name           VARCHAR(64)  NOT NULL PRIMARY KEY,
    shards         INTEGER      NOT NULL,
    created_at_ms  BIGINT       NOT NULL,
    created_by     VARCHAR(128) NOT NULL
);

-- Every live claim, whatever the layout: the readers (trace, lists, reconcile, metrics) read
-- this view. A sharded layout replaces it with the UNION ALL of the shards.
CREATE VIEW idempotent_record_all AS
    SELECT id, consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, payload_hash,
           instance_id, claimed_at_ms
    FROM idempotent_record;
