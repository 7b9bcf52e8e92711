//! `idemgate-bench driver`: what the group path's multi-row statements cost on PostgreSQL
//! through sqlx's `Any` driver, which idemgate uses for all three backends, against the native
//! PostgreSQL driver, and what fixed statement shapes save.
//!
//! Each mode writes the same groups: a claim-shaped insert that skips taken keys and returns
//! the ones it took, and a log-shaped insert of one row per delivery (the 22 columns of
//! `delivery_log`), in one transaction per group, on one connection. The group sizes follow one
//! seeded sequence from 1 to 64, as a committer's groups do under uneven load. The modes:
//!
//! - **Any, one text per group size**: a `VALUES` list as long as the group, so each size is
//!   its own statement; with the two statements that is up to 128 texts against a statement
//!   cache of 100 per connection;
//! - **Any, padded**: what the gate runs ([`idemgate::store::Pad`]): 7 texts per statement;
//! - **native, padded**: the same texts on `sqlx::PgConnection`;
//! - **native, arrays**: one text per statement, `INSERT … SELECT * FROM UNNEST($1::text[], …)`,
//!   which the `Any` driver cannot bind.
//! - **Any, JSON**: one text and one parameter per statement through the `Any` driver, the rows
//!   as one JSON text unpacked by `json_to_recordset`: what arrays would give without leaving
//!   the `Any` driver.
//!
//! A second table weighs the log row's shape, on the gate's own path (Any, padded): the log with
//! the indexes it had before `0009_lighter_log_indexes` (a primary key and six full indexes),
//! the log as it is (two of those partial, so that a processed row skips them), and no log row
//! at all for a processed delivery, its claim row carrying the delivery's columns instead
//! (topic, queue, offset, reconsume count, latency).

use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection, PgConnection};

use super::{peak_rss_mib, rate, reset_peak_rss};
use idemgate::store::{
    Backend, Pad, StoreOptions, bind_rows, filtered_insert, number_placeholders, padded_values, values_list,
};
use idemgate_testkit::scratch::ScratchDb;

/// Binds one claim's 9 values.
macro_rules! bind_claim {
    ($q:expr, $r:expr) => {
        $q.bind("bench")
            .bind("stock.deduct")
            .bind($r.biz_id.as_str())
            .bind(0_i64)
            .bind($r.msg_id.as_str())
            .bind($r.msg_id.as_str())
            .bind($r.hash.as_str())
            .bind("bench-1")
            .bind($r.now_ms)
    };
}

/// Binds one processed delivery's 22 log values.
macro_rules! bind_log {
    ($q:expr, $r:expr) => {
        $q.bind($r.now_ms)
            .bind("bench-1")
            .bind("bench")
            .bind($r.msg_id.as_str())
            .bind($r.msg_id.as_str())
            .bind("stock")
            .bind("")
            .bind(3_i32)
            .bind(42_i64)
            .bind(0_i32)
            .bind("stock.deduct")
            .bind($r.biz_id.as_str())
            .bind(0_i64)
            .bind("processed")
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(None::<i16>)
            .bind(Some($r.hash.as_str()))
            .bind(None::<String>)
            .bind(700_i64)
            .bind(None::<Vec<u8>>)
            .bind(0_i16)
    };
}

/// What to measure: the flags of `idemgate-bench driver`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Groups each mode writes (at most 100,000), after 200 of warm-up.
    #[arg(long, default_value_t = 5_000)]
    pub groups: usize,
}

const CLAIM_COLUMNS: [&str; 9] = [
    "consumer_group",
    "biz_type",
    "biz_id",
    "execute_time",
    "msg_id",
    "uniq_key",
    "payload_hash",
    "instance_id",
    "claimed_at_ms",
];
const CLAIM_TAIL: &str = " ON CONFLICT (consumer_group, biz_type, biz_id, execute_time) DO NOTHING \
     RETURNING biz_type, biz_id, execute_time";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    AnyPerSize,
    AnyPadded,
    NativePadded,
    NativeArrays,
    AnyJson,
}

impl Mode {
    const ALL: [Self; 5] =
        [Self::AnyPerSize, Self::AnyPadded, Self::NativePadded, Self::NativeArrays, Self::AnyJson];

    fn name(self) -> &'static str {
        match self {
            Self::AnyPerSize => "Any driver, one text per group size",
            Self::AnyPadded => "Any driver, padded to 7 sizes (the gate)",
            Self::NativePadded => "native PostgreSQL driver, padded to 7 sizes",
            Self::NativeArrays => "native PostgreSQL driver, arrays (UNNEST), one text",
            Self::AnyJson => "Any driver, the rows as one JSON parameter (json_to_recordset), one text",
        }
    }
}

