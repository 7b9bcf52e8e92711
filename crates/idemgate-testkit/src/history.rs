//! A history checker, after Jepsen's total-queue checker: what the producer sent, what the
//! consumer was handed, and what the database holds afterwards, checked against the gate's
//! promises.
//!
//! A [`History`] is read after a run ([`History::read`]) or written by hand (the unit tests
//! below). It holds the producer's manifest (every acknowledged send: its key, UNIQ_KEY and
//! msgId), every delivery attempt handed to the gate (its msgId), the business effects (how
//! often each key was applied), the claims, the delivery log of the keys' biz_type, and what
//! the reconciler found. [`check`] holds it to these rules ([`Rule`]):
//!
//! 1. every acknowledged send's effect applied exactly once, and nothing applied that was not
//!    sent;
//! 2. every delivery attempt logged exactly once (a `duplicate` row with cause
//!    `ambiguous_commit` is the gate's own retry of an attempt whose COMMIT lost its answer, a
//!    note beside the attempt's `processed` row, which must be there), and no row of an attempt
//!    that was never made;
//! 3. no attempt recorded `failed` (or dead-lettered) whose effect committed: the claim of its
//!    key is that attempt's;
//! 4. no gate retry recorded as a broker `redelivery`: a `redelivery` row of the very msgId
//!    that holds the claim is the gate finding its own claim (every attempt of a run has a
//!    msgId of its own, as a broker's retry does);
//! 5. the reconciler reports nothing `lost` or `double_applied`.
//!
//! [`Checked`] prints a summary with counts and, when a rule is broken, the keys that break it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use idemgate::reconcile::settings::Runner;
use idemgate::reconcile::{AnomalyKind, ReconcileSettings, reconcile_once};
use idemgate::store::{Store, query_built};
use sqlx::Row;

/// One acknowledged send of the producer's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub biz_id: String,
    pub uniq_key: String,
    pub msg_id: String,
}

/// One delivery handed to the gate: its key and its msgId, its own in a run (a broker's retry
/// comes with a msgId of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub biz_id: String,
    pub msg_id: String,
}

/// The claim that holds a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRow {
    pub msg_id: String,
    pub uniq_key: String,
}

/// One row of the delivery log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRow {
    pub biz_id: String,
    pub msg_id: String,
    pub outcome: String,
    pub cause: Option<String>,
    /// The instance that logged it.
    pub instance_id: String,
}

impl LogRow {
    fn is_ambiguous_note(&self) -> bool {
        self.outcome == "duplicate" && self.cause.as_deref() == Some("ambiguous_commit")
    }
}

/// Everything a run left, of one consumer group and biz_type.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// The producer's manifest: every acknowledged send.
    pub sent: Vec<Sent>,
    /// Every delivery attempt handed to the gate.
    pub attempts: Vec<Attempt>,
    /// The attempts are not known: a run through a real broker, which hands the service
    /// deliveries the test never sees. Then "logged exactly once" is held only where the log
    /// alone can show it broken (an `ambiguous_commit` note without its attempt's `processed`
    /// row); the other rules hold as ever.
    pub attempts_unknown: bool,
    /// How many times each key's effect was applied (the business table).
    pub effects: BTreeMap<String, i64>,
    /// The claims, by bizId.
    pub claims: BTreeMap<String, ClaimRow>,
    pub log: Vec<LogRow>,
    /// The bizIds the reconciler reported `lost`, and `double_applied`.
    pub reconciled_lost: Vec<String>,
    pub reconciled_double: Vec<String>,
}

/// The rules of [`check`], in the order the module's documentation gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    AppliedExactlyOnce,
    LoggedExactlyOnce,
    NoFailedThatCommitted,
    NoGateRetryAsRedelivery,
    ReconcilerClean,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AppliedExactlyOnce => "every acknowledged send applied exactly once, nothing else applied",
            Self::LoggedExactlyOnce => "every delivery attempt logged exactly once",
            Self::NoFailedThatCommitted => "no attempt recorded failed whose effect committed",
            Self::NoGateRetryAsRedelivery => "no gate retry recorded as a broker redelivery",
            Self::ReconcilerClean => "the reconciler reports nothing lost or double_applied",
        })
    }
}

