//! A rate limit for log lines, so that a storm of duplicates or of invalid deliveries cannot
//! flood the log.
//!
//! Each window lets a fixed number of events through; the rest are counted, and the first line
//! of the next window says how many were held back. It owns no logging itself.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct Throttle {
    per_window: u32,
    window: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    started: Instant,
    passed: u32,
    held_back: u64,
}

/// Whether to emit, and how many lines were held back since the last one emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    Emit { held_back: u64 },
    Hold,
}

impl Throttle {
    pub(crate) fn new(per_window: u32, window: Duration) -> Self {
        Self {
            per_window,
            window,
            state: Mutex::new(State { started: Instant::now(), passed: 0, held_back: 0 }),
        }
    }

    pub(crate) fn check(&self) -> Permit {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Permit {
        // A std Mutex: the critical section is a few integer operations and never awaits.
        let mut s = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if now.duration_since(s.started) >= self.window {
            s.started = now;
            s.passed = 0;
        }
        if s.passed < self.per_window {
            s.passed += 1;
            let held_back = std::mem::take(&mut s.held_back);
            Permit::Emit { held_back }
        } else {
            s.held_back += 1;
            Permit::Hold
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storm_is_cut_to_the_window_budget_and_the_rest_is_counted() {
        let t = Throttle::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let permits: Vec<_> = (0..10).map(|_| t.check_at(t0)).collect();
        assert_eq!(permits.iter().filter(|p| matches!(p, Permit::Emit { .. })).count(), 3);
        assert_eq!(t.check_at(t0 + Duration::from_millis(1500)), Permit::Emit { held_back: 7 });
        assert_eq!(t.check_at(t0 + Duration::from_millis(1600)), Permit::Emit { held_back: 0 });
    }
}