/// One delivery of a group: what its claim and its log row hold.
struct Row9 {
    biz_id: String,
    msg_id: String,
    hash: String,
    now_ms: i64,
}

/// `n` deliveries of fresh keys, numbered on from `next`.
fn fresh_rows(prefix: &str, next: &mut usize, n: usize) -> Vec<Row9> {
    (0..n)
        .map(|_| {
            *next += 1;
            Row9 {
                biz_id: format!("{prefix}-{next}"),
                msg_id: format!("MSG{prefix}{next:012}"),
                hash: format!("{next:064x}"),
                now_ms: idemgate::clock::now_ms(),
            }
        })
        .collect()
}

/// One mode's figures.
struct Report {
    mode: Mode,
    groups: usize,
    rows: usize,
    claimed: usize,
    elapsed: Duration,
    peak_rss_mib: f64,
}

/// The seeded group sizes, 1 to 64.
fn sizes(groups: usize) -> Vec<usize> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..groups)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 64) as usize + 1
        })
        .collect()
}

/// `idemgate-bench driver`: prints the setting, measures and prints the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=100_000).contains(&options.groups),
        "--groups must be between 1 and 100000, not {}",
        options.groups
    );
    let sizes = sizes(options.groups);
    println!(
        "bench driver: {} groups of 1 to 64 deliveries ({} rows), a claim insert and a log insert per group, \
         one connection, PostgreSQL, {} cores",
        options.groups,
        sizes.iter().sum::<usize>(),
        super::cores()
    );
    let db = ScratchDb::create(Backend::Postgres, &StoreOptions::default()).await?;
    let mut reports = Vec::new();
    for (round, mode) in Mode::ALL.into_iter().enumerate() {
        let prefix = format!("m{round}");
        reports.push(run(&db.url, mode, &prefix, &sizes).await?);
    }
    for stmt in SHAPE_TABLES {
        sqlx::query(stmt).execute(db.store.pool()).await?;
    }
    let mut shapes = Vec::new();
    for (round, shape) in Shape::ALL.into_iter().enumerate() {
        shapes.push((shape, run_shape(&db.url, shape, &format!("s{round}"), &sizes).await?));
    }
    db.drop_now().await;
    println!("\n{}", table(&reports));
    println!("\n{}", shape_table(&shapes));
    Ok(())
}

/// The tables of the log-shape comparison, each empty at its start: claim and log tables of
/// today's shape, the log with its indexes before `0009_lighter_log_indexes`, and a claim table
/// wide enough to be a processed delivery's log entry.
const SHAPE_TABLES: [&str; 13] = [
    "CREATE TABLE claim_before (LIKE idempotent_record INCLUDING ALL)",
    "CREATE TABLE claim_after (LIKE idempotent_record INCLUDING ALL)",
    "CREATE TABLE log_after (LIKE delivery_log INCLUDING ALL)",
    "CREATE TABLE log_before (LIKE delivery_log INCLUDING DEFAULTS)",
    "ALTER TABLE log_before ADD PRIMARY KEY (id)",
    "CREATE INDEX log_before_biz_id ON log_before (biz_id, logged_at_ms)",
    "CREATE INDEX log_before_msg_id ON log_before (msg_id)",
    "CREATE INDEX log_before_uniq_key ON log_before (uniq_key)",
    "CREATE INDEX log_before_logged_at ON log_before (logged_at_ms)",
    "CREATE INDEX log_before_outcome ON log_before (outcome, logged_at_ms)",
    "CREATE INDEX log_before_collision ON log_before (payload_match, logged_at_ms)",
    "CREATE TABLE claim_wide (LIKE idempotent_record INCLUDING ALL)",
    "ALTER TABLE claim_wide ADD COLUMN topic VARCHAR(255) NOT NULL DEFAULT '', \
     ADD COLUMN queue_id INTEGER NOT NULL DEFAULT 0, ADD COLUMN queue_offset BIGINT NOT NULL DEFAULT 0, \
     ADD COLUMN reconsume_times INTEGER NOT NULL DEFAULT 0, ADD COLUMN latency_us BIGINT NOT NULL DEFAULT 0",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Before,
    Lighter,
    ClaimIsTheLog,
}

impl Shape {
    const ALL: [Self; 3] = [Self::Before, Self::Lighter, Self::ClaimIsTheLog];

