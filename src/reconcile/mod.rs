//! The reconciler: did every business key take effect exactly once, and what is stuck?
//!
//! [`reconcile_once`] scans a time window of the delivery log and the dedup table of one
//! consumer group and reports anomalies by kind ([`AnomalyKind`]): keys that were lost, stuck,
//! applied twice, orphaned, collided or came back after archiving, plus whatever the registered
//! invariant checks ([`Check`]) find in business tables. Each kind is one bounded statement: the
//! window limits what it reads, `max_per_kind` what it returns, and the grouping happens in the
//! database, so the process holds only the anomalies. Each reads the log (or the claims) once,
//! by its window, and every other table by key, so that a run costs the same whatever the
//! planner's statistics say ([`statements`] lists them with their values; the tests read their
//! plans). The run and its anomalies are stored ([`runs`]) for the UI, `/metrics` and scripts.
//!
//! This module reads the gate's tables and writes only its own (`reconcile_run`,
//! `reconcile_anomaly`). It must not change a claim or a log row.

pub mod check;
pub mod runs;
pub(crate) mod schedule;
pub mod settings;

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use sqlx::Row;

use crate::layout::Layout;
use crate::store::{Arg, Bound, Sql, Store};

pub(crate) use check::Anomaly;
// What a handler's `checks` answer: an embedder writes them with these.
pub use check::{AnomalyKind, Check, CheckSql, ReconcileOptions, WindowEnd};
pub use schedule::ReconcileScheduler;
pub use settings::ReconcileSettings;

/// What a run found.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileReport {
    pub run_id: i64,
    pub consumer_group: String,
    pub since_ms: i64,
    pub until_ms: i64,
    pub anomalies: Vec<Anomaly>,
    /// Per kind, how many were found (every kind present, zero included).
    pub counts: BTreeMap<AnomalyKind, usize>,
    /// Kinds that hit `max_per_kind`: there may be more.
    pub cut: Vec<AnomalyKind>,
    pub elapsed_ms: u64,
}

