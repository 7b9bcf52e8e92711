//! The Redis pre-filter: a `SET key value NX EX ttl` in front of the database claim, for the
//! biz_types where most deliveries are duplicates and the database should not see them.
//!
//! The database's unique index stays the arbiter; Redis only answers early for keys it knows
//! are finished:
//! - `SET NX` took the key: this delivery owns the Redis key (its value is a random token) and
//!   goes on to the database claim. After the commit the value becomes `done:` plus the claim
//!   (msgId, UNIQ_KEY, payload hash), so later copies are classified without the database. A
//!   rollback deletes the key, but only while it still holds this delivery's token: a delivery
//!   that outlived the TTL never deletes the key of the delivery that came after it.
//! - The key holds `done:…`: the delivery is a duplicate at layer `redis`; no claim, no
//!   transaction, only its delivery-log row.
//! - The key holds another delivery's token (it has not finished): the database decides, as it
//!   would without Redis (the insert waits for that transaction).
//! - Redis is down, or slower than `timeout_ms`: the database decides alone. The failure opens
//!   a circuit: deliveries stop asking Redis, so an outage costs at most the deliveries already
//!   waiting one timeout each, and a probe in the background pings Redis every `cooldown_ms`;
//!   its first answer closes the circuit. Every fallback is counted by cause.
//!
//! Correctness never depends on Redis: a lost key, an expired one or a Redis restarted empty
//! only sends a duplicate on to the database, where the unique index stops it. The TTL is short
//! by design; the database holds the claim for the whole retention.
//!
//! This module owns the Redis commands and the circuit. It must not touch the database.

use crate::setting::{Invalid, invalid};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};

use crate::delivery::Delivery;
use crate::labelled::labelled;
use crate::outcome::Claim;
use crate::route::BizKey;

labelled! {
    /// What the pre-filter said about one delivery.
    Step {
        /// `SET NX` took the key; the database claim follows.
        Claimed => "claimed",
        /// A finished claim holds the key: skipped as a duplicate at layer `redis`.
        Duplicate => "duplicate",
        /// Another delivery holds the key and has not finished: the database decides.
        InFlight => "in_flight",
        /// Redis was not asked or did not answer: the database decides alone.
        Fallback => "fallback",
    }
}

labelled! {
    /// Why the pre-filter fell back to the database alone.
    FallbackCause {
        /// Redis did not answer within `timeout_ms`.
        Timeout => "timeout",
        /// Redis answered with an error, or the connection failed.
        Error => "error",
        /// A recent failure opened the circuit; Redis was not asked.
        CircuitOpen => "circuit_open",
    }
}

labelled! {
    /// What became of the Redis key a delivery owned.
    Settled {
        /// Marked `done` after the commit (or after the database found the key taken).
        Done => "done",
        /// Deleted after a rollback.
        Released => "released",
        /// The key no longer held this delivery's token (it expired and another delivery took
        /// it): left alone.
        NotOwner => "not_owner",
        /// Redis did not answer; the key expires by its TTL.
        Failed => "failed",
    }
}

/// What the pre-filter found for one delivery.
#[derive(Debug)]
pub enum Check {
    /// This delivery owns the key until [`Prefilter::settle`].
    Owned(Token),
    /// A finished claim holds the key; its claim when Redis's value could be read.
    Duplicate(Option<Claim>),
    InFlight,
    Fallback(FallbackCause),
}

impl Check {
    pub fn step(&self) -> Step {
        match self {
            Check::Owned(_) => Step::Claimed,
            Check::Duplicate(_) => Step::Duplicate,
            Check::InFlight => Step::InFlight,
            Check::Fallback(_) => Step::Fallback,
        }
    }
}

/// What the pre-filter did for one delivery, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefilterReport {
    pub step: Step,
    pub fallback: Option<FallbackCause>,
    /// For a delivery that owned its key: what became of it.
    pub settled: Option<Settled>,
}