    fn name(self) -> &'static str {
        match self {
            Self::Before => "claim + log row, the log's indexes before 0009 (primary key + 6)",
            Self::Lighter => "claim + log row, the log's indexes now (primary key + 5, + 2 partial)",
            Self::ClaimIsTheLog => "claim row with the delivery's columns, no log row",
        }
    }
}

/// One log shape's run: the gate's statements (Any, padded), one transaction per group.
async fn run_shape(url: &str, shape: Shape, prefix: &str, sizes: &[usize]) -> anyhow::Result<Report> {
    let mut conn = AnyConnection::connect(url).await?;
    let (claim_table, log_table) = match shape {
        Shape::Before => ("claim_before", Some("log_before")),
        Shape::Lighter => ("claim_after", Some("log_after")),
        Shape::ClaimIsTheLog => ("claim_wide", None),
    };
    let wide = ["topic", "queue_id", "queue_offset", "reconsume_times", "latency_us"];
    let claim_columns: Vec<&str> = match log_table {
        Some(_) => CLAIM_COLUMNS.to_vec(),
        None => CLAIM_COLUMNS.iter().chain(&wide).copied().collect(),
    };
    let mut next = 0usize;
    let mut one = async |n: usize| -> anyhow::Result<usize> {
        let rows = fresh_rows(prefix, &mut next, n);
        let last = &rows[n - 1];
        let mut tx = conn.begin().await?;
        let sql = format!(
            "INSERT INTO {claim_table} ({}) VALUES {}{CLAIM_TAIL}",
            claim_columns.join(", "),
            padded_values(claim_columns.len(), n)
        );
        let q = bind_rows(
            idemgate::store::query_built(Backend::Postgres, sql),
            &rows,
            last,
            Pad::Repeat,
            |q, r| {
                let q = bind_claim!(q, r);
                if log_table.is_some() {
                    q
                } else {
                    q.bind("stock").bind(3_i32).bind(42_i64).bind(0_i32).bind(700_i64)
                }
            },
        );
        let claimed = q.fetch_all(&mut *tx).await?.len();
        if let Some(log) = log_table {
            let q = idemgate::store::query_built(Backend::Postgres, filtered_insert(log, log_columns(), n));
            bind_rows(q, &rows, last, Pad::Filter, |q, r| bind_log!(q, r)).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(claimed)
    };
    for n in self::sizes(200) {
        one(n).await?;
    }
    reset_peak_rss();
    let started = Instant::now();
    let mut claimed = 0;
    for &n in sizes {
        claimed += one(n).await?;
    }
    let elapsed = started.elapsed();
    let rows = sizes.iter().sum();
    anyhow::ensure!(claimed == rows, "{}: {claimed} claims for {rows} fresh keys", shape.name());
    Ok(Report {
        mode: Mode::AnyPadded,
        groups: sizes.len(),
        rows,
        claimed,
        elapsed,
        peak_rss_mib: peak_rss_mib(),
    })
}

fn shape_table(shapes: &[(Shape, Report)]) -> String {
    let base = shapes.first().map_or(1.0, |(_, r)| rate(r.rows, r.elapsed));
    let mut out = String::from(
        "| statements of a processed delivery | rows/s | × before | µs per row | peak RSS MiB |\n\
         |---|---|---|---|---|\n",
    );
    for (shape, r) in shapes {
        let per_s = rate(r.rows, r.elapsed);
        out += &format!(
            "| {} | {:.0} | {:.2} | {:.1} | {:.0} |\n",
            shape.name(),
            per_s,
            per_s / base,
            r.elapsed.as_secs_f64() * 1e6 / r.rows as f64,
            r.peak_rss_mib
        );
    }
    out
}

async fn run(url: &str, mode: Mode, prefix: &str, sizes: &[usize]) -> anyhow::Result<Report> {
    let warm = self::sizes(200);
    let mut any = match mode {
        Mode::AnyPerSize | Mode::AnyPadded | Mode::AnyJson => Some(AnyConnection::connect(url).await?),
        _ => None,
    };
    let mut native = match mode {
        Mode::NativePadded | Mode::NativeArrays => Some(PgConnection::connect(url).await?),
        _ => None,
    };
    let mut next = 0usize;
    let mut group = |n: usize| fresh_rows(prefix, &mut next, n);
    let mut one = async |rows: Vec<Row9>| -> anyhow::Result<usize> {
        match (any.as_mut(), native.as_mut()) {
            (Some(c), _) if mode == Mode::AnyJson => json_group(c, &rows).await,
            (Some(c), _) => any_group(c, mode == Mode::AnyPadded, &rows).await,
            (_, Some(c)) => native_group(c, mode == Mode::NativeArrays, &rows).await,
            _ => unreachable!("one connection is open"),
        }
    };
    for &n in &warm {
        one(group(n)).await?;
    }
    reset_peak_rss();
    let started = Instant::now();
    let mut claimed = 0;
    for &n in sizes {
        claimed += one(group(n)).await?;
    }
    let elapsed = started.elapsed();
    let rows = sizes.iter().sum();
    anyhow::ensure!(claimed == rows, "{}: {claimed} claims for {rows} fresh keys", mode.name());
    Ok(Report { mode, groups: sizes.len(), rows, claimed, elapsed, peak_rss_mib: peak_rss_mib() })
}

/// The log's columns these statements bind: all but `kept_headers`, which only a dead
/// letter's or invalid delivery's row carries.
fn log_columns() -> &'static [&'static str] {
    &idemgate::delivery_log::COLUMNS[..22]
}

