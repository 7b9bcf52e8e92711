//! The clock: epoch milliseconds, as stored in every table, and a stopwatch for phases.

use std::time::{Duration, Instant};

/// Epoch milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Epoch milliseconds as `2026-11-29 10:52:03.123 UTC`.
pub fn format_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// Charges the time since its last lap to a phase.
pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Self(Instant::now())
    }

    pub(crate) fn lap(&mut self, phase: &mut u64) {
        let now = Instant::now();
        *phase += micros(now - self.0);
        self.0 = now;
    }
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
