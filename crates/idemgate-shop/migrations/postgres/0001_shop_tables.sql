-- The example shop's tables (orders, payments, stock), created by the demo, the benchmarks and
-- the tests, never by `idemgate serve`. Each statement may find its table or index made already:
-- by the service's version 2, 4 and 8 before these were the example's own.
CREATE TABLE IF NOT EXISTS shop_order (
    order_no      VARCHAR(64) PRIMARY KEY,
    user_id       VARCHAR(64) NOT NULL,
    sku           VARCHAR(64) NOT NULL,
    quantity      BIGINT      NOT NULL,
    amount_cents  BIGINT      NOT NULL,
    status        VARCHAR(16) NOT NULL,
    created_at_ms BIGINT      NOT NULL,
    payment_no    VARCHAR(64),
    paid_at_ms    BIGINT
);
-- The trace page of a payment.confirm key shows the order that payment paid.
CREATE INDEX IF NOT EXISTS shop_order_payment_no ON shop_order (payment_no);

CREATE TABLE IF NOT EXISTS shop_stock (
    sku      VARCHAR(64) PRIMARY KEY,
    quantity BIGINT      NOT NULL
);

-- No unique key on purpose: a deduction applied twice shows up as two rows.
CREATE TABLE IF NOT EXISTS shop_stock_ledger (
    id            BIGSERIAL    PRIMARY KEY,
    deduction_id  VARCHAR(128) NOT NULL,
    sku           VARCHAR(64)  NOT NULL,
    quantity      BIGINT       NOT NULL,
    applied_at_ms BIGINT       NOT NULL
);
CREATE INDEX IF NOT EXISTS shop_stock_ledger_deduction ON shop_stock_ledger (deduction_id);
-- The reconciler's stock-ledger check reads the ledger rows of its window; this index is how,
-- instead of a scan of the whole ledger, which only grows.
CREATE INDEX IF NOT EXISTS shop_stock_ledger_applied_at ON shop_stock_ledger (applied_at_ms);
