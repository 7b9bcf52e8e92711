//! `stock.deduct`: a plain decrement, not idempotent by itself. Only the gate keeps a
//! redelivered deduction from taking stock twice; the ledger row per applied deduction (no
//! unique key on purpose) makes any double application visible to the reconciler.
//!
//! Its batch form takes a group's deductions in three statements, however many there are: the
//! levels of their SKUs, read and locked in SKU order; one update that takes each SKU's sum;
//! one multi-row ledger insert. Whether there is enough stock is still decided per delivery,
//! in the order the deductions would have run alone: each one is held against what the ones
//! before it in the group left, and one that finds too little is refused with nothing written,
//! exactly as it would have been alone.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use idemgate::handler::{Answers, Effect, Fact, Handler, HandlerError, Work};
use idemgate::insert_if_absent;
use idemgate::reconcile::check::{AnomalyKind, Check, CheckSql};
use idemgate::store::{
    Backend, Conn, InsertIfAbsent, Pad, Sql, Store, bind_rows, filtered_insert, padded, placeholders, query,
    query_built,
};

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

pub struct StockDeduct;

/// The deduction a delivery asks for; a body of the wrong shape or a quantity that is not
/// positive makes it invalid.
fn deduction(work: &Work<'_>) -> Result<DeductStock, HandlerError> {
    let deduct: DeductStock = super::parse_body(&work.delivery.body)?;
    if deduct.quantity <= 0 {
        return Err(HandlerError::Invalid(format!("quantity {} is not positive", deduct.quantity)));
    }
    Ok(deduct)
}

/// The refusal of a deduction that finds `level` (`None`: no such SKU) below what it asks.
fn refusal(deduct: &DeductStock, level: Option<i64>) -> HandlerError {
    HandlerError::Permanent(match level {
        None => format!("unknown sku {}", deduct.sku),
        Some(level) => {
            format!("insufficient stock of {}: {level} left, {} asked", deduct.sku, deduct.quantity)
        }
    })
}

#[async_trait]
impl Handler for StockDeduct {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let deduct = deduction(work)?;
        let done = query(work.backend, &DEDUCT)
            .bind(deduct.quantity)
            .bind(deduct.sku.as_str())
            .bind(deduct.quantity)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 0 {
            let level =
                query(work.backend, &LEVEL).bind(deduct.sku.as_str()).fetch_optional(&mut *conn).await?;
            return Err(refusal(&deduct, level.map(|row| row.try_get::<i64, _>(0)).transpose()?));
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

    /// The group's deductions in three statements (see the module's comment). The gate hands
    /// them over in lock order (by SKU, then as they came), which is also the order in which
    /// each is held against the stock its SKU has left.
    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        let Some(first) = works.first() else { return Ok(Vec::new()) };
        let backend = first.backend;
        let mut answers: Vec<Option<Result<Effect, HandlerError>>> = (0..works.len()).map(|_| None).collect();
        let mut asked = Vec::with_capacity(works.len());
        for (n, work) in works.iter().enumerate() {
            match deduction(work) {
                Ok(deduct) => asked.push((n, deduct)),
                Err(why) => answers[n] = Some(Err(why)),
            }
        }
        let skus: Vec<&str> = asked
            .iter()
            .map(|(_, d)| d.sku.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut left = lock_levels(conn, backend, &skus).await?;
        let mut taken: BTreeMap<&str, i64> = BTreeMap::new();
        let mut applied = Vec::with_capacity(asked.len());
        for (n, deduct) in &asked {
            match left.get_mut(deduct.sku.as_str()) {
                Some(level) if *level >= deduct.quantity => {
                    *level -= deduct.quantity;
                    *taken.entry(deduct.sku.as_str()).or_default() += deduct.quantity;
                    applied.push((*n, deduct));
                    answers[*n] = Some(Ok(Effect::Applied));
                }
                level => answers[*n] = Some(Err(refusal(deduct, level.map(|l| *l)))),
            }
        }
        take_sums(conn, backend, &taken).await?;
        if !applied.is_empty() {
            // Padded to a few fixed counts of rows with rows a filter drops.
            let sql = filtered_insert(
                "shop_stock_ledger",
                &["deduction_id", "sku", "quantity", "applied_at_ms"],
                applied.len(),
            );
            let last = applied[applied.len() - 1];
            let q = bind_rows(query_built(backend, sql), &applied, &last, Pad::Filter, |q, (n, deduct)| {
                let work = &works[*n];
                q.bind(work.key.biz_id.as_str())
                    .bind(deduct.sku.as_str())
                    .bind(deduct.quantity)
                    .bind(work.now_ms)
            });
            q.execute(&mut *conn).await?;
        }
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(HandlerError::Retryable("not decided".to_owned()))))
            .collect())
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
    async fn prepare(&self, store: &Store) -> Result<(), String> {
        super::prepare(store).await
    }

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
                    idemgate::clock::format_ms(r.try_get(2)?)
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