/// One broken rule at one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub rule: Rule,
    pub biz_id: String,
    pub detail: String,
}

/// The counts of a history and the rules it breaks.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    pub sent: usize,
    /// `None` when the attempts are not known ([`History::attempts_unknown`]).
    pub attempts: Option<usize>,
    pub applied_once: usize,
    pub applied_twice_or_more: usize,
    pub never_applied: usize,
    pub unexpected: usize,
    pub log_rows: usize,
    /// Log rows by outcome, and duplicates by cause (`duplicate/<cause>`).
    pub by_outcome: BTreeMap<String, usize>,
    pub violations: Vec<Violation>,
}

impl Checked {
    pub fn is_valid(&self) -> bool {
        self.violations.is_empty()
    }

    /// The keys that break `rule`.
    pub fn keys_breaking(&self, rule: Rule) -> BTreeSet<&str> {
        self.violations.iter().filter(|v| v.rule == rule).map(|v| v.biz_id.as_str()).collect()
    }
}

impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = match self.attempts {
            Some(n) => format!("{n} attempts"),
            None => "attempts unknown (a run through a broker)".to_owned(),
        };
        writeln!(
            f,
            "history: {} sent, {attempts}; applied once {}, applied twice or more {}, never applied {}, applied unsent {}",
            self.sent, self.applied_once, self.applied_twice_or_more, self.never_applied, self.unexpected
        )?;
        let outcomes: Vec<String> = self.by_outcome.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(f, "log: {} rows ({})", self.log_rows, outcomes.join(", "))?;
        if self.is_valid() {
            return writeln!(f, "valid: every rule holds");
        }
        let mut by_rule: BTreeMap<Rule, Vec<&Violation>> = BTreeMap::new();
        for v in &self.violations {
            by_rule.entry(v.rule).or_default().push(v);
        }
        writeln!(f, "INVALID: {} violations", self.violations.len())?;
        for (rule, violations) in by_rule {
            writeln!(f, "  {rule}: {} keys", violations.len())?;
            for v in violations.iter().take(20) {
                writeln!(f, "    {}: {}", v.biz_id, v.detail)?;
            }
            if violations.len() > 20 {
                writeln!(f, "    … and {} more", violations.len() - 20)?;
            }
        }
        Ok(())
    }
}

