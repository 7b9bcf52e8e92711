//! The summary's counts: each outcome, duplicate cause and collision among a scope's
//! deliveries, its oldest and newest, each read up to [`COUNT_LIMIT`] (a count past it is a
//! lower bound), and the summary and final state they make with the key's claim.

use std::collections::BTreeMap;

use sqlx::Row;

use super::answer::{ClaimRecord, FinalState, Summary};
use crate::outcome::{DuplicateCause, Outcome};
use crate::store::{Arg, Bound, Sql, Store};

/// How far each of a summary's counts is read: a count up to it is exact, one past it is a
/// lower bound. Each count is one index range of at most this many entries, so the summary of
/// a key with millions of deliveries costs what one of five thousand does: a hot key fills
/// three ranges (its duplicates, redeliveries and resends), and at 10,000 those alone kept a
/// trace on MariaDB near 50 ms.
pub const COUNT_LIMIT: usize = 5_000;

/// `n`, or "more than [`COUNT_LIMIT`]" for a count read past it.
pub(crate) fn count_text(n: usize) -> String {
    if n > COUNT_LIMIT { format!("more than {COUNT_LIMIT}") } else { n.to_string() }
}

/// What one branch of a [`Tallies`] statement counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TallyKind {
    /// The deliveries of one outcome.
    Outcome,
    /// The duplicates of one cause (the label).
    Cause,
    /// The duplicates of one cause whose body differs from the claim's.
    Collision,
    /// Every delivery.
    All,
    /// The oldest delivery and the newest: one row each, for their times.
    First,
    Last,
}

impl TallyKind {
    const ALL: [Self; 6] = [Self::Outcome, Self::Cause, Self::Collision, Self::All, Self::First, Self::Last];

    fn name(self) -> &'static str {
        match self {
            Self::Outcome => "outcome",
            Self::Cause => "cause",
            Self::Collision => "collision",
            Self::All => "all",
            Self::First => "first",
            Self::Last => "last",
        }
    }
}

/// One branch: the rows of the scope that `condition` picks, read in the index's order up to
/// `limit`.
struct Branch {
    kind: TallyKind,
    label: &'static str,
    /// The rows it picks, for counting a few rows read at once ([`Tallies::read`]).
    pick: Pick,
    condition: String,
    order: &'static str,
    limit: i64,
}

/// Which rows a [`Branch`] picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    Every,
    Outcome(Outcome),
    Cause(DuplicateCause),
    /// The duplicates of a cause whose body differs from the claim's.
    Collision(DuplicateCause),
}

impl Pick {
    fn picks(self, row: &Sampled) -> bool {
        let duplicate_of = |c: DuplicateCause| {
            row.outcome == Outcome::Duplicate.as_str() && row.cause.as_deref() == Some(c.as_str())
        };
        match self {
            Self::Every => true,
            Self::Outcome(o) => row.outcome == o.as_str(),
            Self::Cause(c) => duplicate_of(c),
            Self::Collision(c) => duplicate_of(c) && row.payload_match == Some(0),
        }
    }
}

/// A delivery of the scope as [`Tallies::read`] counts it.
struct Sampled {
    outcome: String,
    cause: Option<String>,
    payload_match: Option<i16>,
    logged_at_ms: i64,
}

/// The most deliveries of a scope counted from the rows themselves; a scope with more is counted
/// branch by branch.
const SAMPLED: usize = 200;

/// One statement of counts over a scope's deliveries: a `UNION ALL` of [`Branch`]es, each a
/// range of one index read up to its limit, so that the statement costs at most its branches
/// times [`COUNT_LIMIT`] index entries, whatever the key's size. Each row names its branch.
///
/// Most scopes hold a few deliveries: [`Tallies::read`] first reads up to [`SAMPLED`] of them in
/// one range (`sample`) and counts them here. On the log partitioned by day, every branch is a
/// read of every day's index, and planning the branches of every day costs more than reading a
/// few rows; only a scope with more deliveries than that (a hot key) runs the branches.
pub(super) struct Tallies {
    branches: Vec<Branch>,
    sql: Sql,
    sample: Sql,
}

