//! The example traffic: orders, payment confirmations and stock deductions with JSON bodies and
//! business keys, with a chosen share of duplicates of each cause, payments that arrive before
//! their order (they fail and are retried), poison payments for orders that never exist (they
//! end dead-lettered) and malformed messages.
//!
//! This module only decides what is sent and keeps the books of what was sent; the demo feeds
//! it to the gate in process, and `produce` sends it to a real broker. It must not process.

use std::collections::{BTreeMap, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{self as shop, ConfirmPayment, CreateOrder, DeductStock};
use idemgate::delivery::Delivery;

/// What one send is, from the producer's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum SendKind {
    /// A business event sent for the first time.
    Original,
    /// The same message sent again (same UNIQ_KEY): the producer's client retrying after a
    /// lost send response. Through a broker it is a second stored copy, named `producer_retry`.
    ProducerRetry,
    /// The same business event as a new message (new UNIQ_KEY): a producer retry at the
    /// application level.
    ProducerResend,
    /// The same send again, after a pause.
    LateDuplicate,
    /// A payment for an order that never exists: fails on every attempt.
    Poison,
    /// A message with no usable key or body.
    Malformed,
}

impl SendKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Original => "original",
            Self::ProducerRetry => "producer_retry",
            Self::ProducerResend => "producer_resend",
            Self::LateDuplicate => "late_duplicate",
            Self::Poison => "poison",
            Self::Malformed => "malformed",
        }
    }
}

/// The shares of each kind of send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    /// Share of sends that duplicate an earlier one, split evenly over redelivery, producer
    /// resend and late duplicate.
    pub duplicates: f64,
    /// Share of payments sent before their order.
    pub early_payments: f64,
    pub poison: f64,
    pub malformed: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Self { duplicates: 0.3, early_payments: 0.05, poison: 0.01, malformed: 0.005 }
    }
}

/// One message to send. `msg_id` is left empty: the broker assigns it.
#[derive(Debug, Clone)]
pub(crate) struct Send {
    pub kind: SendKind,
    pub message: Delivery,
}

/// What was sent: the books a consumer's results are checked against.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tally {
    /// Sends by kind (`original`, `redelivery`, …).
    pub sends: BTreeMap<String, u64>,
    /// Distinct orders created.
    pub orders: u64,
    /// Distinct payments of existing orders.
    pub payments: u64,
    /// Distinct stock deductions, and the quantity each SKU must lose.
    pub deductions: u64,
    pub deducted: BTreeMap<String, i64>,
    /// Distinct poison keys.
    pub poison: u64,
}

/// A prefix for one run's business keys (`R20261129083647`), so that runs against one
/// database never collide.
pub fn run_id() -> String {
    chrono::Utc::now().format("R%Y%m%d%H%M%S").to_string()
}

/// A deterministic generator of the example traffic.
pub(crate) struct Traffic {
    rng: StdRng,
    mix: Mix,
    next_order: u64,
    /// Business sends still to go out for orders already begun, in order.
    queue: VecDeque<Delivery>,
    /// Recent originals, for duplicates.
    recent: VecDeque<Delivery>,
    /// Held back for a late duplicate: (sends to wait, message).
    late: VecDeque<(u64, Delivery)>,
    tally: Tally,
    run: String,
    topic: String,
}

const RECENT: usize = 256;
const LATE_AFTER_SENDS: u64 = 200;

