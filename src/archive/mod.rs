//! Archiving: claims older than the dedup retention move from `idempotent_record` to
//! `idempotent_record_archive`, and delivery-log rows older than the log retention are deleted,
//! in bounded batches while consumers keep running.
//!
//! [`archive_once`] is the whole job, a plain async function: the cron scheduler inside `serve`
//! ([`schedule`]) and `idemgate archive` ([`manual`]) only call it, and tests call it with
//! back-dated rows and their own clock. A run
//! 1. takes the lease ([`lease`]) or records itself `skipped`: one instance archives at a time;
//! 2. marks passes left `running` by a dead process as failed;
//! 3. for each pass (claims, then log rows) records an `archive_run` row ([`runs`]) and runs
//!    batches ([`batch`]), each one transaction that copies and deletes the same rows, so a crash
//!    at any point leaves every claim in exactly one of the two tables; it renews the lease
//!    before each batch, pauses between batches and stops at its time budget;
//! 4. gives the lease back.
//!
//! [`retention`] checks at start that claims outlive every redelivery and replay. The optional
//! late-duplicate lookup the gate makes in this archive on a fresh claim is the gate's own
//! ([`crate::gate::guard`]).
//!
//! This module owns the archive tables and the job. It must not decide a delivery's outcome
//! (the gate does) nor parse the command line or the configuration file.

mod batch;
pub(crate) mod lease;
pub mod retention;
pub mod runs;
pub(crate) mod schedule;
pub(crate) mod settings;

use std::time::{Duration, Instant};

pub(crate) use lease::{ARCHIVE_LEASE, Held, Lease};
pub use retention::{LogRetention, parse_age};
pub(crate) use runs::RunRecord;
pub use runs::{RunKind, RunStatus, StartedBy};
pub use schedule::ArchiveScheduler;
pub use settings::ArchiveSettings;

use crate::delivery_log::partitions;
use crate::layout::key;
use crate::store::Store;
use crate::store::ddl::{Step, rows_up_to};
use batch::{Interrupt, Walk};

/// How a run goes.
#[derive(Debug, Clone)]
pub struct ArchiveOptions {
    /// Claims with `claimed_at_ms` older than `now - dedup_retention_ms` move to the archive.
    pub dedup_retention_ms: i64,
    /// Log rows with `logged_at_ms` older than `now - log_retention_ms` are deleted; `None`
    /// leaves the log alone.
    pub log_retention_ms: Option<i64>,
    /// Rows per batch (one transaction).
    pub batch_size: u32,
    /// Pause between batches.
    pub pause: Duration,
    /// The run stops starting batches after this long; the rest waits for the next run.
    pub time_budget: Duration,
    /// The lease lasts this long past each renewal.
    pub lease_ttl: Duration,
    /// This process, in the lease and the run rows.
    pub instance_id: String,
    pub started_by: StartedBy,
    /// Move a plain delivery log to partitions by day (PostgreSQL, MySQL/MariaDB;
    /// [`crate::delivery_log::partitions`]). A partitioned log gets its partitions ahead and its
    /// retention by partition either way.
    pub partition_log: bool,
    /// Move the claim tables to the unique key led by biz_id (PostgreSQL, MySQL/MariaDB;
    /// [`crate::layout::key`]).
    pub claim_key_by_biz_id: bool,
    /// Stop short to show what a crash leaves; [`Fault::None`] outside tests.
    pub fault: Fault,
}

/// A crash to imitate, for the crash-safety tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    /// Die after this many claim batches have committed: the lease and the `running` row stay
    /// behind, as a killed process leaves them.
    DieAfterBatches(u64),
    /// Die inside this claim batch (1-based), after copying to the archive and before deleting:
    /// the open transaction is dropped, as a killed process's connection would be.
    DieInsideBatch(u64),
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub run_id: Option<i64>,
    pub cutoff_ms: i64,
    /// Rows moved to the archive (claims) or deleted one by one (log rows).
    pub rows: u64,
    /// Log only: the day partitions dropped whole, and the rows the catalog estimated they held.
    pub dropped_partitions: Vec<String>,
    pub dropped_rows_estimate: u64,
    /// What this pass did to move its tables to their shape, step by step: the claim tables'
    /// key led by biz_id ([`crate::layout::key`]), a plain log to partitions.
    pub schema_steps: Vec<String>,
    pub batches: u64,
    /// Claims already in the archive, kept once.
    pub already_archived: u64,
    /// Stopped by the time budget with rows left.
    pub budget_exhausted: bool,
    pub elapsed: Duration,
}