/// One group through the `Any` driver; returns the claims taken.
async fn any_group(conn: &mut AnyConnection, pad: bool, rows: &[Row9]) -> anyhow::Result<usize> {
    let n = rows.len();
    let last = &rows[n - 1];
    let (claim, log) = if pad {
        (
            format!(
                "INSERT INTO idempotent_record ({}) VALUES {}{CLAIM_TAIL}",
                CLAIM_COLUMNS.join(", "),
                padded_values(9, n)
            ),
            filtered_insert("delivery_log", log_columns(), n),
        )
    } else {
        (
            format!(
                "INSERT INTO idempotent_record ({}) VALUES {}{CLAIM_TAIL}",
                CLAIM_COLUMNS.join(", "),
                values_list(9, n)
            ),
            format!("INSERT INTO delivery_log ({}) VALUES {}", log_columns().join(", "), values_list(22, n)),
        )
    };
    let mut tx = conn.begin().await?;
    let claim = idemgate::store::query_built(Backend::Postgres, claim);
    let claim = if pad {
        bind_rows(claim, rows, last, Pad::Repeat, |q, r| bind_claim!(q, r))
    } else {
        rows.iter().fold(claim, |q, r| bind_claim!(q, r))
    };
    let claimed = claim.fetch_all(&mut *tx).await?.len();
    let log = idemgate::store::query_built(Backend::Postgres, log);
    let log = if pad {
        bind_rows(log, rows, last, Pad::Filter, |q, r| bind_log!(q, r))
    } else {
        rows.iter().fold(log, |q, r| bind_log!(q, r))
    };
    log.execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(claimed)
}

/// One group through the `Any` driver with each statement's rows in one JSON text, which
/// PostgreSQL unpacks with `json_to_recordset`: one text and one parameter for every group size.
async fn json_group(conn: &mut AnyConnection, rows: &[Row9]) -> anyhow::Result<usize> {
    let claims: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({"a": "bench", "b": "stock.deduct", "c": r.biz_id, "d": 0, "e": r.msg_id,
                "f": r.msg_id, "g": r.hash, "h": "bench-1", "i": r.now_ms})
        })
        .collect();
    let logs: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({"a": r.now_ms, "b": "bench-1", "c": "bench", "d": r.msg_id, "e": r.msg_id,
                "f": "stock", "g": "", "h": 3, "i": 42, "j": 0, "k": "stock.deduct", "l": r.biz_id, "m": 0,
                "n": "processed", "o": null, "p": null, "q": null, "r": r.hash, "s": null, "t": 700,
                "u": null, "v": 0})
        })
        .collect();
    let claim = format!(
        "INSERT INTO idempotent_record ({}) SELECT a, b, c, d, e, f, g, h, i FROM json_to_recordset(?::json) \
         AS r(a text, b text, c text, d bigint, e text, f text, g text, h text, i bigint){CLAIM_TAIL}",
        CLAIM_COLUMNS.join(", ")
    );
    let log = format!(
        "INSERT INTO delivery_log ({}) SELECT a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q, r, s, t, \
         decode(u, 'base64'), v FROM json_to_recordset(?::json) AS x(a bigint, b text, c text, d text, e text, \
         f text, g text, h int, i bigint, j int, k text, l text, m bigint, n text, o text, p text, q smallint, \
         r text, s text, t bigint, u text, v smallint)",
        log_columns().join(", ")
    );
    let mut tx = conn.begin().await?;
    let claimed = idemgate::store::query_built(Backend::Postgres, claim)
        .bind(serde_json::Value::Array(claims).to_string())
        .fetch_all(&mut *tx)
        .await?
        .len();
    idemgate::store::query_built(Backend::Postgres, log)
        .bind(serde_json::Value::Array(logs).to_string())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(claimed)
}

