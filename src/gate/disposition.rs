//! The gate's answer for one delivery, and where its time went.

use std::time::Duration;

use crate::delivery::Delivery;
use crate::handler::Effect;
use crate::outcome::{DuplicateCause, Layer, Outcome, Verdict};
use crate::route::{BizKey, MAX_ID_CHARS, Rejection, excerpt};
use crate::throttle::{Permit, Throttle};

/// Where the time of one delivery went, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    pub begin_us: u64,
    pub claim_us: u64,
    pub handler_us: u64,
    pub log_us: u64,
    pub commit_us: u64,
    /// Reading the earlier claim of a duplicate, to name its cause.
    pub lookup_us: u64,
    /// Asking the Redis pre-filter and settling its key.
    pub redis_us: u64,
    /// Transient conflicts (deadlock, busy file) retried inside the gate.
    pub transient_retries: u32,
    /// With group commit: the deliveries that shared this one's transaction, itself included
    /// (0 when it had a transaction of its own).
    pub group_size: u32,
}

impl Phases {
    /// This delivery's share: a group's shared phases (begin, claim, lookup, log, commit)
    /// divided among the deliveries that shared them; its own handler and Redis time whole.
    pub fn per_delivery(&self) -> Phases {
        self.divided(u64::from(self.group_size.max(1)), false)
    }

    /// The mean of the `n` deliveries these phases sum: every time divided by `n`, the retries
    /// as summed.
    pub fn mean_over(&self, n: u64) -> Phases {
        Phases { group_size: 0, ..self.divided(n.max(1), true) }
    }

    /// The shared phases (begin, claim, lookup, log, commit) divided by `n`, and with `all` the
    /// delivery's own (handler, Redis) too.
    fn divided(&self, n: u64, all: bool) -> Phases {
        let own = if all { n } else { 1 };
        Phases {
            begin_us: self.begin_us / n,
            claim_us: self.claim_us / n,
            lookup_us: self.lookup_us / n,
            log_us: self.log_us / n,
            commit_us: self.commit_us / n,
            handler_us: self.handler_us / own,
            redis_us: self.redis_us / own,
            ..*self
        }
    }

    pub fn add(&mut self, other: &Phases) {
        self.begin_us += other.begin_us;
        self.claim_us += other.claim_us;
        self.handler_us += other.handler_us;
        self.log_us += other.log_us;
        self.commit_us += other.commit_us;
        self.lookup_us += other.lookup_us;
        self.redis_us += other.redis_us;
        self.transient_retries += other.transient_retries;
    }
}

/// The gate's answer for one delivery.
#[derive(Debug, Clone)]
pub struct Disposition {
    pub outcome: Outcome,
    pub verdict: Verdict,
    /// The key, when one could be read.
    pub key: Option<BizKey>,
    pub cause: Option<DuplicateCause>,
    pub layer: Option<Layer>,
    /// For duplicates: whether the body matches the claim's. `Some(false)` is a key collision.
    pub payload_match: Option<bool>,
    pub error: Option<String>,
    pub latency: Duration,
    /// Whether the delivery-log row was written. A delivery whose row could not be written is
    /// never acknowledged.
    pub logged: bool,
    pub phases: Phases,
    /// What the Redis pre-filter did, for deliveries of a biz_type it covers.
    pub prefilter: Option<crate::prefilter::PrefilterReport>,
}

/// A delivery whose effect committed: `processed`, or a duplicate the handler itself found
/// (a state-machine move already made).
pub(super) fn committed_disposition(
    d: &Delivery,
    key: BizKey,
    effect: &Effect,
    phases: Phases,
) -> Disposition {
    let (outcome, layer) = match effect {
        Effect::Applied => (Outcome::Processed, None),
        Effect::AlreadyApplied { layer, .. } => (Outcome::Duplicate, Some(*layer)),
    };
    Disposition {
        outcome,
        verdict: Verdict::Ack,
        key: Some(key),
        cause: replay_cause(d).or(layer.map(|_| DuplicateCause::Unknown)),
        layer,
        payload_match: None,
        error: None,
        latency: Duration::ZERO,
        logged: true,
        phases,
        prefilter: None,
    }
}

/// An unreadable key: logged `invalid` with the reason and the body. The returned key holds
/// what could be read of it, for the log row. The WARN line is rate-limited by `warnings`, as
/// duplicates' are: a producer that sends nothing but bad keys cannot flood the log, and the
/// next line says how many were held back (every one is in the delivery log and the metrics).
pub(super) fn rejection_disposition(
    d: &Delivery,
    rejection: Rejection,
    warnings: &Throttle,
) -> (Disposition, BizKey) {
    if let Permit::Emit { held_back } = warnings.check() {
        tracing::warn!(
            msg_id = ?excerpt(&d.msg_id, MAX_ID_CHARS), topic = ?excerpt(&d.topic, 64),
            reason = %rejection.reason, similar_warnings_held_back = held_back, "invalid delivery"
        );
    }
    let disposition = Disposition {
        outcome: Outcome::Invalid,
        verdict: Verdict::Ack,
        key: None,
        cause: None,
        layer: None,
        payload_match: None,
        error: Some(rejection.reason),
        latency: Duration::ZERO,
        logged: false,
        phases: Phases::default(),
        prefilter: None,
    };
    let key = BizKey {
        biz_type: rejection.biz_type,
        biz_id: rejection.biz_id,
        execute_time: 0,
        handler: String::new(),
    };
    (disposition, key)
}

/// `replay` for a delivery re-published by `idemgate replay`, whatever its outcome: the log
/// then tells a replayed attempt from the original ones.
pub(super) fn replay_cause(d: &Delivery) -> Option<DuplicateCause> {
    d.is_replay().then_some(DuplicateCause::Replay)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The text of every log line written through it.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_storm_of_invalid_deliveries_logs_the_window_budget_and_counts_the_rest() {
        let log = Captured::default();
        let writer = log.clone();
        let subscriber =
            tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let warnings = Throttle::new(3, std::time::Duration::from_secs(1));
        let reject = |i: usize| {
            let d = Delivery { msg_id: format!("M-{i}"), topic: "shop".into(), ..Default::default() };
            let rejection = Rejection {
                reason: "biz_id: the message has no KEYS".into(),
                biz_type: String::new(),
                biz_id: String::new(),
            };
            let (r, _) = rejection_disposition(&d, rejection, &warnings);
            assert_eq!(r.outcome, Outcome::Invalid, "each is still an invalid delivery");
        };
        tracing::subscriber::with_default(subscriber, || {
            // Fifty within one window (a few milliseconds), then one in the next.
            (0..50).for_each(reject);
            std::thread::sleep(std::time::Duration::from_millis(1_100));
            reject(50);
        });
        let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("invalid delivery")).collect();
        assert_eq!(lines.len(), 4, "three of the fifty, then the next window's first: {text}");
        assert!(lines[..3].iter().all(|l| l.contains("similar_warnings_held_back=0")), "{text}");
        assert!(
            lines[3].contains("msg_id=\"M-50\"") && lines[3].contains("similar_warnings_held_back=47"),
            "{text}"
        );
    }
}