impl PassReport {
    /// Rows per second.
    pub fn rate(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// Whether the run happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveOutcome {
    Done,
    /// Another instance held the lease.
    Skipped {
        holder: String,
        until_ms: i64,
    },
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveReport {
    pub outcome: ArchiveOutcome,
    pub dedup: PassReport,
    pub log: Option<PassReport>,
}

impl ArchiveReport {
    /// True when nothing was left for the next run.
    pub fn complete(&self) -> bool {
        !self.dedup.budget_exhausted && !self.log.as_ref().is_some_and(|l| l.budget_exhausted)
    }
}

/// A run could not finish. Its passes are recorded `failed` with this error (except for an
/// imitated crash, which records nothing, as a dead process cannot).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive {kind} pass failed: {source}")]
    Database {
        kind: RunKind,
        #[source]
        source: sqlx::Error,
    },
    #[error("the archive lease was lost (it expired and {holder:?} took it); the run stopped")]
    LeaseLost { holder: String },
    #[error("the run was stopped by an imitated crash")]
    Crashed,
    #[error("archive options: {0}")]
    Options(String),
}

/// Where a running pass stands, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub kind: RunKind,
    pub rows: u64,
    pub batches: u64,
}

/// Runs the job once: the claims older than `now_ms - dedup_retention_ms` move to the archive,
/// then the log rows older than the log retention are deleted.
pub async fn archive_once(
    store: &Store,
    options: &ArchiveOptions,
    now_ms: i64,
) -> Result<ArchiveReport, ArchiveError> {
    archive_observed(store, options, now_ms, &mut |_| {}).await
}

/// [`archive_once`], calling `observe` after every batch.
pub async fn archive_observed(
    store: &Store,
    options: &ArchiveOptions,
    now_ms: i64,
    observe: &mut (dyn FnMut(Progress) + Send),
) -> Result<ArchiveReport, ArchiveError> {
    if options.batch_size == 0 || options.dedup_retention_ms <= 0 {
        return Err(ArchiveError::Options("batch_size and dedup_retention_ms must be positive".into()));
    }
    let clock = Clock { start_ms: now_ms, started: Instant::now() };
    let ttl_ms = i64::try_from(options.lease_ttl.as_millis()).unwrap_or(i64::MAX / 4);
    let holder = format!("{}/{:08x}", options.instance_id, rand::random::<u32>());
    let dedup_cutoff = now_ms - options.dedup_retention_ms;
    let log_cutoff = options.log_retention_ms.map(|ms| now_ms - ms);
    let db = |kind| move |source| ArchiveError::Database { kind, source };

    // Instances woken by one schedule tick (cron ticks fall on whole seconds) share it: the
    // first takes the lease, the others find it taken since the tick and skip.
    let tick_ms = match options.started_by {
        StartedBy::Schedule => now_ms - now_ms.rem_euclid(1_000),
        StartedBy::Command => i64::MAX,
    };
    let lease = Lease::acquire(store, ARCHIVE_LEASE, &holder, clock.now(), ttl_ms, tick_ms)
        .await
        .map_err(db(RunKind::Dedup))?;
    let lease = match lease {
        Ok(lease) => lease,
        Err(held) => return skipped(store, options, &clock, dedup_cutoff, log_cutoff, held).await,
    };
    let abandoned =
        runs::abandon_stale(store, clock.now(), &options.instance_id).await.map_err(db(RunKind::Dedup))?;
    if abandoned > 0 {
        tracing::warn!(abandoned, "archive passes left running by a process that died are now marked failed");
    }

    let run = Run { store, options, clock: &clock, lease: &lease, ttl_ms, started: Instant::now() };
    let dedup = run.pass(RunKind::Dedup, dedup_cutoff, observe).await;
    let log = match (&dedup, log_cutoff) {
        (Ok(_), Some(cutoff)) => Some(run.pass(RunKind::Log, cutoff, observe).await),
        (Ok(_), None) => {
            // The log is kept whole, but a partitioned one still needs its days ahead.
            if let Err(e) = run.log_partitions(None, &mut PassReport::default()).await {
                tracing::warn!(error = %e, "could not make the delivery log's partitions ahead");
            }
            None
        }
        _ => None,
    };
    if matches!(dedup, Err(ArchiveError::Crashed)) {
        return Err(ArchiveError::Crashed);
    }
    // The consumer record explains the log: it goes with the log's expired days.
    if let (Some(Ok(_)), Some(cutoff)) = (&log, log_cutoff) {
        let batch = i64::from(options.batch_size);
        if let Err(e) = crate::instances::expire(store, cutoff, batch).await {
            tracing::warn!(error = %e, "could not delete the consumer record's expired events; the next run tries again");
        }
    }
    if let Err(e) = lease.release(store).await {
        tracing::warn!(error = %e, "could not release the archive lease; it will expire");
    }
    Ok(ArchiveReport { outcome: ArchiveOutcome::Done, dedup: dedup?, log: log.transpose()? })
}