impl ReconcileReport {
    pub fn is_clean(&self) -> bool {
        self.anomalies.is_empty()
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("reconcile: {0}")]
    Database(#[from] sqlx::Error),
}

// Every detector returns (biz_type, biz_id, execute_time, first_ms, last_ms, count) and takes
// (group, since, until, biz_type, biz_type, [extra], limit). `? = ''` switches the biz_type
// filter off.
//
// Each statement reads the log (or the claims) once, by its window, and looks every other
// table up per row by the row's key, in a correlated scalar subquery whose only indexable
// conditions are the key's columns. That holds whatever the planner's statistics say. A
// `NOT EXISTS` would not: PostgreSQL turns it into an anti join whose shape it picks from its
// statistics, and with none or stale ones (a fresh database, a burst, an archive run) it picks
// a nested loop that walks the group's whole claim range for every log row, quadratic in the
// window; MariaDB may materialize the whole archive or log instead. A scalar subquery is never
// turned into a join: it stays one index probe per row on every backend. The claim tables hold
// a key at most once, so the claim's id answers; the archive may hold a key twice, so it is
// counted; the log is counted by outcome among the key's rows, which its bizId index finds.
macro_rules! same_key {
    ($inner:literal, $outer:literal) => {
        concat!(
            $inner,
            ".biz_id = ",
            $outer,
            ".biz_id AND ",
            $inner,
            ".biz_type = ",
            $outer,
            ".biz_type AND ",
            $inner,
            ".consumer_group = ",
            $outer,
            ".consumer_group AND ",
            $inner,
            ".execute_time = ",
            $outer,
            ".execute_time"
        )
    };
}

/// The row's key has no live claim.
macro_rules! unclaimed {
    ($alias:literal) => {
        concat!("(SELECT r.id FROM idempotent_record_all r WHERE ", same_key!("r", $alias), ") IS NULL")
    };
}

/// How many archived claims the row's key has, with `$and` as a further condition.
macro_rules! archived {
    ($alias:literal, $and:literal) => {
        concat!("(SELECT COUNT(*) FROM idempotent_record_archive r WHERE ", same_key!("r", $alias), $and, ")")
    };
}

macro_rules! detector {
    ($where:literal) => {
        concat!(
            "SELECT biz_type, biz_id, execute_time, MIN(logged_at_ms), MAX(logged_at_ms), COUNT(*) \
             FROM delivery_log d WHERE consumer_group = ? AND logged_at_ms >= ? AND logged_at_ms < ? \
             AND (? = '' OR biz_type = ?) AND ",
            $where
        )
    };
}

static DOUBLE_APPLIED: Sql = Sql::new(concat!(
    detector!("outcome = 'processed'"),
    " GROUP BY biz_type, biz_id, execute_time HAVING COUNT(*) > 1 LIMIT ?"
));
static LOST: Sql = Sql::new(concat!(
    detector!("outcome = 'dead_lettered' AND biz_id <> ''"),
    " AND ",
    unclaimed!("d"),
    " AND ",
    archived!("d", ""),
    " = 0 GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));
static STUCK: Sql = Sql::new(concat!(
    detector!("outcome = 'failed' AND biz_id <> ''"),
    " AND ",
    unclaimed!("d"),
    " AND ",
    archived!("d", ""),
    " = 0 AND (SELECT COUNT(CASE WHEN x.outcome = 'dead_lettered' THEN 1 END) FROM delivery_log x WHERE ",
    same_key!("x", "d"),
    ") = 0 GROUP BY biz_type, biz_id, execute_time HAVING MIN(logged_at_ms) < ? LIMIT ?"
));
static PROCESSED_WITHOUT_CLAIM: Sql = Sql::new(concat!(
    detector!("outcome = 'processed'"),
    " AND ",
    unclaimed!("d"),
    " AND ",
    archived!("d", ""),
    " = 0 GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));
// The claims are read by their window (claimed_at_ms). The group is compared through
// COALESCE, a no-op on the NOT NULL column, so that no planner reads them by the unique key's
// first column instead: that range is the group's whole history, not the window.
static CLAIM_WITHOUT_DELIVERY: Sql = Sql::new(concat!(
    "SELECT biz_type, biz_id, execute_time, claimed_at_ms, claimed_at_ms, 1 FROM idempotent_record_all c \
     WHERE COALESCE(consumer_group, '') = ? AND claimed_at_ms >= ? AND claimed_at_ms < ? \
     AND (? = '' OR biz_type = ?) \
     AND (SELECT COUNT(CASE WHEN d.outcome IN ('processed', 'duplicate') THEN 1 END) FROM delivery_log d \
     WHERE d.msg_id = c.msg_id AND ",
    same_key!("d", "c"),
    ") = 0 LIMIT ?"
));
static COLLISIONS: Sql = Sql::new(concat!(
    detector!("outcome = 'duplicate' AND payload_match = 0"),
    " GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));
static LATE: Sql = Sql::new(concat!(
    detector!("(layer = 'late_duplicate' OR (outcome = 'processed' AND "),
    archived!("d", " AND r.archived_at_ms <= d.logged_at_ms"),
    " > 0)) GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));

/// One detecting statement with its values, and how a count reads.
struct Detector {
    kind: AnomalyKind,
    statement: Bound,
    describe: fn(i64) -> String,
}

/// The detectors of a run over `o` at `now_ms`, on `layout`'s claim tables.
fn detectors(o: &ReconcileOptions, layout: Layout, now_ms: i64) -> Vec<Detector> {
    let biz_type = o.biz_type.clone().unwrap_or_default();
    let limit = i64::try_from(o.max_per_kind + 1).unwrap_or(i64::MAX);
    let orphan_since = o.since_ms.max(now_ms - o.log_retention_ms);
    let d = |kind, name, sql, since, extra: Option<i64>, describe| {
        let mut args = vec![
            Arg::Text(o.consumer_group.clone()),
            Arg::Int(since),
            Arg::Int(o.until_ms),
            Arg::Text(biz_type.clone()),
            Arg::Text(biz_type.clone()),
        ];
        args.extend(extra.map(Arg::Int));
        args.push(Arg::Int(limit));
        Detector { kind, statement: Bound::new(name, sql, args), describe }
    };
    let on_claims = |sql| crate::layout::correlated(sql, layout);
    let mut detectors = vec![
        d(AnomalyKind::DoubleApplied, "double applied", &DOUBLE_APPLIED, o.since_ms, None, |n| {
            format!("{n} processed deliveries for one claim key: the effect ran {n} times")
        }),
        d(AnomalyKind::Lost, "lost", on_claims(&LOST), o.since_ms, None, |n| {
            format!("dead-lettered ({n}×) and never applied; no claim, nothing pending")
        }),
        d(AnomalyKind::Stuck, "stuck", on_claims(&STUCK), o.since_ms, Some(now_ms - o.stuck_after_ms), |n| {
            format!("{n} failed attempts and still not applied")
        }),
        d(
            AnomalyKind::Orphan,
            "processed without claim",
            on_claims(&PROCESSED_WITHOUT_CLAIM),
            o.since_ms,
            None,
            |n| format!("{n} processed deliveries but no claim, live or archived: the claim was removed"),
        ),
    ];
    // Driven by the claims of the window: one statement per claim table.
    detectors.extend(crate::layout::each_table(&CLAIM_WITHOUT_DELIVERY, layout).into_iter().map(|sql| {
        d(AnomalyKind::Orphan, "claim without delivery", sql, orphan_since, None, |_| {
            "a claim with no processed delivery in the log: it was written around the gate".to_owned()
        })
    }));
    detectors.extend([
        d(AnomalyKind::KeyCollision, "key collision", &COLLISIONS, o.since_ms, None, |n| {
            format!("{n} duplicates with a different body than the claim's")
        }),
        d(AnomalyKind::LateDuplicate, "late duplicate", &LATE, o.since_ms, None, |n| {
            format!("{n} deliveries after the claim was archived")
        }),
    ]);
    detectors
}

/// `check` over `o`'s window, when it is written in code; a configured check is run by
/// [`configured_check_query`].
fn check_statement(check: &Check, o: &ReconcileOptions) -> Option<Bound> {
    match &check.sql {
        CheckSql::Window(sql) => {
            Some(Bound::new(static_name(check), sql, vec![Arg::Int(o.since_ms), Arg::Int(o.until_ms)]))
        }
        CheckSql::Written { .. } => None,
    }
}

/// The name of a check written in code, which is static.
fn static_name(check: &Check) -> &'static str {
    match &check.name {
        std::borrow::Cow::Borrowed(name) => name,
        std::borrow::Cow::Owned(_) => "invariant check",
    }
}

/// The query of `check` over `o`'s window, whatever its kind.
fn check_query(store: &Store, check: &Check, o: &ReconcileOptions) -> crate::store::AnyQuery {
    match &check.sql {
        CheckSql::Window(sql) => store.query(sql).bind(o.since_ms).bind(o.until_ms),
        CheckSql::Written { sql, binds } => {
            binds.iter().fold(sql.query(store.backend()), |q, end| match end {
                WindowEnd::Since => q.bind(o.since_ms),
                WindowEnd::Until => q.bind(o.until_ms),
            })
        }
    }
}

/// A check's row: the bizId (text, or an integer shown as text) and the occurrences, 1 where
/// the statement gives no second column.
fn check_row(r: &sqlx::any::AnyRow) -> Result<(String, i64), sqlx::Error> {
    let biz_id = match r.try_get::<String, _>(0) {
        Ok(text) => text,
        Err(_) => match r.try_get::<i32, _>(0) {
            Ok(n) => n.to_string(),
            Err(_) => r.try_get::<i64, _>(0)?.to_string(),
        },
    };
    let count = match r.columns().len() {
        1 => 1,
        _ => r.try_get::<i64, _>(1).or_else(|_| r.try_get::<i32, _>(1).map(i64::from))?,
    };
    Ok((biz_id, count))
}

/// Every statement a run over `o` at `now_ms` makes, in order, with its values: the
/// detectors' and those of the `checks` written in code that apply. For reading their plans
/// ([`crate::store::plan`]); the run itself makes exactly these.
pub async fn statements(
    store: &Store,
    o: &ReconcileOptions,
    checks: &[Check],
    now_ms: i64,
) -> Result<Vec<Bound>, sqlx::Error> {
    let layout = crate::layout::current(store).await?;
    let mut all: Vec<Bound> = detectors(o, layout, now_ms).into_iter().map(|d| d.statement).collect();
    all.extend(applicable(checks, o).filter_map(|c| check_statement(c, o)));
    Ok(all)
}

fn applicable<'a>(checks: &'a [Check], o: &'a ReconcileOptions) -> impl Iterator<Item = &'a Check> {
    checks.iter().filter(|c| o.biz_type.as_deref().is_none_or(|t| t == c.biz_type))
}

/// Runs every detector and check over the window, stores the run and its anomalies, and
/// reports them. `now_ms` is the clock for `stuck_after` (tests pass their own).
pub async fn reconcile_once(
    store: &Store,
    options: &ReconcileOptions,
    checks: &[Check],
    now_ms: i64,
) -> Result<ReconcileReport, ReconcileError> {
    let started = Instant::now();
    let run_id = runs::start(store, options, now_ms).await?;
    match find(store, options, checks, now_ms).await {
        Ok((anomalies, cut)) => {
            runs::finish(store, run_id, &anomalies, crate::clock::now_ms()).await?;
            let mut counts: BTreeMap<AnomalyKind, usize> = AnomalyKind::ALL.iter().map(|k| (*k, 0)).collect();
            for a in &anomalies {
                *counts.entry(a.kind).or_default() += 1;
            }
            Ok(ReconcileReport {
                run_id,
                consumer_group: options.consumer_group.clone(),
                since_ms: options.since_ms,
                until_ms: options.until_ms,
                anomalies,
                counts,
                cut,
                elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            })
        }
        Err(e) => {
            let _ = runs::fail(store, run_id, &e.to_string(), crate::clock::now_ms()).await;
            Err(e.into())
        }
    }
}

async fn find(
    store: &Store,
    o: &ReconcileOptions,
    checks: &[Check],
    now_ms: i64,
) -> Result<(Vec<Anomaly>, Vec<AnomalyKind>), sqlx::Error> {
    let mut found = Vec::new();
    let mut cut = Vec::new();
    let layout = crate::layout::current(store).await?;
    for Detector { kind, statement, describe } in detectors(o, layout, now_ms) {
        let rows = statement.query(store).fetch_all(store.pool()).await?;
        if rows.len() > o.max_per_kind {
            cut.push(kind);
        }
        for r in rows.iter().take(o.max_per_kind) {
            let count: i64 = r.try_get(5)?;
            found.push(Anomaly {
                kind,
                consumer_group: o.consumer_group.clone(),
                biz_type: r.try_get(0)?,
                biz_id: r.try_get(1)?,
                execute_time: r.try_get(2)?,
                first_seen_ms: r.try_get(3)?,
                last_seen_ms: r.try_get(4)?,
                detail: describe(count),
            });
        }
    }
    for check in applicable(checks, o) {
        let rows = check_query(store, check, o).fetch_all(store.pool()).await?;
        if rows.len() > o.max_per_kind {
            cut.push(check.kind);
        }
        for r in rows.iter().take(o.max_per_kind) {
            found.push(Anomaly {
                kind: check.kind,
                consumer_group: o.consumer_group.clone(),
                biz_type: check.biz_type.clone().into_owned(),
                biz_id: check_row(r)?.0,
                execute_time: 0,
                first_seen_ms: None,
                last_seen_ms: None,
                detail: format!("{} ({})", (check.describe)(check_row(r)?.1), check.name),
            });
        }
    }
    cut.sort();
    cut.dedup();
    Ok((merge(found), cut))
}

/// One anomaly per kind and key: two detectors (the log and a ledger check, say) that find the
/// same thing are one finding with both details.
fn merge(found: Vec<Anomaly>) -> Vec<Anomaly> {
    let mut merged: BTreeMap<(AnomalyKind, String, String, String, i64), Anomaly> = BTreeMap::new();
    for a in found {
        let key = (a.kind, a.consumer_group.clone(), a.biz_type.clone(), a.biz_id.clone(), a.execute_time);
        match merged.get_mut(&key) {
            None => {
                merged.insert(key, a);
            }
            Some(m) => {
                m.detail = format!("{}; {}", m.detail, a.detail);
                m.first_seen_ms = [m.first_seen_ms, a.first_seen_ms].into_iter().flatten().min();
                m.last_seen_ms = [m.last_seen_ms, a.last_seen_ms].into_iter().flatten().max();
            }
        }
    }
    merged.into_values().collect()
}

/// The report as text, for the command line.
pub fn render_text(r: &ReconcileReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "reconcile run {} of group {}: {} to {} ({} ms)",
        r.run_id,
        r.consumer_group,
        crate::clock::format_ms(r.since_ms),
        crate::clock::format_ms(r.until_ms),
        r.elapsed_ms
    );
    let counts: Vec<String> = r.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(out, "{}", counts.join(" · "));
    for a in &r.anomalies {
        let _ = writeln!(
            out,
            "  {:<14} {} {:?}{}  {}",
            a.kind,
            a.biz_type,
            a.biz_id,
            if a.execute_time == 0 { String::new() } else { format!(" @{}", a.execute_time) },
            a.detail
        );
    }
    for k in &r.cut {
        let _ = writeln!(out, "  … more {k} anomalies than listed");
    }
    if r.is_clean() {
        let _ = writeln!(out, "no anomalies");
    }
    out
}