/// Holds `history` to the rules.
pub fn check(history: &History) -> Checked {
    let mut out = Checked {
        sent: history.sent.len(),
        attempts: (!history.attempts_unknown).then_some(history.attempts.len()),
        log_rows: history.log.len(),
        ..Checked::default()
    };
    let mut violations = Vec::new();
    let mut by_outcome: BTreeMap<String, usize> = BTreeMap::new();
    let mut broken = |rule: Rule, biz_id: &str, detail: String| {
        violations.push(Violation { rule, biz_id: biz_id.to_owned(), detail });
    };

    // 1. Applied exactly once.
    let sent_keys: BTreeSet<&str> = history.sent.iter().map(|s| s.biz_id.as_str()).collect();
    let (mut once, mut twice, mut never) = (0, 0, 0);
    for key in &sent_keys {
        match history.effects.get(*key).copied().unwrap_or(0) {
            1 => once += 1,
            0 => {
                never += 1;
                broken(Rule::AppliedExactlyOnce, key, "sent and acknowledged, never applied".to_owned());
            }
            n => {
                twice += 1;
                broken(Rule::AppliedExactlyOnce, key, format!("applied {n} times"));
            }
        }
    }
    let mut unexpected = 0;
    for (key, n) in &history.effects {
        if !sent_keys.contains(key.as_str()) && *n > 0 {
            unexpected += 1;
            broken(Rule::AppliedExactlyOnce, key, format!("applied {n} times, never sent"));
        }
    }

    // 2. Logged exactly once.
    let mut rows_of: BTreeMap<&str, Vec<&LogRow>> = BTreeMap::new();
    for row in &history.log {
        rows_of.entry(row.msg_id.as_str()).or_default().push(row);
    }
    let mut attempted: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
    for a in &history.attempts {
        attempted.entry(a.msg_id.as_str()).or_insert((a.biz_id.as_str(), 0)).1 += 1;
    }
    if history.attempts_unknown {
        for (msg_id, rows) in &rows_of {
            let notes = rows.iter().filter(|r| r.is_ambiguous_note()).count();
            if notes > 0 && !rows.iter().any(|r| r.outcome == "processed") {
                broken(
                    Rule::LoggedExactlyOnce,
                    &rows[0].biz_id,
                    format!("msgId {msg_id}: an ambiguous_commit note without the attempt's processed row"),
                );
            }
        }
    }
    for (msg_id, (biz_id, times)) in &attempted {
        let rows = rows_of.get(msg_id).map(Vec::as_slice).unwrap_or_default();
        let records = rows.iter().filter(|r| !r.is_ambiguous_note()).count();
        if records != *times {
            broken(
                Rule::LoggedExactlyOnce,
                biz_id,
                format!("msgId {msg_id}: {times} attempts, {records} log rows ({})", outcomes(rows)),
            );
        }
        let notes = rows.iter().filter(|r| r.is_ambiguous_note()).count();
        if notes > 0 && !rows.iter().any(|r| r.outcome == "processed") {
            broken(
                Rule::LoggedExactlyOnce,
                biz_id,
                format!("msgId {msg_id}: an ambiguous_commit note without the attempt's processed row"),
            );
        }
    }
    for row in history.log.iter().filter(|_| !history.attempts_unknown) {
        if !attempted.contains_key(row.msg_id.as_str()) {
            broken(
                Rule::LoggedExactlyOnce,
                &row.biz_id,
                format!("msgId {}: logged, never delivered", row.msg_id),
            );
        }
    }

    let processed_by: BTreeSet<(&str, &str)> = history
        .log
        .iter()
        .filter(|r| r.outcome == "processed")
        .map(|r| (r.msg_id.as_str(), r.instance_id.as_str()))
        .collect();
    for row in &history.log {
        let key = if row.outcome == "duplicate" {
            format!("duplicate/{}", row.cause.as_deref().unwrap_or("none"))
        } else {
            row.outcome.clone()
        };
        *by_outcome.entry(key).or_default() += 1;
        let claim = history.claims.get(&row.biz_id);
        let own_claim = claim.is_some_and(|c| c.msg_id == row.msg_id);
        // 3. Failed, though its effect committed.
        if matches!(row.outcome.as_str(), "failed" | "dead_lettered") && own_claim {
            broken(
                Rule::NoFailedThatCommitted,
                &row.biz_id,
                format!(
                    "msgId {}: logged {}, but the claim (and the effect) is this attempt's",
                    row.msg_id, row.outcome
                ),
            );
        }
        // 4. The gate's own retry, blamed on the broker. Through a real broker the same msgId
        // does come again, to another instance, after a rebalance moved its queue before the
        // offset was stored: only a row of the instance whose attempt holds the claim is the
        // gate's own retry there.
        let claimed_by_this_instance = !history.attempts_unknown
            || processed_by.contains(&(row.msg_id.as_str(), row.instance_id.as_str()));
        if row.outcome == "duplicate"
            && row.cause.as_deref() == Some("redelivery")
            && own_claim
            && claimed_by_this_instance
        {
            broken(
                Rule::NoGateRetryAsRedelivery,
                &row.biz_id,
                format!(
                    "msgId {}: a redelivery of the attempt that holds the claim: the gate's own retry",
                    row.msg_id
                ),
            );
        }
        if row.is_ambiguous_note() && !own_claim {
            broken(
                Rule::NoGateRetryAsRedelivery,
                &row.biz_id,
                format!("msgId {}: ambiguous_commit, but the claim is another attempt's", row.msg_id),
            );
        }
    }

    // 5. The reconciler.
    for key in &history.reconciled_lost {
        broken(Rule::ReconcilerClean, key, "the reconciler reports it lost".to_owned());
    }
    for key in &history.reconciled_double {
        broken(Rule::ReconcilerClean, key, "the reconciler reports it double_applied".to_owned());
    }

    out.violations = violations;
    out.by_outcome = by_outcome;
    out.applied_once = once;
    out.applied_twice_or_more = twice;
    out.never_applied = never;
    out.unexpected = unexpected;
    out
}