/// A plain log or a claim table of the first key shape with fewer rows than this is moved when
/// the service starts; a bigger one by the archive job, a step at a time.
pub const MOVE_AT_START_ROWS: i64 = 100_000;

/// At start, on PostgreSQL and MySQL/MariaDB, holding the archive lease: claim tables of fewer
/// than [`MOVE_AT_START_ROWS`] rows get the key led by biz_id (with `claim_key_by_biz_id`), a
/// plain log of fewer rows is moved to partitions by day (with `partition_log`), and a
/// partitioned one gets its days ahead. Nothing when another instance holds the lease (it does
/// the same, or its archive run does).
pub async fn prepare_tables(
    store: &Store,
    settings: &ArchiveSettings,
    instance_id: &str,
    now_ms: i64,
) -> Result<(), ArchiveError> {
    if store.backend() == crate::store::Backend::Sqlite {
        return Ok(());
    }
    let db = |kind| move |source| ArchiveError::Database { kind, source };
    let mut options = settings.options(instance_id, StartedBy::Command);
    if options.partition_log
        && partitions::shape(store).await.map_err(db(RunKind::Log))? == partitions::Shape::Plain
    {
        let rows = rows_up_to(store, "delivery_log", MOVE_AT_START_ROWS).await.map_err(db(RunKind::Log))?;
        if rows >= MOVE_AT_START_ROWS {
            tracing::warn!(
                rows_at_least = rows,
                "the delivery log is plain and large: the archive job moves it to partitions by day, a step per run, \
                 while consumers write (docs/operations.md, The partitioned log)"
            );
            options.partition_log = false;
        }
    }
    let mut small_claim_tables = Vec::new();
    if options.claim_key_by_biz_id {
        for table in claim_tables(store).await.map_err(db(RunKind::Dedup))? {
            if key::shape(store, &table).await.map_err(db(RunKind::Dedup))?.is_led() {
                continue;
            }
            let rows = rows_up_to(store, &table, MOVE_AT_START_ROWS).await.map_err(db(RunKind::Dedup))?;
            if rows >= MOVE_AT_START_ROWS {
                tracing::warn!(
                    table,
                    rows_at_least = rows,
                    "the claim key is not led by biz_id yet and the table is large: the archive job moves it, \
                     while consumers write (docs/operations.md, The claim table)"
                );
            } else {
                small_claim_tables.push(table);
            }
        }
    }
    let holder = format!("{instance_id}/start/{:08x}", rand::random::<u32>());
    let ttl_ms = i64::try_from(options.lease_ttl.as_millis()).unwrap_or(i64::MAX / 4);
    let Ok(lease) = Lease::acquire(store, ARCHIVE_LEASE, &holder, now_ms, ttl_ms, i64::MAX)
        .await
        .map_err(db(RunKind::Log))?
    else {
        return Ok(());
    };
    let clock = Clock { start_ms: now_ms, started: Instant::now() };
    let run = Run { store, options: &options, clock: &clock, lease: &lease, ttl_ms, started: Instant::now() };
    let mut report = PassReport::default();
    let mut done = run.claim_keys(&small_claim_tables, &mut report).await;
    if done.is_ok() {
        done = run.log_partitions(None, &mut report).await;
    }
    if let Err(e) = lease.release(store).await {
        tracing::warn!(error = %e, "could not release the archive lease; it will expire");
    }
    if !report.schema_steps.is_empty() {
        tracing::info!(steps = ?report.schema_steps, "moved the tables to their shape");
    }
    done
}

