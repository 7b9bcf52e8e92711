-- The tables of the ceiling measurement (scripts/bench-ceiling.sh), in a scratch database.
-- The example shop's stock and ledger as migrations/postgres/0002 and 0004/0008 make them, and
-- four claim/log layouts. Types and indexes follow migrations/postgres/0001 and 0009.
DROP TABLE IF EXISTS shop_stock, shop_stock_ledger, claim_today, claim_by_biz_id, claim_pk, claim_wide, log_today;
DROP SEQUENCE IF EXISTS grp;
CREATE SEQUENCE grp START 100;
CREATE TABLE shop_stock (sku VARCHAR(64) PRIMARY KEY, quantity BIGINT NOT NULL);
INSERT INTO shop_stock SELECT 'SKU-' || g, 1000000000000 FROM generate_series(0, 15) g;
CREATE TABLE shop_stock_ledger (id BIGSERIAL PRIMARY KEY, deduction_id VARCHAR(128) NOT NULL,
    sku VARCHAR(64) NOT NULL, quantity BIGINT NOT NULL, applied_at_ms BIGINT NOT NULL);
CREATE INDEX ON shop_stock_ledger (deduction_id);
CREATE INDEX ON shop_stock_ledger (applied_at_ms);
-- Today's claim table: primary key, the unique claim key, biz_id, claimed_at.
CREATE TABLE claim_today (id BIGSERIAL PRIMARY KEY, consumer_group VARCHAR(128) NOT NULL,
    biz_type VARCHAR(64) NOT NULL, biz_id VARCHAR(128) NOT NULL, execute_time BIGINT NOT NULL DEFAULT 0,
    msg_id VARCHAR(128) NOT NULL, uniq_key VARCHAR(128) NOT NULL DEFAULT '', payload_hash VARCHAR(64) NOT NULL,
    instance_id VARCHAR(128) NOT NULL, claimed_at_ms BIGINT NOT NULL,
    UNIQUE (consumer_group, biz_type, biz_id, execute_time));
CREATE INDEX ON claim_today (biz_id);
CREATE INDEX ON claim_today (claimed_at_ms);
-- The same with the unique key leading with biz_id, so that it serves lookups by bizId too.
CREATE TABLE claim_by_biz_id (id BIGSERIAL PRIMARY KEY, consumer_group VARCHAR(128) NOT NULL,
    biz_type VARCHAR(64) NOT NULL, biz_id VARCHAR(128) NOT NULL, execute_time BIGINT NOT NULL DEFAULT 0,
    msg_id VARCHAR(128) NOT NULL, uniq_key VARCHAR(128) NOT NULL DEFAULT '', payload_hash VARCHAR(64) NOT NULL,
    instance_id VARCHAR(128) NOT NULL, claimed_at_ms BIGINT NOT NULL,
    UNIQUE (biz_id, biz_type, consumer_group, execute_time));
CREATE INDEX ON claim_by_biz_id (claimed_at_ms);
-- The floor: the claim key is the primary key and nothing else is indexed.
CREATE TABLE claim_pk (consumer_group VARCHAR(128) NOT NULL, biz_type VARCHAR(64) NOT NULL,
    biz_id VARCHAR(128) NOT NULL, execute_time BIGINT NOT NULL DEFAULT 0, msg_id VARCHAR(128) NOT NULL,
    uniq_key VARCHAR(128) NOT NULL DEFAULT '', payload_hash VARCHAR(64) NOT NULL,
    instance_id VARCHAR(128) NOT NULL, claimed_at_ms BIGINT NOT NULL,
    PRIMARY KEY (biz_id, biz_type, consumer_group, execute_time));
-- The claim row as the processed delivery's log entry: the delivery's columns on the claim,
-- findable by bizId (the unique key), msgId and UNIQ_KEY.
CREATE TABLE claim_wide (id BIGSERIAL PRIMARY KEY, consumer_group VARCHAR(128) NOT NULL,
    biz_type VARCHAR(64) NOT NULL, biz_id VARCHAR(128) NOT NULL, execute_time BIGINT NOT NULL DEFAULT 0,
    msg_id VARCHAR(128) NOT NULL, uniq_key VARCHAR(128) NOT NULL DEFAULT '', payload_hash VARCHAR(64) NOT NULL,
    instance_id VARCHAR(128) NOT NULL, claimed_at_ms BIGINT NOT NULL, topic VARCHAR(255) NOT NULL,
    tags VARCHAR(255) NOT NULL DEFAULT '', queue_id INTEGER NOT NULL, queue_offset BIGINT NOT NULL,
    reconsume_times INTEGER NOT NULL, latency_us BIGINT NOT NULL,
    UNIQUE (biz_id, biz_type, consumer_group, execute_time));
CREATE INDEX ON claim_wide (msg_id);
CREATE INDEX ON claim_wide (uniq_key);
CREATE INDEX ON claim_wide (claimed_at_ms);
-- Today's delivery log (after 0009).
CREATE TABLE log_today (id BIGSERIAL PRIMARY KEY, logged_at_ms BIGINT NOT NULL, instance_id VARCHAR(128) NOT NULL,
    consumer_group VARCHAR(128) NOT NULL, msg_id VARCHAR(128) NOT NULL, uniq_key VARCHAR(128) NOT NULL DEFAULT '',
    topic VARCHAR(255) NOT NULL, tags VARCHAR(255) NOT NULL DEFAULT '', queue_id INTEGER NOT NULL,
    queue_offset BIGINT NOT NULL, reconsume_times INTEGER NOT NULL, biz_type VARCHAR(64) NOT NULL,
    biz_id VARCHAR(128) NOT NULL, execute_time BIGINT NOT NULL DEFAULT 0, outcome VARCHAR(16) NOT NULL,
    cause VARCHAR(32), layer VARCHAR(16), payload_match SMALLINT, payload_hash VARCHAR(64), error TEXT,
    latency_us BIGINT NOT NULL, payload BYTEA);
CREATE INDEX ON log_today (biz_id, logged_at_ms);
CREATE INDEX ON log_today (msg_id);
CREATE INDEX ON log_today (uniq_key);
CREATE INDEX ON log_today (logged_at_ms);
CREATE INDEX ON log_today (outcome, logged_at_ms) WHERE outcome <> 'processed';
CREATE INDEX ON log_today (logged_at_ms) WHERE payload_match = 0;