impl PrefilterReport {
    pub fn of(check: &Check) -> Self {
        let fallback = match check {
            Check::Fallback(cause) => Some(*cause),
            _ => None,
        };
        Self { step: check.step(), fallback, settled: None }
    }
}

/// A Redis key owned by one delivery.
#[derive(Debug)]
pub struct Token {
    key: String,
    value: String,
}

/// How a delivery that owned its key ended.
#[derive(Debug)]
pub enum Settle<'a> {
    /// The claim is in the database (this delivery's, or the earlier one that was found).
    Done(&'a Claim),
    /// Nothing was committed: the key must go, so a retry is not taken for a duplicate.
    Release,
}

/// `[redis]`: the pre-filter's settings. `Debug` masks the URL's password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `IDEMGATE_REDIS__URL`: `redis://[:password@]host:port[/db]`. Empty: no pre-filter.
    pub url: String,
    /// `IDEMGATE_REDIS__BIZ_TYPES`: the biz_types that use the pre-filter; `["*"]` for every
    /// route's biz_type.
    pub biz_types: Vec<String>,
    /// `IDEMGATE_REDIS__TTL_SECONDS`: how long Redis remembers a key. Short on purpose: the
    /// database remembers it for the whole retention; Redis only has to catch the burst of
    /// copies that follows a message (retries, resends, a rebalance).
    pub ttl_seconds: u64,
    /// `IDEMGATE_REDIS__TIMEOUT_MS`: the longest a delivery waits for Redis before it falls
    /// back to the database alone.
    pub timeout_ms: u64,
    /// `IDEMGATE_REDIS__COOLDOWN_MS`: after a Redis failure, how often a background probe asks
    /// Redis whether it answers again; deliveries skip Redis until it does.
    pub cooldown_ms: u64,
    /// `IDEMGATE_REDIS__KEY_PREFIX`: the first part of every key idemgate writes.
    pub key_prefix: String,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: String::new(),
            biz_types: vec!["*".to_owned()],
            ttl_seconds: 600,
            timeout_ms: 5,
            cooldown_ms: 1_000,
            key_prefix: "idemgate".to_owned(),
        }
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &crate::store::redact_url(&self.url))
            .field("biz_types", &self.biz_types)
            .field("ttl_seconds", &self.ttl_seconds)
            .field("timeout_ms", &self.timeout_ms)
            .field("cooldown_ms", &self.cooldown_ms)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl RedisSettings {
    pub fn enabled(&self) -> bool {
        !self.url.is_empty()
    }

    /// A copy with the URL's password masked, for printing.
    pub fn redacted(&self) -> Self {
        Self { url: crate::store::redact_url(&self.url), ..self.clone() }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        let bad = |key: &str, message: &str| Err(invalid(key, message));
        if self.enabled() {
            if !(self.url.starts_with("redis://") || self.url.starts_with("rediss://")) {
                return bad("redis.url", "must start with redis:// or rediss://");
            }
            if let Err(e) = redis::Client::open(self.url.as_str()) {
                let shown = crate::store::redact_url(&self.url);
                return Err(invalid("redis.url", format!("{shown:?} is not a Redis URL ({e})")));
            }
        }
        if self.biz_types.is_empty() {
            return bad("redis.biz_types", "is empty; use [\"*\"] for every biz_type");
        }
        for t in &self.biz_types {
            if t != "*" {
                crate::route::check_key_text(t, crate::route::MAX_BIZ_TYPE_CHARS)
                    .map_err(|m| invalid("redis.biz_types", format!("{t:?}: {m}")))?;
            }
        }
        if !(1..=86_400).contains(&self.ttl_seconds) {
            return bad("redis.ttl_seconds", "must be from 1 to 86400");
        }
        if !(1..=1_000).contains(&self.timeout_ms) {
            return bad("redis.timeout_ms", "must be from 1 to 1000");
        }
        if !(10..=600_000).contains(&self.cooldown_ms) {
            return bad("redis.cooldown_ms", "must be from 10 to 600000");
        }
        if self.key_prefix.is_empty()
            || self.key_prefix.len() > 64
            || self.key_prefix.chars().any(char::is_whitespace)
        {
            return bad("redis.key_prefix", "must be 1 to 64 characters without whitespace");
        }
        Ok(())
    }
}