/// Every claim table of the database's layout, the main one included (the pattern a shard made
/// later copies).
async fn claim_tables(store: &Store) -> Result<Vec<String>, sqlx::Error> {
    let layout = crate::layout::current(store).await?;
    let mut tables = layout.tables();
    if layout.shards() > 0 {
        tables.insert(0, crate::layout::MAIN_TABLE.to_owned());
    }
    Ok(tables)
}

/// What a finished pass's row says besides its counts: the log's partitions dropped and moved,
/// and whether the time budget left work for the next run.
fn pass_note(report: &PassReport) -> Option<String> {
    let mut parts = Vec::new();
    if !report.dropped_partitions.is_empty() {
        parts.push(format!(
            "dropped the log partitions {} (about {} rows, the catalog's estimate, counted in the rows)",
            report.dropped_partitions.join(", "),
            report.dropped_rows_estimate
        ));
    }
    if !report.schema_steps.is_empty() {
        parts.push(format!("moving the tables to their shape: {}", report.schema_steps.join("; ")));
    }
    if report.budget_exhausted {
        parts.push("stopped at archive.max_run_seconds with work left; the next run continues".to_owned());
    }
    (!parts.is_empty()).then(|| parts.join(". "))
}

/// Another instance holds the lease: record the passes as skipped.
async fn skipped(
    store: &Store,
    options: &ArchiveOptions,
    clock: &Clock,
    dedup_cutoff: i64,
    log_cutoff: Option<i64>,
    held: Held,
) -> Result<ArchiveReport, ArchiveError> {
    let note = if held.until_ms > clock.now() {
        format!("another instance is archiving: {} holds the lease until {}", held.holder, held.until_ms)
    } else {
        format!("this schedule tick was already served by {}", held.holder)
    };
    let mut report = ArchiveReport {
        outcome: ArchiveOutcome::Skipped { holder: held.holder, until_ms: held.until_ms },
        dedup: PassReport { cutoff_ms: dedup_cutoff, ..Default::default() },
        log: log_cutoff.map(|cutoff_ms| PassReport { cutoff_ms, ..Default::default() }),
    };
    for (kind, pass) in [(RunKind::Dedup, Some(&mut report.dedup)), (RunKind::Log, report.log.as_mut())] {
        let Some(pass) = pass else { continue };
        let id = runs::start(
            store,
            kind,
            RunStatus::Skipped,
            options.started_by,
            &options.instance_id,
            clock.now(),
            pass.cutoff_ms,
            Some(&note),
        )
        .await
        .map_err(|source| ArchiveError::Database { kind, source })?;
        pass.run_id = Some(id);
    }
    Ok(report)
}

/// The injected start time plus the real time elapsed since.
struct Clock {
    start_ms: i64,
    started: Instant,
}

impl Clock {
    fn now(&self) -> i64 {
        self.start_ms + i64::try_from(self.started.elapsed().as_millis()).unwrap_or(0)
    }
}

/// A run holding the lease.
struct Run<'a> {
    store: &'a Store,
    options: &'a ArchiveOptions,
    clock: &'a Clock,
    lease: &'a Lease,
    ttl_ms: i64,
    started: Instant,
}

