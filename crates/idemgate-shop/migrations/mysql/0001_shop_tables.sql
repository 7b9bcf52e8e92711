-- The example shop's tables (orders, payments, stock), created by the demo, the benchmarks and
-- the tests, never by `idemgate serve`. Each statement may find its table or index made already:
-- by the service's version 2, 4 and 8 before these were the example's own. (MariaDB takes
-- `CREATE INDEX IF NOT EXISTS`; MySQL 8 does not, so the example runs on MariaDB.)
CREATE TABLE IF NOT EXISTS shop_order (
    order_no      VARCHAR(64) NOT NULL PRIMARY KEY,
    user_id       VARCHAR(64) NOT NULL,
    sku           VARCHAR(64) NOT NULL,
    quantity      BIGINT      NOT NULL,
    amount_cents  BIGINT      NOT NULL,
    status        VARCHAR(16) NOT NULL,
    created_at_ms BIGINT      NOT NULL,
    payment_no    VARCHAR(64),
    paid_at_ms    BIGINT
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- The trace page of a payment.confirm key shows the order that payment paid.
CREATE INDEX IF NOT EXISTS shop_order_payment_no ON shop_order (payment_no);

CREATE TABLE IF NOT EXISTS shop_stock (
    sku      VARCHAR(64) NOT NULL PRIMARY KEY,
    quantity BIGINT      NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- No unique key on purpose: a deduction applied twice shows up as two rows.
CREATE TABLE IF NOT EXISTS shop_stock_ledger (
    id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    deduction_id  VARCHAR(128) NOT NULL,
    sku           VARCHAR(64)  NOT NULL,
    quantity      BIGINT       NOT NULL,
    applied_at_ms BIGINT       NOT NULL,
    KEY shop_stock_ledger_deduction (deduction_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- The reconciler's stock-ledger check reads the ledger rows of its window; this index is how,
-- instead of a scan of the whole ledger, which only grows.
CREATE INDEX IF NOT EXISTS shop_stock_ledger_applied_at ON shop_stock_ledger (applied_at_ms);