/// The Redis value of a finished claim.
#[derive(Debug, Serialize, Deserialize)]
struct DoneValue {
    #[serde(rename = "m")]
    msg_id: String,
    #[serde(rename = "u")]
    uniq_key: String,
    #[serde(rename = "h")]
    payload_hash: String,
}

const DONE: &str = "done:";
const CLAIMING: &str = "claiming:";

/// Sets the value only while the key still holds this delivery's token.
static MARK_DONE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then \
           redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) return 1 end return 0",
    )
});
/// Deletes the key only while it still holds this delivery's token.
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// The pre-filter: one multiplexed, self-reconnecting connection shared by every delivery.
pub struct Prefilter {
    conn: ConnectionManager,
    all_biz_types: bool,
    biz_types: BTreeSet<String>,
    key_prefix: String,
    ttl_seconds: u64,
    timeout: Duration,
    cooldown: Duration,
    /// Set while Redis is considered down; the probe clears it.
    open: Arc<AtomicBool>,
    commands: AtomicU64,
}

impl std::fmt::Debug for Prefilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefilter")
            .field("biz_types", &self.biz_types)
            .field("ttl_seconds", &self.ttl_seconds)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Prefilter {
    /// Prepares the connection without waiting for Redis: a Redis that is down at start is a
    /// fallback like any other, not a reason to stop consuming.
    pub fn new(settings: &RedisSettings) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(settings.url.as_str())?;
        let timeout = Duration::from_millis(settings.timeout_ms);
        // The client's own response timeout (500 ms by default) would cut a wait that
        // `timeout_ms` allows and call it an error: it is set past this pre-filter's own, which
        // is what decides.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout * 2 + Duration::from_millis(100)))
            .set_connection_timeout(Some(Duration::from_millis(250)))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(250));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self {
            conn,
            all_biz_types: settings.biz_types.iter().any(|t| t == "*"),
            biz_types: settings.biz_types.iter().cloned().collect(),
            key_prefix: settings.key_prefix.clone(),
            ttl_seconds: settings.ttl_seconds,
            timeout,
            cooldown: Duration::from_millis(settings.cooldown_ms),
            open: Arc::new(AtomicBool::new(false)),
            commands: AtomicU64::new(0),
        })
    }

    /// True when deliveries of `biz_type` go through the pre-filter.
    pub fn covers(&self, biz_type: &str) -> bool {
        self.all_biz_types || self.biz_types.contains(biz_type)
    }

    /// False while the circuit is open: Redis failed and the probe has not heard from it since.
    pub fn available(&self) -> bool {
        !self.open.load(Ordering::Acquire)
    }

    /// Commands sent to Redis so far (for the benchmarks' per-message figures).
    pub fn commands_sent(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }

    /// The Redis key of a claim key: every part but the last is length-prefixed, so no two
    /// keys share a Redis key whatever punctuation their parts hold.
    pub fn redis_key(&self, consumer_group: &str, key: &BizKey) -> String {
        format!(
            "{}:{}:{}:{}:{}:{}:{}",
            self.key_prefix,
            consumer_group.len(),
            consumer_group,
            key.biz_type.len(),
            key.biz_type,
            key.execute_time,
            key.biz_id
        )
    }

    /// `SET key token NX EX ttl GET`: takes the key, or reads who holds it, in one round trip.
    pub async fn check(&self, consumer_group: &str, key: &BizKey) -> Check {
        if self.open.load(Ordering::Acquire) {
            return Check::Fallback(FallbackCause::CircuitOpen);
        }
        let redis_key = self.redis_key(consumer_group, key);
        let value = format!("{CLAIMING}{:032x}", rand::random::<u128>());
        let mut cmd = redis::cmd("SET");
        cmd.arg(&redis_key).arg(&value).arg("NX").arg("EX").arg(self.ttl_seconds).arg("GET");
        let mut conn = self.conn.clone();
        self.commands.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::time::timeout(self.timeout, cmd.query_async::<Option<String>>(&mut conn)).await;
        match answer {
            Err(_) => {
                self.trip(FallbackCause::Timeout, "no answer in time");
                Check::Fallback(FallbackCause::Timeout)
            }
            Ok(Err(e)) => {
                self.trip(FallbackCause::Error, &e.to_string());
                Check::Fallback(FallbackCause::Error)
            }
            Ok(Ok(held)) => match held {
                None => Check::Owned(Token { key: redis_key, value }),
                Some(v) => match v.strip_prefix(DONE) {
                    Some(done) => Check::Duplicate(serde_json::from_str::<DoneValue>(done).ok().map(|d| {
                        Claim { msg_id: d.msg_id, uniq_key: d.uniq_key, payload_hash: d.payload_hash }
                    })),
                    None => Check::InFlight,
                },
            },
        }
    }

    /// Marks the key done or releases it, only while it still holds `token`'s value.
    pub async fn settle(&self, token: Token, how: Settle<'_>) -> Settled {
        let mut conn = self.conn.clone();
        self.commands.fetch_add(1, Ordering::Relaxed);
        let call =
            match how {
                Settle::Done(claim) => {
                    let done = DoneValue {
                        msg_id: claim.msg_id.clone(),
                        uniq_key: claim.uniq_key.clone(),
                        payload_hash: claim.payload_hash.clone(),
                    };
                    let value = format!("{DONE}{}", serde_json::to_string(&done).unwrap_or_default());
                    let mut invocation = MARK_DONE.prepare_invoke();
                    invocation.key(&token.key).arg(&token.value).arg(value).arg(self.ttl_seconds);
                    tokio::time::timeout(self.timeout, async move {
                        invocation.invoke_async::<i64>(&mut conn).await
                    })
                    .await
                    .map(|r| r.map(|n| if n == 1 { Settled::Done } else { Settled::NotOwner }))
                }
                Settle::Release => {
                    let mut invocation = RELEASE.prepare_invoke();
                    invocation.key(&token.key).arg(&token.value);
                    tokio::time::timeout(self.timeout, async move {
                        invocation.invoke_async::<i64>(&mut conn).await
                    })
                    .await
                    .map(|r| r.map(|n| if n == 1 { Settled::Released } else { Settled::NotOwner }))
                }
            };
        match call {
            Ok(Ok(settled)) => settled,
            Ok(Err(e)) => {
                self.trip(FallbackCause::Error, &e.to_string());
                Settled::Failed
            }
            Err(_) => {
                self.trip(FallbackCause::Timeout, "no answer in time");
                Settled::Failed
            }
        }
    }

    /// Waits (up to a second) for Redis to answer a PING, so that the first deliveries do not
    /// pay for connecting. False when it does not answer: the circuit opens and the probe
    /// takes over.
    pub async fn warm_up(&self) -> bool {
        let mut conn = self.conn.clone();
        let ping = redis::cmd("PING");
        match tokio::time::timeout(Duration::from_secs(1), ping.query_async::<String>(&mut conn)).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                self.trip(FallbackCause::Error, &e.to_string());
                false
            }
            Err(_) => {
                self.trip(FallbackCause::Timeout, "no answer within 1 s");
                false
            }
        }
    }

    /// Opens the circuit and, if it was closed, starts the probe that closes it again.
    fn trip(&self, cause: FallbackCause, detail: &str) {
        if self.open.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(
            cause = %cause, detail, probe_every_ms = self.cooldown.as_millis() as u64,
            "the Redis pre-filter is unavailable; the database alone stops duplicates until Redis answers again"
        );
        let (mut conn, open, every, timeout) =
            (self.conn.clone(), self.open.clone(), self.cooldown, self.timeout);
        // A probe's answer may be slower than a delivery may wait, but not by much.
        let patience = (timeout * 10).max(Duration::from_millis(50));
        tokio::spawn(async move {
            let down_since = Instant::now();
            loop {
                tokio::time::sleep(every).await;
                let ping = redis::cmd("PING");
                if let Ok(Ok(_)) = tokio::time::timeout(patience, ping.query_async::<String>(&mut conn)).await
                {
                    open.store(false, Ordering::Release);
                    tracing::info!(
                        down_ms = down_since.elapsed().as_millis() as u64,
                        "the Redis pre-filter answers again"
                    );
                    return;
                }
            }
        });
    }
}

