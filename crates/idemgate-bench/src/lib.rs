//! `idemgate-bench …`: the measurements behind the figures in docs/benchmarks.md. Each benchmark runs the
//! product beside the naive way a user would write the same thing, on the same database in
//! the same run, checks the results for correctness, and prints a table.
//!
//! Each benchmark's module owns its flags (its `Options`, parsed by clap), their checks, the
//! run and the printing, in its `command`; [`command::BenchCommand`] picks the benchmark.
//!
//! Benchmarks create scratch databases ([`idemgate_testkit::scratch`]) and drop them afterwards. They
//! must not be pointed at production servers.

mod archive;
mod broker;
pub mod command;
mod driver;
mod galera;
mod gate;
mod layers;
mod metrics;
pub mod reconcile;
mod soak;
mod sql_handler;
mod state_machine;
pub mod trace;
mod ui_flood;
mod volume;

use std::time::Duration;

use sqlx::AssertSqlSafe;

use idemgate::store::{Sql, Store};

/// Checks a share flag (`--{name}`): from 0 to `max`.
fn share(name: &str, value: f64, max: f64) -> anyhow::Result<()> {
    anyhow::ensure!((0.0..=max).contains(&value), "--{name} must be between 0 and {max}, not {value}");
    Ok(())
}

/// A flag given in milliseconds.
fn millis(text: &str) -> Result<Duration, std::num::ParseIntError> {
    text.parse().map(Duration::from_millis)
}

/// A flag given in seconds.
fn seconds(text: &str) -> Result<Duration, std::num::ParseIntError> {
    text.parse().map(Duration::from_secs)
}

/// The cores this process may run on, for the setting line a benchmark prints first.
fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Latency percentiles of a sample, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Percentiles {
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Percentiles {
    pub(crate) fn of(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Self { p50_us: at(0.50), p99_us: at(0.99), max_us: samples[samples.len() - 1] }
    }
}

/// Peak resident memory of this process so far (VmHWM), in MiB; 0 where /proc is missing.
pub(crate) fn peak_rss_mib() -> f64 {
    proc_status_kib("VmHWM:") as f64 / 1024.0
}

/// Starts the peak resident memory (VmHWM) again from the current RSS, with the allocator's
/// free pages given back first, so that the next measurement's peak is its own. Linux only;
/// elsewhere the peak stays the process's.
pub(crate) fn reset_peak_rss() {
    // Memory the allocator still keeps from the runs before (freed, not yet given back) would
    // count in the next run's peak; it goes back to the system first.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the system; it touches no live
    // allocation and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Resident memory of this process now (VmRSS), in MiB.
pub(crate) fn rss_mib() -> f64 {
    proc_status_kib("VmRSS:") as f64 / 1024.0
}

fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

static DIGITS_TABLE: Sql = Sql::new("CREATE TABLE bench_digits (n INTEGER NOT NULL PRIMARY KEY)");

/// `bench_digits`: 0 to 999, which bulk loads cross with themselves to make a million rows in
/// one statement.
pub(crate) async fn create_digits(store: &Store) -> Result<(), sqlx::Error> {
    store.query(&DIGITS_TABLE).execute(store.pool()).await?;
    let values = (0..1000).map(|n| format!("({n})")).collect::<Vec<_>>().join(", ");
    sqlx::query(AssertSqlSafe(format!("INSERT INTO bench_digits (n) VALUES {values}")))
        .execute(store.pool())
        .await?;
    Ok(())
}

/// Messages per second.
pub(crate) fn rate(messages: usize, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_ranked_samples() {
        let mut s: Vec<u64> = (1..=100).collect();
        let p = Percentiles::of(&mut s);
        assert_eq!((p.p50_us, p.p99_us, p.max_us), (51, 99, 100));
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
    }

    #[test]
    fn shares_are_checked() {
        assert!(share("duplicates", 0.0, 0.9).is_ok() && share("duplicates", 0.9, 0.9).is_ok());
        assert_eq!(
            share("duplicates", 0.95, 0.9).unwrap_err().to_string(),
            "--duplicates must be between 0 and 0.9, not 0.95"
        );
    }

    #[test]
    fn memory_is_read_from_proc() {
        assert!(peak_rss_mib() > 0.0 && rss_mib() > 0.0);
    }
}
