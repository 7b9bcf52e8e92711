-- The built-in example business (orders, payments, stock) used by `idemgate demo` and the tests.
-- It is the seeds' e-commerce scenario; a deployment with its own handlers leaves these empty.
CREATE TABLE shop_order (
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

CREATE TABLE shop_stock (
    sku      VARCHAR(64) PRIMARY KEY,
    quantity BIGINT      NOT NULL
);

-- No unique key on purpose: a deduction applied twice shows up as two rows.
CREATE TABLE shop_stock_ledger (
    id            INTEGER      PRIMARY KEY AUTOINCREMENT,
    deduction_id  VARCHAR(128) NOT NULL,
    sku           VARCHAR(64)  NOT NULL,
    quantity      BIGINT       NOT NULL,
    applied_at_ms BIGINT       NOT NULL
);
CREATE INDEX shop_stock_ledger_deduction ON shop_stock_ledger (deduction_id);