/// The claim a delivery makes, as the pre-filter remembers it.
pub(crate) fn claim_of(d: &Delivery, payload_hash: &str) -> Claim {
    Claim { msg_id: d.msg_id.clone(), uniq_key: d.uniq_key.clone(), payload_hash: payload_hash.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(biz_type: &str, biz_id: &str, execute_time: i64) -> BizKey {
        BizKey { biz_type: biz_type.into(), biz_id: biz_id.into(), execute_time, handler: String::new() }
    }

    #[tokio::test]
    async fn redis_keys_of_different_claim_keys_never_meet() {
        let p = Prefilter::new(&RedisSettings { url: "redis://127.0.0.1:1".into(), ..Default::default() })
            .unwrap();
        let a = p.redis_key("g", &key("b:0", "x", 0));
        let b = p.redis_key("g", &key("b", "0:x", 0));
        assert_ne!(a, b);
        assert_eq!(
            p.redis_key("grp", &key("stock.deduct", "D-1", 5)),
            "idemgate:3:grp:12:stock.deduct:5:D-1"
        );
    }

    #[test]
    fn settings_are_checked_and_the_password_is_masked() {
        let ok = RedisSettings { url: "redis://:s3cret@127.0.0.1:6379/0".into(), ..Default::default() };
        ok.validate().unwrap();
        assert!(!format!("{ok:?}").contains("s3cret"));
        for (s, key) in [
            (RedisSettings { url: "http://x".into(), ..Default::default() }, "redis.url"),
            (RedisSettings { timeout_ms: 0, ..Default::default() }, "redis.timeout_ms"),
            (RedisSettings { ttl_seconds: 0, ..Default::default() }, "redis.ttl_seconds"),
            (RedisSettings { cooldown_ms: 5, ..Default::default() }, "redis.cooldown_ms"),
            (RedisSettings { biz_types: vec![], ..Default::default() }, "redis.biz_types"),
            (RedisSettings { biz_types: vec!["a b".into()], ..Default::default() }, "redis.biz_types"),
        ] {
            assert_eq!(s.validate().unwrap_err().key, key);
        }
    }

    #[tokio::test]
    async fn a_redis_that_is_not_there_is_a_bounded_fallback_and_opens_the_circuit() {
        // Port 1: nothing listens, the connection is refused at once.
        let p = Prefilter::new(&RedisSettings { url: "redis://127.0.0.1:1".into(), ..Default::default() })
            .unwrap();
        let started = Instant::now();
        let first = p.check("g", &key("t", "x", 0)).await;
        assert!(matches!(first, Check::Fallback(FallbackCause::Timeout | FallbackCause::Error)), "{first:?}");
        assert!(matches!(p.check("g", &key("t", "y", 0)).await, Check::Fallback(FallbackCause::CircuitOpen)));
        assert!(started.elapsed() < Duration::from_millis(500));
    }
}
