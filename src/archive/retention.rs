//! How long claims and log rows are kept, and whether that is long enough.
//!
//! A claim may be archived only once no copy of its message can still arrive: the broker's
//! retries (how long they can take is the broker's to say: `broker::Limits`), delayed messages
//! and replays of dead letters. [`check_dedup_retention`] compares the dedup retention with that
//! horizon at start. The delivery log's window is shorter; [`LogRetention`] tells the trace page
//! when the history it shows may have been cut.
//!
//! This module owns the arithmetic of windows and horizons. It must not touch the database.

use std::fmt;

pub(crate) const SECOND_MS: i64 = 1_000;
pub(crate) const MINUTE_MS: i64 = 60 * SECOND_MS;
pub const HOUR_MS: i64 = 60 * MINUTE_MS;
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// The dedup retention is shorter than the longest time a copy of a message can arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionWarning {
    pub retention_ms: i64,
    pub redelivery_ms: i64,
    pub replay_ms: i64,
    pub guarded: bool,
}

impl RetentionWarning {
    pub(crate) fn horizon_ms(&self) -> i64 {
        self.redelivery_ms + self.replay_ms
    }
}

impl fmt::Display for RetentionWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "archive.dedup_retention_days ({}) is shorter than the longest time a copy of a message can \
             still arrive ({}: {} of broker retries plus archive.replay_horizon_hours {}): a copy \
             arriving after its claim was archived would be applied again",
            human(self.retention_ms),
            human(self.horizon_ms()),
            human(self.redelivery_ms),
            human(self.replay_ms),
        )?;
        if self.guarded {
            f.write_str(" unless the late-duplicate guard (on) finds it in the archive")
        } else {
            f.write_str("; lengthen the retention or turn on archive.late_duplicate_guard")
        }
    }
}

/// A warning when `retention_ms` is shorter than the broker's retry horizon (`redelivery_ms`)
/// plus `replay_ms` (delayed messages, dead-letter replays).
pub fn check_dedup_retention(
    retention_ms: i64,
    redelivery_ms: i64,
    replay_ms: i64,
    guarded: bool,
) -> Option<RetentionWarning> {
    let w = RetentionWarning { retention_ms, redelivery_ms, replay_ms, guarded };
    (retention_ms < w.horizon_ms()).then_some(w)
}

/// The delivery log's retention, as the trace page needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRetention {
    pub window_ms: i64,
}

impl LogRetention {
    pub fn days(days: u32) -> Self {
        Self { window_ms: i64::from(days) * DAY_MS }
    }

    /// Log rows older than this (epoch ms) are deleted, or will be at the next run.
    pub fn cutoff_ms(&self, now_ms: i64) -> i64 {
        now_ms - self.window_ms
    }

    /// True when a moment lies before the log's retention: the log no longer tells what
    /// happened then, and a page showing that period must say so.
    pub(crate) fn is_beyond(&self, at_ms: i64, now_ms: i64) -> bool {
        at_ms < self.cutoff_ms(now_ms)
    }

    /// The sentence a page shows above history that reaches past the retention.
    pub fn notice(&self, now_ms: i64) -> String {
        let cutoff = chrono::DateTime::from_timestamp_millis(self.cutoff_ms(now_ms))
            .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_else(|| self.cutoff_ms(now_ms).to_string());
        format!(
            "The delivery log keeps {}: deliveries before {cutoff} are no longer listed. Their claims, if \
             any, are still in the dedup table or its archive.",
            human(self.window_ms)
        )
    }
}

/// Reads an age such as `90d`, `36h`, `30m` or `45s` (for `--older-than`), in milliseconds.
pub fn parse_age(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let unit_ms = match unit {
        "d" => DAY_MS,
        "h" => HOUR_MS,
        "m" => MINUTE_MS,
        "s" => SECOND_MS,
        _ => return Err(format!("{text:?} is not an age: write a number and a unit, d, h, m or s (90d)")),
    };
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not an age: write a number and a unit, d, h, m or s (90d)"))?;
    let ms = n.checked_mul(unit_ms).filter(|ms| *ms > 0 && *ms <= 36_500 * DAY_MS);
    ms.ok_or_else(|| format!("{text:?} must be more than nothing and at most 36500 days"))
}

/// `90 days`, `4 h 45 min 40 s`: a duration for people.
pub fn human(ms: i64) -> String {
    if ms % DAY_MS == 0 && ms > 0 {
        let d = ms / DAY_MS;
        return format!("{d} day{}", if d == 1 { "" } else { "s" });
    }
    let mut parts = Vec::new();
    let (d, rest) = (ms / DAY_MS, ms % DAY_MS);
    let (h, rest) = (rest / HOUR_MS, rest % HOUR_MS);
    let (m, rest) = (rest / MINUTE_MS, rest % MINUTE_MS);
    let s = rest / SECOND_MS;
    for (n, unit) in [(d, "d"), (h, "h"), (m, "min"), (s, "s")] {
        if n > 0 {
            parts.push(format!("{n} {unit}"));
        }
    }
    if parts.is_empty() { format!("{ms} ms") } else { parts.join(" ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_shorter_than_the_horizon_is_warned_about_and_a_long_one_is_not() {
        // Sixteen RocketMQ retries: 4 h 45 min 40 s.
        let sixteen = 4 * HOUR_MS + 45 * MINUTE_MS + 40 * SECOND_MS;
        assert_eq!(check_dedup_retention(90 * DAY_MS, sixteen, 72 * HOUR_MS, false), None);
        let w = check_dedup_retention(3 * DAY_MS, sixteen, 72 * HOUR_MS, false).expect("a warning");
        assert_eq!(w.horizon_ms(), 3 * DAY_MS + 4 * HOUR_MS + 45 * MINUTE_MS + 40 * SECOND_MS);
        let text = w.to_string();
        assert!(text.contains("(3 days) is shorter than") && text.contains("late_duplicate_guard"), "{text}");
    }

    #[test]
    fn ages_are_read_with_their_unit_and_nonsense_is_refused() {
        assert_eq!(parse_age("90d"), Ok(90 * DAY_MS));
        assert_eq!(parse_age("36h"), Ok(36 * HOUR_MS));
        assert_eq!(parse_age("45s"), Ok(45 * SECOND_MS));
        for bad in ["90", "d", "-1d", "0d", "9x", "99999999999999999d", "1.5d"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_log_retention_says_which_moments_it_no_longer_covers() {
        let r = LogRetention::days(14);
        let now = 100 * DAY_MS;
        assert!(r.is_beyond(now - 15 * DAY_MS, now));
        assert!(!r.is_beyond(now - 13 * DAY_MS, now));
        assert!(
            r.notice(now)
                .starts_with("The delivery log keeps 14 days: deliveries before 1970-03-28 00:00 UTC")
        );
    }
}