/// The stock levels of `skus` (sorted, distinct), read and locked in SKU order, so that two
/// groups in flight lock the rows they share in one order and never deadlock each other. A
/// locking read on PostgreSQL and MySQL/MariaDB; SQLite's writer already holds the database.
/// The list is padded to a few fixed lengths (the last SKU repeated), so that the statement
/// cache keeps one text per length, not one per count of SKUs.
async fn lock_levels(
    conn: &mut Conn,
    backend: Backend,
    skus: &[&str],
) -> Result<HashMap<String, i64>, sqlx::Error> {
    let Some(last) = skus.last() else { return Ok(HashMap::new()) };
    let n = padded(skus.len());
    let lock = match backend {
        Backend::Postgres | Backend::MySql => " FOR UPDATE",
        Backend::Sqlite => "",
    };
    let sql =
        format!("SELECT sku, quantity FROM shop_stock WHERE sku IN ({}) ORDER BY sku{lock}", placeholders(n));
    let q = bind_rows(query_built(backend, sql), skus, last, Pad::Repeat, |q, sku| q.bind(*sku));
    let mut levels = HashMap::with_capacity(skus.len());
    for row in q.fetch_all(&mut *conn).await? {
        levels.insert(row.try_get(0)?, row.try_get(1)?);
    }
    Ok(levels)
}

/// Takes each SKU's sum in one update (`CASE sku WHEN … THEN …`), padded like
/// [`lock_levels`]. The rows are locked and their levels were checked, so every SKU's row must
/// change: any other count is an error, and the gate runs the group one delivery at a time.
async fn take_sums(
    conn: &mut Conn,
    backend: Backend,
    taken: &BTreeMap<&str, i64>,
) -> Result<(), sqlx::Error> {
    let Some((last_sku, last_sum)) = taken.iter().next_back() else { return Ok(()) };
    let n = padded(taken.len());
    let sql = format!(
        "UPDATE shop_stock SET quantity = quantity - CASE sku {} ELSE 0 END WHERE sku IN ({})",
        vec!["WHEN ? THEN ?"; n].join(" "),
        placeholders(n)
    );
    let sums: Vec<(&str, i64)> = taken.iter().map(|(sku, sum)| (*sku, *sum)).collect();
    let last = (*last_sku, *last_sum);
    let q = bind_rows(query_built(backend, sql), &sums, &last, Pad::Repeat, |q, (sku, sum)| {
        q.bind(*sku).bind(*sum)
    });
    let q = bind_rows(q, &sums, &last, Pad::Repeat, |q, (sku, _)| q.bind(*sku));
    let changed = q.execute(&mut *conn).await?.rows_affected();
    if changed != taken.len() as u64 {
        return Err(sqlx::Error::Protocol(format!(
            "the stock update changed {changed} rows for {} SKUs",
            taken.len()
        )));
    }
    Ok(())
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
pub async fn ensure_stock(store: &Store, sku: &str, quantity: i64) -> Result<(), sqlx::Error> {
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
