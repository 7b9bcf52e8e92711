//! Ambiguous commits: a COMMIT whose connection died before its answer came back. The server
//! may have committed or not; the gate cannot tell from the error. It remembers, in memory, which
//! delivery's commit of which key was ambiguous ([`Unsettled`]), so that
//!
//! - its own retry, when it finds the claim of that same delivery (its msgId), logs a
//!   `duplicate` with cause [`DuplicateCause::AmbiguousCommit`](crate::outcome::DuplicateCause),
//!   not a broker `redelivery`: no broker sent anything again;
//! - when its retries run out, it reads the claim back on a fresh connection before answering
//!   ([`super::core`]): a claim of this delivery means the effect, and its `processed` row,
//!   committed, and the delivery is acknowledged, not logged `failed`.
//!
//! The memory is per process and bounded: it only bridges one delivery's retries inside the
//! gate. A key is forgotten as soon as its delivery's fate is known; when the memory is full a
//! further ambiguous commit is not remembered, and its retry is named from the claim alone as
//! before (`redelivery`), never wrongly `ambiguous_commit`.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::delivery::Delivery;
use crate::outcome::Claim;
use crate::route::BizKey;

/// The most keys remembered at once: far more than the deliveries in flight in one process.
const CAPACITY: usize = 65_536;

/// A key as one gate claims it (the consumer group is the gate's own).
type Key = (String, String, i64);

fn key_of(key: &BizKey) -> Key {
    (key.biz_type.clone(), key.biz_id.clone(), key.execute_time)
}

/// The keys whose last commit was ambiguous, each with the msgId of the delivery that sent it.
#[derive(Debug, Default)]
pub(super) struct Unsettled {
    keys: Mutex<HashMap<Key, String>>,
}

impl Unsettled {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<Key, String>> {
        self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `d`'s commit of `key` lost its answer.
    pub(super) fn remember(&self, key: &BizKey, d: &Delivery) {
        let mut keys = self.keys();
        if keys.len() >= CAPACITY && !keys.contains_key(&key_of(key)) {
            tracing::warn!(
                capacity = CAPACITY,
                "too many ambiguous commits unsettled at once; this one's retry is named from its claim alone"
            );
            return;
        }
        keys.insert(key_of(key), d.msg_id.clone());
    }

    /// Whether `d`'s commit of `key` is remembered as ambiguous.
    pub(super) fn holds(&self, key: &BizKey, d: &Delivery) -> bool {
        self.keys().get(&key_of(key)).is_some_and(|m| *m == d.msg_id)
    }

    /// `d`'s fate at `key` is known: forget it.
    pub(super) fn forget(&self, key: &BizKey, d: &Delivery) {
        let mut keys = self.keys();
        if keys.get(&key_of(key)).is_some_and(|m| *m == d.msg_id) {
            keys.remove(&key_of(key));
        }
    }

    /// Whether `earlier`, the claim that now holds `key`, is `d`'s own, made by a commit of `d`
    /// that lost its answer. Settles the key either way.
    pub(super) fn is_own_claim(&self, key: &BizKey, d: &Delivery, earlier: Option<&Claim>) -> bool {
        let mut keys = self.keys();
        let k = key_of(key);
        match keys.get(&k) {
            Some(m) if *m == d.msg_id => {
                keys.remove(&k);
                earlier.is_some_and(|c| c.msg_id == d.msg_id)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> BizKey {
        BizKey { biz_type: "t".into(), biz_id: id.into(), execute_time: 0, handler: "h".into() }
    }

    fn delivery(msg_id: &str) -> Delivery {
        Delivery { msg_id: msg_id.into(), uniq_key: "U".into(), ..Default::default() }
    }

    fn claim(msg_id: &str) -> Claim {
        Claim { msg_id: msg_id.into(), uniq_key: "U".into(), payload_hash: "h".into() }
    }

    #[test]
    fn only_the_delivery_whose_commit_was_ambiguous_finds_its_own_claim() {
        let unsettled = Unsettled::default();
        let (first, redelivered) = (delivery("M1"), delivery("M2"));
        unsettled.remember(&key("k"), &first);
        // Another delivery of the key (a broker's redelivery) is not the gate's own retry.
        assert!(!unsettled.is_own_claim(&key("k"), &redelivered, Some(&claim("M1"))));
        assert!(unsettled.holds(&key("k"), &first));
        // A claim of another delivery: the ambiguous commit did not commit.
        assert!(!unsettled.is_own_claim(&key("k"), &first, Some(&claim("M0"))));
        assert!(!unsettled.holds(&key("k"), &first), "settled either way");

        unsettled.remember(&key("k"), &first);
        assert!(!unsettled.is_own_claim(&key("other"), &first, Some(&claim("M1"))));
        assert!(unsettled.is_own_claim(&key("k"), &first, Some(&claim("M1"))));
        assert!(!unsettled.is_own_claim(&key("k"), &first, Some(&claim("M1"))), "once");
    }

    #[test]
    fn a_forgotten_key_is_no_longer_ambiguous() {
        let unsettled = Unsettled::default();
        let d = delivery("M1");
        unsettled.remember(&key("k"), &d);
        unsettled.forget(&key("k"), &delivery("M9"));
        assert!(unsettled.holds(&key("k"), &d), "only its own delivery forgets it");
        unsettled.forget(&key("k"), &d);
        assert!(!unsettled.holds(&key("k"), &d));
    }
}