impl Traffic {
    /// `run` prefixes every business key, so that runs against one database never collide;
    /// every message goes to `topic`.
    pub(crate) fn new(mix: Mix, seed: u64, run: &str, topic: &str) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            mix,
            next_order: 1,
            queue: VecDeque::new(),
            recent: VecDeque::with_capacity(RECENT),
            late: VecDeque::new(),
            tally: Tally::default(),
            run: run.to_owned(),
            topic: topic.to_owned(),
        }
    }

    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }

    /// The next message to send.
    pub(crate) fn next_send(&mut self) -> Send {
        let send = self.choose();
        *self.tally.sends.entry(send.kind.as_str().to_owned()).or_default() += 1;
        for held in &mut self.late {
            held.0 = held.0.saturating_sub(1);
        }
        send
    }

    /// The sends still owed to orders already begun (an order's deduction and payment follow
    /// it): send these after the last [`Traffic::next_send`] so that the books are whole.
    pub(crate) fn finish(&mut self) -> Vec<Send> {
        let rest: Vec<Send> =
            self.queue.drain(..).map(|message| Send { kind: SendKind::Original, message }).collect();
        *self.tally.sends.entry(SendKind::Original.as_str().to_owned()).or_default() += rest.len() as u64;
        rest
    }

    fn choose(&mut self) -> Send {
        if self.late.front().is_some_and(|(wait, _)| *wait == 0) {
            let (_, message) = self.late.pop_front().expect("checked");
            return Send { kind: SendKind::LateDuplicate, message };
        }
        let roll: f64 = self.rng.random();
        if roll < self.mix.malformed {
            return Send { kind: SendKind::Malformed, message: self.malformed() };
        }
        if roll < self.mix.malformed + self.mix.poison {
            return Send { kind: SendKind::Poison, message: self.poison() };
        }
        if roll < self.mix.malformed + self.mix.poison + self.mix.duplicates && !self.recent.is_empty() {
            let pick = self.rng.random_range(0..self.recent.len());
            let original = self.recent[pick].clone();
            match self.rng.random_range(0..3) {
                0 => {
                    return Send { kind: SendKind::ProducerRetry, message: original };
                }
                1 => {
                    let mut message = original;
                    message.uniq_key = self.uniq_key();
                    return Send { kind: SendKind::ProducerResend, message };
                }
                // The late copy goes out after a pause; this send is a new original.
                _ => self.late.push_back((LATE_AFTER_SENDS, original)),
            }
        }
        let message = self.next_original();
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(message.clone());
        Send { kind: SendKind::Original, message }
    }

    fn next_original(&mut self) -> Delivery {
        if let Some(m) = self.queue.pop_front() {
            return m;
        }
        let n = self.next_order;
        self.next_order += 1;
        let order_no = format!("{}-O-{n}", self.run);
        let sku = shop::SKUS[self.rng.random_range(0..shop::SKUS.len())];
        let quantity = self.rng.random_range(1..=3);
        let amount_cents = quantity * 1_250;
        let order = self.message(
            shop::TAG_ORDER_CREATE,
            &order_no,
            serde_json::to_vec(&CreateOrder {
                order_no: order_no.clone(),
                user_id: format!("user-{}", n % 97),
                sku: sku.to_owned(),
                quantity,
                amount_cents,
            }),
        );
        let deduction_id = format!("{}-D-{n}", self.run);
        let deduct = self.message(
            shop::TAG_STOCK_DEDUCT,
            &deduction_id,
            serde_json::to_vec(&DeductStock { sku: sku.to_owned(), quantity }),
        );
        let payment_no = format!("{}-P-{n}", self.run);
        let pay = self.message(
            shop::TAG_PAYMENT_CONFIRM,
            &payment_no,
            serde_json::to_vec(&ConfirmPayment { order_no, payment_no: payment_no.clone(), amount_cents }),
        );
        self.tally.orders += 1;
        self.tally.payments += 1;
        self.tally.deductions += 1;
        *self.tally.deducted.entry(sku.to_owned()).or_default() += quantity;
        if self.rng.random_bool(self.mix.early_payments) {
            self.queue.extend([order, deduct]);
            pay
        } else {
            self.queue.extend([deduct, pay]);
            order
        }
    }

    fn poison(&mut self) -> Delivery {
        self.tally.poison += 1;
        let n = self.tally.poison;
        let payment_no = format!("{}-POISON-{n}", self.run);
        self.message(
            shop::TAG_PAYMENT_CONFIRM,
            &payment_no,
            serde_json::to_vec(&ConfirmPayment {
                order_no: format!("{}-NO-SUCH-ORDER-{n}", self.run),
                payment_no: payment_no.clone(),
                amount_cents: 100,
            }),
        )
    }

    fn malformed(&mut self) -> Delivery {
        let n = self.tally.sends.get(SendKind::Malformed.as_str()).copied().unwrap_or(0);
        let mut m = self.message(shop::TAG_STOCK_DEDUCT, "", Ok(b"{\"sku\": ".to_vec()));
        match n % 3 {
            0 => m.keys.clear(),
            1 => m.keys = vec![format!("{}-BAD<script>alert({n})</script>", self.run)],
            _ => m.keys = vec![format!("{}-D-TRUNCATED-{n}", self.run)],
        }
        m
    }

    fn message(&mut self, tag: &str, key: &str, body: serde_json::Result<Vec<u8>>) -> Delivery {
        Delivery {
            uniq_key: self.uniq_key(),
            topic: self.topic.clone(),
            tags: tag.to_owned(),
            keys: vec![key.to_owned()],
            body: body.expect("the example bodies always serialize"),
            ..Default::default()
        }
    }

    /// A fresh UNIQ_KEY in RocketMQ's 32-hex-digit form. Drawn from the thread's entropy, not
    /// the seeded generator: two runs with one seed must still never share a UNIQ_KEY.
    fn uniq_key(&mut self) -> String {
        idemgate::delivery::new_message_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_has_the_asked_share_of_duplicates_and_every_kind() {
        let mut t = Traffic::new(Mix::default(), 7, "T", shop::TOPIC);
        let sends: Vec<Send> = (0..20_000).map(|_| t.next_send()).collect();
        let count = |k: SendKind| sends.iter().filter(|s| s.kind == k).count() as f64;
        let dups =
            count(SendKind::ProducerRetry) + count(SendKind::ProducerResend) + count(SendKind::LateDuplicate);
        let share = dups / sends.len() as f64;
        assert!((0.27..0.33).contains(&share), "duplicate share {share}");
        for kind in [
            SendKind::ProducerRetry,
            SendKind::ProducerResend,
            SendKind::LateDuplicate,
            SendKind::Poison,
            SendKind::Malformed,
        ] {
            assert!(count(kind) > 0.0, "{kind:?}");
        }
        // A resend keeps the business key and body and changes the UNIQ_KEY.
        let resend = sends.iter().find(|s| s.kind == SendKind::ProducerResend).unwrap();
        let original = sends
            .iter()
            .find(|s| s.kind == SendKind::Original && s.message.keys == resend.message.keys)
            .unwrap();
        assert_eq!(original.message.body, resend.message.body);
        assert_ne!(original.message.uniq_key, resend.message.uniq_key);
        assert_eq!(t.tally().orders, t.tally().payments);
        // Finishing sends what the begun orders still owe: every order has its three messages.
        let rest = t.finish();
        let originals = sends.iter().chain(rest.iter()).filter(|s| s.kind == SendKind::Original);
        let by_tag = |tag: &str| originals.clone().filter(|s| s.message.tags == tag).count() as u64;
        assert_eq!(by_tag(shop::TAG_ORDER_CREATE), t.tally().orders);
        assert_eq!(by_tag(shop::TAG_PAYMENT_CONFIRM), t.tally().payments);
        assert_eq!(by_tag(shop::TAG_STOCK_DEDUCT), t.tally().deductions);
        assert!(t.finish().is_empty());
    }

    #[test]
    fn the_same_seed_gives_the_same_traffic() {
        let keys = |seed| {
            let mut t = Traffic::new(Mix::default(), seed, "R", shop::TOPIC);
            (0..500).map(|_| t.next_send().message.keys.join(",")).collect::<Vec<_>>()
        };
        assert_eq!(keys(1), keys(1));
        assert_ne!(keys(1), keys(2));
    }
}