fn outcomes(rows: &[&LogRow]) -> String {
    let named: Vec<String> = rows
        .iter()
        .map(|r| match &r.cause {
            Some(cause) => format!("{}/{cause}", r.outcome),
            None => r.outcome.clone(),
        })
        .collect();
    named.join(", ")
}

/// Where [`History::read`] finds a run's records.
pub struct Source<'a> {
    pub consumer_group: &'a str,
    pub biz_type: &'a str,
    /// The business table's applications: a statement returning `(bizId, count)` rows, one per
    /// key applied (`?` placeholders; none bound).
    pub effects_sql: &'a str,
    /// The window the reconciler runs over.
    pub since_ms: i64,
}

impl History {
    /// What `store` holds after a run through a real broker whose manifest is `sent`: as
    /// [`History::read`], with the attempts unknown ([`History::attempts_unknown`]).
    pub async fn read_broker_run(
        store: &Store,
        source: &Source<'_>,
        sent: Vec<Sent>,
    ) -> anyhow::Result<Self> {
        let mut history = Self::read(store, source, sent, Vec::new()).await?;
        history.attempts_unknown = true;
        Ok(history)
    }

    /// What `store` holds after a run whose manifest is `sent` and whose attempts were
    /// `attempts`, read as [`Source`] says, with a reconcile run over the window.
    pub async fn read(
        store: &Store,
        source: &Source<'_>,
        sent: Vec<Sent>,
        attempts: Vec<Attempt>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let backend = store.backend();
        let pool = store.pool();
        let mut effects = BTreeMap::new();
        for row in
            query_built(backend, source.effects_sql.to_owned()).fetch_all(pool).await.context("effects")?
        {
            effects.insert(row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?);
        }
        let mut claims = BTreeMap::new();
        let rows = query_built(
            backend,
            "SELECT biz_id, msg_id, uniq_key FROM idempotent_record_all WHERE consumer_group = ? AND biz_type = ?"
                .to_owned(),
        )
        .bind(source.consumer_group.to_owned())
        .bind(source.biz_type.to_owned())
        .fetch_all(pool)
        .await
        .context("claims")?;
        for row in rows {
            claims.insert(row.try_get(0)?, ClaimRow { msg_id: row.try_get(1)?, uniq_key: row.try_get(2)? });
        }
        let rows = query_built(
            backend,
            "SELECT biz_id, msg_id, outcome, cause, instance_id FROM delivery_log WHERE consumer_group = ? AND biz_type = ?"
                .to_owned(),
        )
        .bind(source.consumer_group.to_owned())
        .bind(source.biz_type.to_owned())
        .fetch_all(pool)
        .await
        .context("the delivery log")?;
        let mut log = Vec::with_capacity(rows.len());
        for row in rows {
            log.push(LogRow {
                biz_id: row.try_get(0)?,
                msg_id: row.try_get(1)?,
                outcome: row.try_get(2)?,
                cause: row.try_get(3)?,
                instance_id: row.try_get(4)?,
            });
        }
        let now = idemgate::clock::now_ms();
        let runner = Runner {
            consumer_group: source.consumer_group,
            instance_id: "history-checker",
            started_by: "command",
            log_retention_days: 14,
        };
        let window = std::time::Duration::from_millis(u64::try_from(now - source.since_ms).unwrap_or(0));
        let options =
            ReconcileSettings::default().options(&runner, Some(source.biz_type.to_owned()), window, now);
        let report = reconcile_once(store, &options, &[], now).await.context("the reconciler")?;
        let keys = |kind: AnomalyKind| {
            report.anomalies.iter().filter(|a| a.kind == kind).map(|a| a.biz_id.clone()).collect::<Vec<_>>()
        };
        Ok(Self {
            sent,
            attempts,
            attempts_unknown: false,
            effects,
            claims,
            log,
            reconciled_lost: keys(AnomalyKind::Lost),
            reconciled_double: keys(AnomalyKind::DoubleApplied),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clean history of `n` keys: each sent once, delivered once, applied, claimed, logged.
    fn clean(n: usize) -> History {
        let mut h = History::default();
        for i in 0..n {
            let (key, msg, uniq) = (format!("K{i}"), format!("M{i}"), format!("U{i}"));
            h.sent.push(Sent { biz_id: key.clone(), uniq_key: uniq.clone(), msg_id: msg.clone() });
            h.attempts.push(attempt(&key, &msg));
            h.effects.insert(key.clone(), 1);
            h.claims.insert(key.clone(), ClaimRow { msg_id: msg.clone(), uniq_key: uniq });
            h.log.push(row(&key, &msg, "processed", None));
        }
        h
    }

    fn attempt(key: &str, msg: &str) -> Attempt {
        Attempt { biz_id: key.to_owned(), msg_id: msg.to_owned() }
    }

    fn row(key: &str, msg: &str, outcome: &str, cause: Option<&str>) -> LogRow {
        LogRow {
            biz_id: key.to_owned(),
            msg_id: msg.to_owned(),
            outcome: outcome.to_owned(),
            cause: cause.map(str::to_owned),
            instance_id: "i".to_owned(),
        }
    }

    fn broken(h: &History, rule: Rule) -> BTreeSet<String> {
        let checked = check(h);
        assert!(!checked.is_valid(), "{checked}");
        checked.keys_breaking(rule).into_iter().map(str::to_owned).collect()
    }

    fn keys(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|k| (*k).to_owned()).collect()
    }

    #[test]
    fn a_clean_history_holds_every_rule() {
        let mut h = clean(3);
        // A broker redelivery (new msgId, same UNIQ_KEY) stopped by the claim, and the gate's own
        // retry after an ambiguous commit, noted as such.
        h.attempts.push(attempt("K0", "M0-retry"));
        h.log.push(row("K0", "M0-retry", "duplicate", Some("redelivery")));
        h.log.push(row("K1", "M1", "duplicate", Some("ambiguous_commit")));
        // A failed attempt whose retry, another attempt, committed.
        h.attempts.push(attempt("K2", "M2-first"));
        h.log.push(row("K2", "M2-first", "failed", None));
        let checked = check(&h);
        assert!(checked.is_valid(), "{checked}");
        assert_eq!((checked.sent, checked.attempts, checked.applied_once), (3, Some(5), 3));
        assert_eq!(checked.by_outcome.get("duplicate/ambiguous_commit"), Some(&1));
        assert!(checked.to_string().contains("valid: every rule holds"), "{checked}");
    }

    #[test]
    fn a_broker_run_without_attempts_holds_the_rules_the_log_can_show() {
        let mut h = clean(3);
        h.attempts.clear();
        h.attempts_unknown = true;
        // A broker's retry of K0 under a msgId of its own: no attempt lists it, and that is fine.
        h.log.push(row("K0", "M0-retry", "duplicate", Some("redelivery")));
        let checked = check(&h);
        assert!(checked.is_valid(), "{checked}");
        assert_eq!(checked.attempts, None);
        assert!(checked.to_string().contains("attempts unknown"), "{checked}");
        // The same msgId again, to another instance, after a rebalance: the broker's redelivery.
        h.log.push(LogRow {
            instance_id: "other".to_owned(),
            ..row("K2", "M2", "duplicate", Some("redelivery"))
        });
        assert!(check(&h).is_valid(), "{}", check(&h));
        // The same msgId again at the instance whose attempt holds the claim: the gate's own.
        h.log.push(row("K1", "M1", "duplicate", Some("redelivery")));
        assert_eq!(broken(&h, Rule::NoGateRetryAsRedelivery), keys(&["K1"]));
        h.log.pop();
        // What the log alone shows still breaks the rules.
        h.log.push(row("K1", "M1-x", "duplicate", Some("ambiguous_commit")));
        h.effects.insert("K2".into(), 2);
        assert_eq!(broken(&h, Rule::LoggedExactlyOnce), keys(&["K1"]));
        assert_eq!(broken(&h, Rule::AppliedExactlyOnce), keys(&["K2"]));
    }

    #[test]
    fn a_send_applied_twice_never_or_unsent_breaks_the_first_rule() {
        let mut h = clean(3);
        h.effects.insert("K0".into(), 2);
        h.effects.remove("K1");
        h.effects.insert("X".into(), 1);
        assert_eq!(broken(&h, Rule::AppliedExactlyOnce), keys(&["K0", "K1", "X"]));
        let checked = check(&h);
        assert_eq!((checked.applied_twice_or_more, checked.never_applied, checked.unexpected), (1, 1, 1));
        let text = checked.to_string();
        assert!(text.contains("INVALID") && text.contains("K0: applied 2 times"), "{text}");
    }

    #[test]
    fn an_attempt_logged_twice_never_or_a_row_of_no_attempt_breaks_the_second_rule() {
        let mut h = clean(4);
        h.log.push(row("K0", "M0", "duplicate", Some("redelivery")));
        h.log.retain(|r| r.biz_id != "K1");
        h.log.push(row("K2", "M-nobody", "failed", None));
        // An ambiguous_commit note of an attempt whose processed row is missing.
        h.log.retain(|r| r.biz_id != "K3");
        h.log.push(row("K3", "M3", "duplicate", Some("ambiguous_commit")));
        assert_eq!(broken(&h, Rule::LoggedExactlyOnce), keys(&["K0", "K1", "K2", "K3"]));
    }

    #[test]
    fn a_failed_row_of_the_attempt_that_holds_the_claim_breaks_the_third_rule() {
        let mut h = clean(2);
        // The ambiguous commit logged as failed: its effect and claim committed.
        h.log.retain(|r| r.biz_id != "K1");
        h.log.push(row("K1", "M1", "failed", None));
        assert_eq!(broken(&h, Rule::NoFailedThatCommitted), keys(&["K1"]));
    }

    #[test]
    fn the_gates_own_retry_named_redelivery_breaks_the_fourth_rule() {
        let mut h = clean(2);
        h.log.push(row("K0", "M0", "duplicate", Some("redelivery")));
        // And an ambiguous_commit note on a key another attempt claimed.
        h.attempts.push(attempt("K1", "M1-other"));
        h.log.push(row("K1", "M1-other", "processed", None));
        h.log.push(row("K1", "M1-other", "duplicate", Some("ambiguous_commit")));
        assert_eq!(broken(&h, Rule::NoGateRetryAsRedelivery), keys(&["K0", "K1"]));
    }

    #[test]
    fn a_reconciler_finding_breaks_the_fifth_rule() {
        let mut h = clean(2);
        h.reconciled_lost.push("K0".into());
        h.reconciled_double.push("K1".into());
        assert_eq!(broken(&h, Rule::ReconcilerClean), keys(&["K0", "K1"]));
    }
}