/// One row of a [`Tallies`] statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tally {
    pub(super) kind: TallyKind,
    label: String,
    pub(super) count: usize,
    pub(super) first_ms: Option<i64>,
    pub(super) last_ms: Option<i64>,
}

impl Tallies {
    /// The summary's counts: each outcome, the duplicates of each cause and their collisions,
    /// and the oldest and newest delivery.
    pub(super) fn summary(source: &'static str, scope: &'static str) -> Self {
        let counted = i64::try_from(COUNT_LIMIT + 1).unwrap_or(i64::MAX);
        let branch = |kind, label, pick, condition: String| Branch {
            kind,
            label,
            pick,
            condition,
            order: "",
            limit: counted,
        };
        let mut branches: Vec<Branch> = Outcome::ALL
            .iter()
            .map(|o| {
                branch(TallyKind::Outcome, o.as_str(), Pick::Outcome(*o), format!(" AND outcome = '{o}'"))
            })
            .collect();
        // No branch asks for a cause IS NULL: the gate names a cause for every duplicate, and
        // a planner without statistics may read such a branch by delivery_log_key, filtering
        // every delivery of the key. Duplicates without a named cause are what the causes leave
        // of the exact count ([`summarize`]).
        let duplicate = Outcome::Duplicate.as_str();
        for cause in DuplicateCause::ALL {
            let is = format!(" AND outcome = '{duplicate}' AND cause = '{cause}'");
            branches.push(branch(TallyKind::Cause, cause.as_str(), Pick::Cause(*cause), is.clone()));
            branches.push(branch(
                TallyKind::Collision,
                cause.as_str(),
                Pick::Collision(*cause),
                format!("{is} AND payload_match = 0"),
            ));
        }
        branches.extend(Self::ends());
        Self::new(source, scope, branches)
    }

    /// A candidate key's figures: its deliveries, the oldest and the newest.
    pub(super) fn figures(source: &'static str, scope: &'static str) -> Self {
        let counted = i64::try_from(COUNT_LIMIT + 1).unwrap_or(i64::MAX);
        let all = Branch {
            kind: TallyKind::All,
            label: "",
            pick: Pick::Every,
            condition: String::new(),
            order: "",
            limit: counted,
        };
        Self::new(source, scope, std::iter::once(all).chain(Self::ends()).collect())
    }

    fn ends() -> [Branch; 2] {
        let end = |kind, order| Branch {
            kind,
            label: "",
            pick: Pick::Every,
            condition: String::new(),
            order,
            limit: 1,
        };
        [
            end(TallyKind::First, " ORDER BY logged_at_ms, id"),
            end(TallyKind::Last, " ORDER BY logged_at_ms DESC, id DESC"),
        ]
    }