/// One group through the native PostgreSQL driver; returns the claims taken.
async fn native_group(conn: &mut PgConnection, arrays: bool, rows: &[Row9]) -> anyhow::Result<usize> {
    let n = rows.len();
    let mut tx = conn.begin().await?;
    let claimed = if arrays {
        let sql = format!(
            "INSERT INTO idempotent_record ({}) SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], \
             $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[]){CLAIM_TAIL}",
            CLAIM_COLUMNS.join(", ")
        );
        let col = |f: fn(&Row9) -> String| rows.iter().map(f).collect::<Vec<String>>();
        let claimed = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(vec!["bench"; n])
            .bind(vec!["stock.deduct"; n])
            .bind(col(|r| r.biz_id.clone()))
            .bind(vec![0_i64; n])
            .bind(col(|r| r.msg_id.clone()))
            .bind(col(|r| r.msg_id.clone()))
            .bind(col(|r| r.hash.clone()))
            .bind(vec!["bench-1"; n])
            .bind(rows.iter().map(|r| r.now_ms).collect::<Vec<i64>>())
            .fetch_all(&mut *tx)
            .await?
            .len();
        let sql = format!(
            "INSERT INTO delivery_log ({}) SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], \
             $4::text[], $5::text[], $6::text[], $7::text[], $8::int[], $9::bigint[], $10::int[], $11::text[], \
             $12::text[], $13::bigint[], $14::text[], $15::text[], $16::text[], $17::smallint[], $18::text[], \
             $19::text[], $20::bigint[], $21::bytea[], $22::smallint[])",
            log_columns().join(", ")
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(rows.iter().map(|r| r.now_ms).collect::<Vec<i64>>())
            .bind(vec!["bench-1"; n])
            .bind(vec!["bench"; n])
            .bind(col(|r| r.msg_id.clone()))
            .bind(col(|r| r.msg_id.clone()))
            .bind(vec!["stock"; n])
            .bind(vec![""; n])
            .bind(vec![3_i32; n])
            .bind(vec![42_i64; n])
            .bind(vec![0_i32; n])
            .bind(vec!["stock.deduct"; n])
            .bind(col(|r| r.biz_id.clone()))
            .bind(vec![0_i64; n])
            .bind(vec!["processed"; n])
            .bind(vec![None::<String>; n])
            .bind(vec![None::<String>; n])
            .bind(vec![None::<i16>; n])
            .bind(col(|r| r.hash.clone()))
            .bind(vec![None::<String>; n])
            .bind(vec![700_i64; n])
            .bind(vec![None::<Vec<u8>>; n])
            .bind(vec![0_i16; n])
            .execute(&mut *tx)
            .await?;
        claimed
    } else {
        let last = &rows[n - 1];
        let claim = number_placeholders(&format!(
            "INSERT INTO idempotent_record ({}) VALUES {}{CLAIM_TAIL}",
            CLAIM_COLUMNS.join(", "),
            padded_values(9, n)
        ));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(claim));
        for r in rows.iter().chain(std::iter::repeat(last)).take(idemgate::store::padded(n)) {
            q = bind_claim!(q, r);
        }
        let claimed = q.fetch_all(&mut *tx).await?.len();
        let log = number_placeholders(&filtered_insert("delivery_log", log_columns(), n));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(log));
        for (i, r) in rows.iter().chain(std::iter::repeat(last)).take(idemgate::store::padded(n)).enumerate()
        {
            q = bind_log!(q, r).bind(i64::from(i < n));
        }
        q.execute(&mut *tx).await?;
        claimed
    };
    tx.commit().await?;
    Ok(claimed)
}

fn table(reports: &[Report]) -> String {
    let base = reports.first().map_or(1.0, |r| rate(r.rows, r.elapsed));
    let mut out = String::from(
        "| mode | groups | rows | rows/s | × one text per size | µs per group | µs per row | peak RSS MiB |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let per_s = rate(r.rows, r.elapsed);
        out += &format!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.0} | {:.1} | {:.0} |\n",
            r.mode.name(),
            r.groups,
            r.rows,
            per_s,
            per_s / base,
            r.elapsed.as_secs_f64() * 1e6 / r.groups as f64,
            r.elapsed.as_secs_f64() * 1e6 / r.rows as f64,
            r.peak_rss_mib
        );
        debug_assert_eq!(r.claimed, r.rows);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_sizes_cover_one_to_sixty_four() {
        let s = sizes(5_000);
        assert_eq!((s.iter().min(), s.iter().max()), (Some(&1), Some(&64)));
        assert_eq!(s, sizes(5_000), "seeded");
    }
}