impl Run<'_> {
    /// One pass, recorded in its own `archive_run` row.
    async fn pass(
        &self,
        kind: RunKind,
        cutoff_ms: i64,
        observe: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<PassReport, ArchiveError> {
        let (store, o) = (self.store, self.options);
        let db = |source| ArchiveError::Database { kind, source };
        let id = runs::start(
            store,
            kind,
            RunStatus::Running,
            o.started_by,
            &o.instance_id,
            self.clock.now(),
            cutoff_ms,
            None,
        )
        .await
        .map_err(db)?;
        let mut report = PassReport { run_id: Some(id), cutoff_ms, ..Default::default() };
        let pass_started = Instant::now();
        let mut result = Ok(());
        if kind == RunKind::Log {
            result = self.log_partitions(Some(cutoff_ms), &mut report).await;
        } else if o.claim_key_by_biz_id && store.backend() != crate::store::Backend::Sqlite {
            result = match claim_tables(store).await {
                Ok(tables) => self.claim_keys(&tables, &mut report).await,
                Err(e) => Err(db(e)),
            };
        }
        if result.is_ok() {
            result = self.batches(kind, cutoff_ms, &mut report, observe).await;
        }
        report.elapsed = pass_started.elapsed();
        let rows = (report.rows + report.dropped_rows_estimate) as i64;
        let batches = report.batches as i64;
        let finished = match &result {
            Err(ArchiveError::Crashed) => return Err(ArchiveError::Crashed),
            Ok(()) => {
                let note = pass_note(&report);
                runs::finish(
                    store,
                    id,
                    RunStatus::Success,
                    self.clock.now(),
                    rows,
                    batches,
                    None,
                    note.as_deref(),
                )
                .await
            }
            Err(e) => {
                let error = e.to_string();
                runs::finish(
                    store,
                    id,
                    RunStatus::Failed,
                    self.clock.now(),
                    rows,
                    batches,
                    Some(&error),
                    None,
                )
                .await
            }
        };
        result?;
        finished.map_err(db)?;
        Ok(report)
    }

    /// The claim tables' key led by biz_id, a step at a time within the time budget; what it
    /// did goes into `report`.
    async fn claim_keys(&self, tables: &[String], report: &mut PassReport) -> Result<(), ArchiveError> {
        for table in tables {
            let step = || key::step(self.store, table);
            if !self.steps(RunKind::Dedup, "leading the claim key with biz_id", report, step).await? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Takes the steps `next` makes until it says [`Step::Done`] (true), or until the time
    /// budget is spent or a step has to wait for the next run (false, the report saying there
    /// is work left), recording each in `report`; the lease is renewed before each step and
    /// during a long one.
    async fn steps<F, Fut>(
        &self,
        kind: RunKind,
        doing: &str,
        report: &mut PassReport,
        mut next: F,
    ) -> Result<bool, ArchiveError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Step, sqlx::Error>>,
    {
        loop {
            if self.started.elapsed() >= self.options.time_budget {
                report.budget_exhausted = true;
                return Ok(false);
            }
            self.renew(kind).await?;
            let step = self.keeping_lease(kind, next()).await?;
            match step.map_err(|source| ArchiveError::Database { kind, source })? {
                Step::Done => return Ok(true),
                Step::More(what) => {
                    tracing::info!(step = %what, "{doing}");
                    report.schema_steps.push(what);
                }
                Step::Waiting(what) => {
                    tracing::info!(waiting = %what, "{doing}: waiting for the next run");
                    report.schema_steps.push(what);
                    report.budget_exhausted = true;
                    return Ok(false);
                }
            }
        }
    }

    /// The log's partitions: a plain log moved a step at a time (within the time budget, when
    /// `partition_log` is on), the days ahead made, and with a `cutoff_ms` the expired days
    /// dropped. What it did goes into `report`.
    async fn log_partitions(
        &self,
        cutoff_ms: Option<i64>,
        report: &mut PassReport,
    ) -> Result<(), ArchiveError> {
        let (store, o) = (self.store, self.options);
        let db = |source| ArchiveError::Database { kind: RunKind::Log, source };
        if store.backend() == crate::store::Backend::Sqlite {
            return Ok(());
        }
        if o.partition_log {
            let step = || partitions::convert_step(store, self.clock.now());
            if !self.steps(RunKind::Log, "moving the delivery log to partitions by day", report, step).await?
            {
                return Ok(());
            }
        }
        let made = partitions::ensure_ahead(store, self.clock.now()).await.map_err(db)?;
        if !made.is_empty() {
            tracing::info!(partitions = ?made, "made the delivery log's partitions ahead");
        }
        if let Some(cutoff_ms) = cutoff_ms {
            self.renew(RunKind::Log).await?;
            let dropped = partitions::drop_expired(store, cutoff_ms).await.map_err(db)?;
            report.dropped_rows_estimate = u64::try_from(dropped.estimated_rows).unwrap_or(0);
            report.dropped_partitions = dropped.partitions;
        }
        Ok(())
    }

    /// Renews the lease, or says who took it; a database error is the `kind` pass's.
    async fn renew(&self, kind: RunKind) -> Result<(), ArchiveError> {
        let store = self.store;
        let db = |source| ArchiveError::Database { kind, source };
        if self.lease.renew(store, self.clock.now(), self.ttl_ms).await.map_err(db)? {
            return Ok(());
        }
        let holder = match lease::holder(store, ARCHIVE_LEASE).await {
            Ok(Some(held)) => held.holder,
            _ => String::new(),
        };
        Err(ArchiveError::LeaseLost { holder })
    }

    /// Runs `work` (one long statement: an index built, a table validated), renewing the lease
    /// every third of its time meanwhile.
    async fn keeping_lease<T>(
        &self,
        kind: RunKind,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, ArchiveError> {
        let every = Duration::from_millis(u64::try_from(self.ttl_ms / 3).unwrap_or(1_000).max(1_000));
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return Ok(done),
                () = tokio::time::sleep(every) => self.renew(kind).await?,
            }
        }
    }

    async fn batches(
        &self,
        kind: RunKind,
        cutoff_ms: i64,
        report: &mut PassReport,
        observe: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<(), ArchiveError> {
        let db = |source| ArchiveError::Database { kind, source };
        for target in batch::targets(self.store, kind).await.map_err(db)? {
            if !self.table(target, cutoff_ms, report, observe).await? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The batches of one table. False when the run must stop (its time budget is spent).
    async fn table(
        &self,
        target: &batch::Target,
        cutoff_ms: i64,
        report: &mut PassReport,
        observe: &mut (dyn FnMut(Progress) + Send),
    ) -> Result<bool, ArchiveError> {
        let (store, o) = (self.store, self.options);
        let kind = target.kind();
        let db = |source| ArchiveError::Database { kind, source };
        let Some(mut walk) = batch::bound(store, target, cutoff_ms).await.map_err(db)? else {
            return Ok(true);
        };
        loop {
            if self.started.elapsed() >= o.time_budget {
                report.budget_exhausted = true;
                return Ok(false);
            }
            if report.batches > 0 && !o.pause.is_zero() {
                tokio::time::sleep(o.pause).await;
            }
            self.renew(kind).await?;
            let next = report.batches + 1;
            let interrupt = match o.fault {
                Fault::DieInsideBatch(n) if kind == RunKind::Dedup && n == next => Interrupt::AfterCopy,
                _ => Interrupt::None,
            };
            let done = batch::run(store, target, cutoff_ms, walk, o.batch_size, self.clock.now(), interrupt)
                .await
                .map_err(db)?;
            let Some(b) = done.map_err(|_| ArchiveError::Crashed)? else {
                return Ok(true);
            };
            walk.after = b.last_id;
            report.rows += b.rows;
            report.batches = next;
            report.already_archived += b.already_archived;
            runs::progress(store, report.run_id.unwrap_or(0), report.rows as i64, report.batches as i64)
                .await
                .map_err(db)?;
            observe(Progress { kind, rows: report.rows, batches: report.batches });
            if kind == RunKind::Dedup && o.fault == Fault::DieAfterBatches(next) {
                return Err(ArchiveError::Crashed);
            }
            if walk.after >= walk.through {
                return Ok(true);
            }
        }
    }
}

/// What a run would do, for `--dry-run`: rows that would move and the statements with their
/// plans. Changes nothing: no lease, no run row.
#[derive(Debug, Clone)]
pub struct DryRun {
    pub passes: Vec<PassPlan>,
}

/// One pass of a dry run.
#[derive(Debug, Clone)]
pub struct PassPlan {
    pub kind: RunKind,
    pub cutoff_ms: i64,
    /// Rows older than the cutoff now.
    pub rows: i64,
    /// The id range the batches would walk, if any row is expired (over every table).
    pub ids: Option<(i64, i64)>,
    /// The tables the pass walks: 1, or the number of claim shards.
    pub tables: usize,
    /// Each statement with the database's plan for it.
    pub statements: Vec<(String, Vec<String>)>,
}

/// Counts what a run at `now_ms` would move and explains the statements it would run.
pub async fn dry_run(store: &Store, options: &ArchiveOptions, now_ms: i64) -> Result<DryRun, ArchiveError> {
    let mut passes = Vec::new();
    let windows =
        [(RunKind::Dedup, Some(options.dedup_retention_ms)), (RunKind::Log, options.log_retention_ms)];
    for (kind, window) in windows {
        let Some(window) = window else { continue };
        let db = |source| ArchiveError::Database { kind, source };
        let cutoff_ms = now_ms - window;
        let targets = batch::targets(store, kind).await.map_err(db)?;
        let (mut rows, mut ids, mut statements) = (0, None, Vec::new());
        for (i, target) in targets.iter().enumerate() {
            rows += batch::count_expired(store, target, cutoff_ms).await.map_err(db)?;
            let walk = batch::bound(store, target, cutoff_ms).await.map_err(db)?;
            if let Some(w) = walk {
                let (after, through) = ids.unwrap_or((w.after, w.through));
                ids = Some((after.min(w.after), through.max(w.through)));
            }
            // The tables of one pass share their statements' shape: the first one's plans stand
            // for all of them.
            if i == 0 {
                let explained = walk.unwrap_or(Walk { after: 0, through: 0 });
                statements = batch::explain(store, target, cutoff_ms, explained, options.batch_size)
                    .await
                    .map_err(db)?;
            }
        }
        if kind == RunKind::Log {
            // A partitioned log drops its expired days whole: no row is read.
            let shape = partitions::shape(store).await.map_err(db)?;
            for p in shape.partitions().iter().filter(|p| p.to_ms().is_some_and(|to| to <= cutoff_ms)) {
                rows += p.estimated_rows;
                statements.push((
                    p.drop_statement(store.backend()),
                    vec![format!("the whole partition, about {} rows by the catalog", p.estimated_rows)],
                ));
            }
        }
        if kind == RunKind::Dedup && options.claim_key_by_biz_id {
            for table in claim_tables(store).await.map_err(db)? {
                let shape = key::shape(store, &table).await.map_err(db)?;
                if !shape.is_led() {
                    statements.push((
                        format!("{table}: the claim key led by biz_id, moved a step at a time while consumers write"),
                        vec![shape.describe()],
                    ));
                }
            }
        }
        passes.push(PassPlan { kind, cutoff_ms, rows, ids, statements, tables: targets.len() });
    }
    Ok(DryRun { passes })
}

/// How many rows each pass would touch now: the estimate behind a progress bar.
pub async fn estimate(store: &Store, options: &ArchiveOptions, now_ms: i64) -> Result<u64, ArchiveError> {
    let mut total = 0;
    let windows =
        [(RunKind::Dedup, Some(options.dedup_retention_ms)), (RunKind::Log, options.log_retention_ms)];
    for (kind, window) in windows {
        let Some(window) = window else { continue };
        let db = |source| ArchiveError::Database { kind, source };
        for target in batch::targets(store, kind).await.map_err(db)? {
            let n = batch::count_expired(store, target, now_ms - window).await.map_err(db)?;
            total += u64::try_from(n).unwrap_or(0);
        }
    }
    Ok(total)
}