    fn new(source: &'static str, scope: &'static str, branches: Vec<Branch>) -> Self {
        let text = branches
            .iter()
            .map(|b| {
                format!(
                    "SELECT '{}' AS kind, '{}' AS label, COUNT(*) AS n, MIN(logged_at_ms) AS first_ms, \
                     MAX(logged_at_ms) AS last_ms FROM (SELECT logged_at_ms FROM {source} \
                     WHERE {scope}{}{} LIMIT ?) n",
                    b.kind.name(),
                    b.label,
                    b.condition,
                    b.order
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let sample =
            format!("SELECT outcome, cause, payload_match, logged_at_ms FROM {source} WHERE {scope} LIMIT ?");
        Self {
            branches,
            sql: Sql::new(Box::leak(text.into_boxed_str())),
            sample: Sql::new(Box::leak(sample.into_boxed_str())),
        }
    }

    /// The statement that reads up to [`SAMPLED`] deliveries of a scope, and one more: `args`
    /// are the values of the scope's condition ([`Scope::args`](super::sql::Scope::args)).
    pub(super) fn sample_statement(&'static self, name: &'static str, mut args: Vec<Arg>) -> Bound {
        args.push(Arg::Int(i64::try_from(SAMPLED + 1).unwrap_or(i64::MAX)));
        Bound::new(name, &self.sample, args)
    }

    /// The tallies of `rows`, one per branch, as the branches' statement would give them.
    fn count(&self, rows: &[Sampled]) -> Vec<Tally> {
        self.branches
            .iter()
            .map(|b| {
                let times = rows.iter().filter(|r| b.pick.picks(r)).map(|r| r.logged_at_ms);
                let (first, last) = (times.clone().min(), times.clone().max());
                let (count, first_ms, last_ms) = match b.kind {
                    TallyKind::First => (usize::from(first.is_some()), first, first),
                    TallyKind::Last => (usize::from(last.is_some()), last, last),
                    _ => (times.count(), first, last),
                };
                Tally { kind: b.kind, label: b.label.to_owned(), count, first_ms, last_ms }
            })
            .collect()
    }

    /// The statement with its values for a scope, `args` the values of its condition.
    pub(super) fn statement(&'static self, name: &'static str, args: &[Arg]) -> Bound {
        let args =
            self.branches.iter().flat_map(|b| args.iter().cloned().chain([Arg::Int(b.limit)])).collect();
        Bound::new(name, &self.sql, args)
    }

    /// The tallies of a scope, `args` the values of its condition.
    pub(super) async fn read(&'static self, store: &Store, args: &[Arg]) -> Result<Vec<Tally>, sqlx::Error> {
        let sampled =
            self.sample_statement("sample", args.to_vec()).query(store).fetch_all(store.pool()).await?;
        if sampled.len() <= SAMPLED {
            let rows = sampled
                .iter()
                .map(|r| {
                    Ok(Sampled {
                        outcome: r.try_get(0)?,
                        cause: r.try_get(1)?,
                        payload_match: r.try_get(2)?,
                        logged_at_ms: r.try_get(3)?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            return Ok(self.count(&rows));
        }
        let rows = self.statement("tallies", args).query(store).fetch_all(store.pool()).await?;
        rows.iter()
            .map(|r| {
                let kind: String = r.try_get(0)?;
                Ok(Tally {
                    kind: TallyKind::ALL.into_iter().find(|k| k.name() == kind).ok_or_else(|| {
                        sqlx::Error::Protocol(format!("a tally of an unknown kind {kind:?}"))
                    })?,
                    label: r.try_get(1)?,
                    count: usize::try_from(r.try_get::<i64, _>(2)?).unwrap_or(0),
                    first_ms: r.try_get(3)?,
                    last_ms: r.try_get(4)?,
                })
            })
            .collect()
    }
}

/// The summary from a scope's tallies ([`Tallies::summary`]) and its claim. Duplicates logged
/// without a named cause (none the gate writes) count as `unknown`, when the count of
/// duplicates is exact. Which way an unclaimed key without a processed delivery stands is its
/// latest delivery that is not a duplicate; a dead letter wins a tie in the same millisecond,
/// as the last attempt.
pub(super) fn summarize(tallies: &[Tally], claim: Option<&ClaimRecord>) -> Summary {
    let outcome = |o: Outcome| tallies.iter().find(|t| t.kind == TallyKind::Outcome && t.label == o.as_str());
    let count = |o: Outcome| outcome(o).map_or(0, |t| t.count);
    let mut duplicates: BTreeMap<String, usize> = tallies
        .iter()
        .filter(|t| t.kind == TallyKind::Cause && t.count > 0)
        .map(|t| (t.label.clone(), t.count))
        .collect();
    let named: usize = duplicates.values().sum();
    let all = count(Outcome::Duplicate);
    if all <= COUNT_LIMIT && all > named {
        *duplicates.entry(DuplicateCause::Unknown.as_str().to_owned()).or_insert(0) += all - named;
    }
    let end = |kind| tallies.iter().find(|t| t.kind == kind);
    let processed = count(Outcome::Processed);
    let final_state = if processed > 1 {
        FinalState::AppliedTwice
    } else if claim.is_some() || processed == 1 {
        FinalState::Applied
    } else {
        [Outcome::Failed, Outcome::Invalid, Outcome::DeadLettered]
            .into_iter()
            .filter_map(|o| outcome(o).and_then(|t| t.last_ms).map(|at| (at, o)))
            .max_by_key(|&(at, o)| (at, o == Outcome::DeadLettered))
            .map_or(FinalState::Unknown, |(_, o)| match o {
                Outcome::DeadLettered => FinalState::DeadLettered,
                Outcome::Invalid => FinalState::Invalid,
                _ => FinalState::Retrying,
            })
    };
    let claimed_at = claim.map(|c| c.claimed_at_ms);
    Summary {
        first_seen_ms: end(TallyKind::First).and_then(|t| t.first_ms).or(claimed_at),
        last_seen_ms: end(TallyKind::Last).and_then(|t| t.last_ms).or(claimed_at),
        processed_at_ms: outcome(Outcome::Processed).and_then(|t| t.first_ms).or(claimed_at),
        deliveries: Outcome::ALL.iter().map(|&o| count(o)).sum(),
        processed,
        duplicates,
        collisions: tallies.iter().filter(|t| t.kind == TallyKind::Collision).map(|t| t.count).sum(),
        retries: count(Outcome::Failed),
        dead_letters: count(Outcome::DeadLettered),
        invalid: count(Outcome::Invalid),
        final_state,
        final_state_text: final_state.describe(),
        count_limit: COUNT_LIMIT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of one key, as the log's statements name them.
    const OF_KEY: &str = "consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?";

    fn tally(kind: TallyKind, label: &str, count: usize, first: i64, last: i64) -> Tally {
        Tally { kind, label: label.to_owned(), count, first_ms: Some(first), last_ms: Some(last) }
    }

    /// The tallies of a timeline given as (outcome, cause, at) rows.
    fn tallies_of(rows: &[(Outcome, Option<DuplicateCause>, i64)]) -> Vec<Tally> {
        let mut out = Vec::new();
        let mut add = |kind, label: &str, at: &[i64]| {
            if let (Some(first), Some(last)) = (at.iter().min(), at.iter().max()) {
                out.push(tally(kind, label, at.len(), *first, *last));
            }
        };
        for o in Outcome::ALL {
            let at: Vec<i64> = rows.iter().filter(|r| r.0 == *o).map(|r| r.2).collect();
            add(TallyKind::Outcome, o.as_str(), &at);
        }
        for c in DuplicateCause::ALL {
            let at: Vec<i64> = rows.iter().filter(|r| r.1 == Some(*c)).map(|r| r.2).collect();
            add(TallyKind::Cause, c.as_str(), &at);
        }
        let all: Vec<i64> = rows.iter().map(|r| r.2).collect();
        add(TallyKind::First, "", &all);
        add(TallyKind::Last, "", &all);
        out
    }

    #[test]
    fn a_few_rows_counted_here_give_the_tallies_the_branches_would() {
        use DuplicateCause::{ProducerResend, Redelivery};
        let row = |outcome: Outcome, cause: Option<DuplicateCause>, matched: Option<i16>, at| Sampled {
            outcome: outcome.as_str().to_owned(),
            cause: cause.map(|c| c.as_str().to_owned()),
            payload_match: matched,
            logged_at_ms: at,
        };
        let rows = [
            row(Outcome::Failed, None, None, 5),
            row(Outcome::Processed, None, None, 7),
            row(Outcome::Duplicate, Some(Redelivery), Some(1), 9),
            row(Outcome::Duplicate, Some(ProducerResend), Some(0), 3),
        ];
        let summary = Tallies::summary("delivery_log", OF_KEY);
        let counted = summary.count(&rows);
        assert_eq!(counted.len(), summary.branches.len(), "one tally per branch, as the statement gives");
        let find = |kind, label: &str| counted.iter().find(|t| t.kind == kind && t.label == label).unwrap();
        let failed = find(TallyKind::Outcome, "failed");
        assert_eq!((failed.count, failed.first_ms, failed.last_ms), (1, Some(5), Some(5)));
        let duplicates = find(TallyKind::Outcome, "duplicate");
        assert_eq!((duplicates.count, duplicates.first_ms, duplicates.last_ms), (2, Some(3), Some(9)));
        assert_eq!(find(TallyKind::Cause, "redelivery").count, 1);
        assert_eq!(find(TallyKind::Collision, "redelivery").count, 0);
        let collision = find(TallyKind::Collision, "producer_resend");
        assert_eq!((collision.count, collision.first_ms), (1, Some(3)));
        assert_eq!(find(TallyKind::Outcome, "dead_lettered").first_ms, None, "none: no time");
        let (first, last) = (find(TallyKind::First, ""), find(TallyKind::Last, ""));
        assert_eq!((first.count, first.first_ms, last.count, last.last_ms), (1, Some(3), 1, Some(9)));
        let figures = Tallies::figures("delivery_log", OF_KEY).count(&rows);
        assert_eq!(figures[0].count, 4);
        assert!(Tallies::figures("delivery_log", OF_KEY).count(&[]).iter().all(|t| t.count == 0));
    }

    #[test]
    fn the_summary_names_the_final_state_from_the_counts() {
        use DuplicateCause::Redelivery;
        use Outcome::{DeadLettered, Duplicate, Failed, Processed};
        let retried = tallies_of(&[(Failed, None, 1), (Failed, None, 2), (Processed, None, 3)]);
        let s = summarize(&retried, None);
        assert_eq!((s.final_state, s.retries, s.processed_at_ms), (FinalState::Applied, 2, Some(3)));
        assert_eq!((s.first_seen_ms, s.last_seen_ms, s.deliveries), (Some(1), Some(3), 3));

        let dead = tallies_of(&[(Failed, None, 1), (DeadLettered, None, 2)]);
        assert_eq!(summarize(&dead, None).final_state, FinalState::DeadLettered);
        let retrying = tallies_of(&[(Failed, None, 1)]);
        assert_eq!(summarize(&retrying, None).final_state, FinalState::Retrying);
        let same_moment = tallies_of(&[(Failed, None, 2), (DeadLettered, None, 2)]);
        assert_eq!(summarize(&same_moment, None).final_state, FinalState::DeadLettered);

        let twice = tallies_of(&[(Processed, None, 1), (Processed, None, 2)]);
        assert_eq!(summarize(&twice, None).final_state, FinalState::AppliedTwice);

        let dups = tallies_of(&[(Processed, None, 1), (Duplicate, Some(Redelivery), 2)]);
        let s = summarize(&dups, None);
        assert_eq!(s.duplicates.get("redelivery"), Some(&1));
        assert_eq!(s.final_state, FinalState::Applied);
    }

    #[test]
    fn counts_past_the_limit_read_as_lower_bounds() {
        let hot = [
            tally(TallyKind::Outcome, "duplicate", COUNT_LIMIT + 1, 1, 9),
            tally(TallyKind::Outcome, "processed", 2, 1, 7),
            tally(TallyKind::Cause, "redelivery", COUNT_LIMIT + 1, 2, 3),
            tally(TallyKind::Cause, "unknown", 4, 2, 3),
        ];
        let s = summarize(&hot, None);
        assert_eq!(s.final_state, FinalState::AppliedTwice);
        assert_eq!(count_text(s.deliveries), format!("more than {COUNT_LIMIT}"));
        assert_eq!(count_text(s.processed), "2");
        assert_eq!(s.duplicates.get("unknown"), Some(&4), "nothing is made up of a count read in part");

        let unnamed = [
            tally(TallyKind::Outcome, "duplicate", 7, 1, 9),
            tally(TallyKind::Cause, "redelivery", 3, 2, 3),
            tally(TallyKind::Cause, "unknown", 1, 2, 3),
        ];
        let s = summarize(&unnamed, None);
        assert_eq!(s.duplicates.get("unknown"), Some(&4), "a duplicate logged without a cause is unknown");
    }

    #[test]
    fn every_branch_of_the_summary_reads_one_key_up_to_the_limit() {
        let tallies = Tallies::summary("delivery_log", OF_KEY);
        let text = tallies.sql.portable();
        let branches = Outcome::ALL.len() + 2 * DuplicateCause::ALL.len() + 2;
        assert_eq!(tallies.branches.len(), branches);
        assert_eq!(text.matches(" UNION ALL ").count(), branches - 1);
        assert_eq!(text.matches(OF_KEY).count(), branches);
        assert_eq!(text.matches(" LIMIT ?) n").count(), branches);
    }
}
