//! `stock.deduct`: a plain decrement, not idempotent by itself. Only the gate keeps a
//! redelivered deduction from taking stock twice; the ledger row per applied deduction (no
//! unique key on purpose) makes any double application visible to the reconciler.

use std::borrow::Cow;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use crate::handler::{Effect, Fact, Handler, HandlerError, Work};
use crate::insert_if_absent;
use crate::reconcile::check::{AnomalyKind, Check, CheckSql};
use crate::store::{Conn, InsertIfAbsent, Sql, Store, query};

/// The body of a `stock.deduct` message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeductStock {
    pub sku: String,
    pub quantity: i64,
}

static DEDUCT: Sql =
    Sql::new("UPDATE shop_stock SET quantity = quantity - ? WHERE sku = ? AND quantity >= ?");
static LEDGER: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, ?, ?, ?)",
);
static LEVEL: Sql = Sql::new("SELECT quantity FROM shop_stock WHERE sku = ?");
static INSERT_SKU_IF_ABSENT: InsertIfAbsent = insert_if_absent!(
    "INSERT INTO shop_stock (sku, quantity) VALUES (?, ?)",
    conflict = "(sku)",
    index = "PRIMARY"
);
static LEDGER_ROWS: Sql = Sql::new(
    "SELECT sku, quantity, applied_at_ms FROM shop_stock_ledger WHERE deduction_id = ? ORDER BY id LIMIT 20",
);
static DELETE_SKU: Sql = Sql::new("DELETE FROM shop_stock WHERE sku = ?");
static INSERT_SKU: Sql = Sql::new("INSERT INTO shop_stock (sku, quantity) VALUES (?, ?)");

pub(crate) struct StockDeduct;

#[async_trait]
impl Handler for StockDeduct {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let deduct: DeductStock = super::parse_body(&work.delivery.body)?;
        if deduct.quantity <= 0 {
            return Err(HandlerError::Invalid(format!("quantity {} is not positive", deduct.quantity)));
        }
        let done = query(work.backend, &DEDUCT)
            .bind(deduct.quantity)
            .bind(deduct.sku.as_str())
            .bind(deduct.quantity)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 0 {
            let level =
                query(work.backend, &LEVEL).bind(deduct.sku.as_str()).fetch_optional(&mut *conn).await?;
            return Err(HandlerError::Permanent(match level {
                None => format!("unknown sku {}", deduct.sku),
                Some(row) => format!(
                    "insufficient stock of {}: {} left, {} asked",
                    deduct.sku,
                    row.try_get::<i64, _>(0)?,
                    deduct.quantity
                ),
            }));
        }
        query(work.backend, &LEDGER)
            .bind(work.key.biz_id.as_str())
            .bind(deduct.sku.as_str())
            .bind(deduct.quantity)
            .bind(work.now_ms)
            .execute(&mut *conn)
            .await?;
        Ok(Effect::Applied)
    }

    fn checks(&self) -> Vec<Check> {
        vec![STOCK_LEDGER_CHECK]
    }

    /// Every deduction of one SKU updates its one stock row.
    fn lock_order(&self, work: &Work<'_>) -> Option<String> {
        super::parse_body::<DeductStock>(&work.delivery.body).ok().map(|d| d.sku)
    }

    /// The ledger rows of this deduction: exactly one when it was applied, none when it was
    /// not; two or more is the double application the gate exists to prevent.
    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        let rows = store.query(&LEDGER_ROWS).bind(biz_id).fetch_all(store.pool()).await?;
        let mut facts = Vec::with_capacity(rows.len() + 1);
        for r in &rows {
            facts.push(Fact::new(
                "ledger row",
                format!(
                    "{} × {} at {}",
                    r.try_get::<i64, _>(1)?,
                    r.try_get::<String, _>(0)?,
                    crate::clock::format_ms(r.try_get(2)?)
                ),
            ));
        }
        facts.insert(
            0,
            match rows.len() {
                0 => Fact::new("stock ledger", "not applied: no ledger row"),
                1 => Fact::new("stock ledger", "applied once"),
                n => {
                    Fact::alarm("stock ledger", format!("APPLIED {n} TIMES: one deduction, {n} ledger rows"))
                }
            },
        );
        Ok(facts)
    }
}

/// Sets the stock level of `sku` (for the demo, benchmarks and tests).
pub async fn seed_stock(store: &Store, sku: &str, quantity: i64) -> Result<(), sqlx::Error> {
    let mut tx = store.begin().await?;
    store.query(&DELETE_SKU).bind(sku).execute(&mut *tx).await?;
    store.query(&INSERT_SKU).bind(sku).bind(quantity).execute(&mut *tx).await?;
    tx.commit().await
}

/// Creates the stock row of `sku` with `quantity` unless it exists (a running shop keeps its
/// levels across restarts).
pub(crate) async fn ensure_stock(store: &Store, sku: &str, quantity: i64) -> Result<(), sqlx::Error> {
    let mut conn = store.pool().acquire().await?;
    INSERT_SKU_IF_ABSENT.execute(&mut conn, store.backend(), |q| q.bind(sku).bind(quantity)).await?;
    Ok(())
}

static STOCK_LEDGER_TWICE: Sql = Sql::new(
    "SELECT deduction_id, COUNT(*) FROM shop_stock_ledger WHERE applied_at_ms >= ? AND applied_at_ms < ? \
     GROUP BY deduction_id HAVING COUNT(*) > 1",
);

/// The built-in example's invariant: one ledger row per stock deduction.
pub const STOCK_LEDGER_CHECK: Check = Check {
    name: Cow::Borrowed("stock ledger: one row per deduction"),
    kind: AnomalyKind::DoubleApplied,
    biz_type: Cow::Borrowed(super::STOCK_DEDUCT),
    sql: CheckSql::Window(&STOCK_LEDGER_TWICE),
    describe: |n| format!("{n} stock ledger rows for one deduction: the stock was taken {n} times"),
};
