//! `idemgate archive`: the job run by hand, with a progress bar (rows moved of the estimate) on
//! a terminal and plain lines otherwise, or a dry run that reports what would move and the
//! plans of the statements, changing nothing.
//!
//! This module owns the by-hand presentation. It must not parse arguments (the command line
//! does) nor move rows other than through [`archive_observed`].

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use idemgate::archive::retention::{HOUR_MS, check_dedup_retention, human};
use idemgate::archive::{
    ArchiveOptions, ArchiveOutcome, ArchiveReport, ArchiveSettings, DryRun, Progress, RunKind, StartedBy,
    archive_observed,
};
use idemgate::store::Store;

/// What `idemgate archive` was asked; unset values come from `[archive]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Request {
    /// `--dry-run`.
    pub dry_run: bool,
    /// `--older-than`, in milliseconds ([`parse_age`](idemgate::archive::parse_age) reads it).
    pub older_than_ms: Option<i64>,
    /// `--batch-size`.
    pub batch_size: Option<u32>,
}

/// `idemgate archive`: the configured job with the request's overrides, warned about like the
/// scheduled one, run now. Writes its report to `out`; returns the run's report (`None` for a
/// dry run).
pub(crate) async fn command(
    store: &Store,
    settings: &ArchiveSettings,
    instance_id: &str,
    redelivery_ms: i64,
    request: &Request,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<Option<ArchiveReport>> {
    let mut options = settings.options(instance_id, StartedBy::Command);
    if let Some(ms) = request.older_than_ms {
        options.dedup_retention_ms = ms;
    }
    if let Some(n) = request.batch_size {
        anyhow::ensure!((1..=100_000).contains(&n), "--batch-size must be between 1 and 100000, not {n}");
        options.batch_size = n;
    }
    let replay_ms = i64::from(settings.replay_horizon_hours) * HOUR_MS;
    if let Some(w) = check_dedup_retention(
        options.dedup_retention_ms,
        redelivery_ms,
        replay_ms,
        settings.late_duplicate_guard,
    ) {
        writeln!(out, "warning: {w}")?;
    }
    run_by_hand(store, &options, request.dry_run, idemgate::clock::now_ms(), out).await
}

/// Runs the job now (or, with `dry_run`, only reports it) and writes what happened to `out`.
/// The progress bar goes to standard error when that is a terminal.
pub(crate) async fn run_by_hand(
    store: &Store,
    options: &ArchiveOptions,
    dry_run: bool,
    now_ms: i64,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<Option<ArchiveReport>> {
    if dry_run {
        let plan = idemgate::archive::dry_run(store, options, now_ms).await?;
        write!(out, "{}", render_dry_run(&plan, now_ms))?;
        return Ok(None);
    }
    let estimate = idemgate::archive::estimate(store, options, now_ms).await?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(estimate);
        let style = ProgressStyle::with_template(
            "{spinner} {msg:5} [{bar:40}] {human_pos}/{human_len} rows  {per_sec}  eta {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(RunKind::Dedup.as_str());
        bar
    });
    writeln!(out, "archive: about {estimate} rows to move or delete")?;
    let mut lines: Vec<String> = Vec::new();
    let mut last_line = Instant::now();
    let (mut done_before, mut kind_now, mut rows_of_kind) = (0u64, RunKind::Dedup, 0u64);
    let mut observe = |p: Progress| {
        if p.kind != kind_now {
            done_before += rows_of_kind;
            kind_now = p.kind;
        }
        rows_of_kind = p.rows;
        let pos = done_before + p.rows;
        match &bar {
            Some(bar) => {
                bar.set_message(p.kind.as_str());
                bar.set_position(pos);
            }
            None if last_line.elapsed() >= Duration::from_secs(1) => {
                lines.push(format!(
                    "{}: {} rows in {} batches ({pos} of about {estimate})",
                    p.kind, p.rows, p.batches
                ));
                last_line = Instant::now();
            }
            None => {}
        }
    };
    let report = archive_observed(store, options, now_ms, &mut observe).await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    for line in lines {
        writeln!(out, "{line}")?;
    }
    let report = report?;
    write!(out, "{}", render_report(&report))?;
    Ok(Some(report))
}

/// A finished run, a line per pass.
pub(crate) fn render_report(report: &ArchiveReport) -> String {
    if let ArchiveOutcome::Skipped { holder, until_ms } = &report.outcome {
        return format!("archive: skipped, the lease is held by {holder} until {}\n", timestamp(*until_ms));
    }
    let mut out = String::new();
    let passes = [(RunKind::Dedup, Some(&report.dedup)), (RunKind::Log, report.log.as_ref())];
    for (kind, pass) in passes {
        let Some(p) = pass else { continue };
        let verb = match kind {
            RunKind::Dedup => "claims archived",
            RunKind::Log => "log rows deleted",
        };
        out.push_str(&format!(
            "{kind}: {} {verb} (older than {}) in {} batches, {:.1} s, {:.0} rows/s{}{}\n",
            p.rows,
            timestamp(p.cutoff_ms),
            p.batches,
            p.elapsed.as_secs_f64(),
            p.rate(),
            if p.already_archived > 0 {
                format!(", {} already in the archive", p.already_archived)
            } else {
                String::new()
            },
            if p.budget_exhausted { "; stopped at the time budget, the next run continues" } else { "" },
        ));
    }
    out
}

/// A dry run, for people: per pass the rows that would go, the ids walked and each statement
/// with its plan.
pub fn render_dry_run(plan: &DryRun, now_ms: i64) -> String {
    let mut out = format!("archive --dry-run at {}: nothing is changed\n", timestamp(now_ms));
    for p in &plan.passes {
        let what = match p.kind {
            RunKind::Dedup => "claims would move to idempotent_record_archive",
            RunKind::Log => "delivery-log rows would be deleted",
        };
        out.push_str(&format!(
            "\n{}: {} {what} (older than {}, {} ago)\n",
            p.kind,
            p.rows,
            timestamp(p.cutoff_ms),
            human(now_ms - p.cutoff_ms)
        ));
        match p.ids {
            Some((after, through)) if p.tables > 1 => out.push_str(&format!(
                "  batches walk the {} claim shards, ids {after} < id <= {through} (each shard its own range); \
                 the plans below are the first shard's\n",
                p.tables
            )),
            Some((after, through)) => {
                out.push_str(&format!("  batches walk ids {after} < id <= {through}\n"))
            }
            None => out.push_str("  nothing is expired\n"),
        }
        for (sql, plan) in &p.statements {
            out.push_str(&format!("  {sql}\n"));
            for line in plan.iter().flat_map(|l| l.lines()) {
                out.push_str(&format!("    | {line}\n"));
            }
        }
    }
    out
}

fn timestamp(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}
