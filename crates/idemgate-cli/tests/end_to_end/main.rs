//! `idemgate serve` and `idemgate produce` against a real RocketMQ broker and real databases.

mod acl;
mod brokers;
mod browser;
mod cluster;
mod command_line;
mod kafka;
mod lag;
mod lifecycle;
mod prometheus;
mod rabbitmq;
mod replay;
mod sql_handler;
mod stall;
mod support;
mod traceparent;

use std::time::Duration;

use idemgate::store::Backend;
use support::*;

/// `group_commit`: none, or the messages per listener call under group commit.
async fn exactly_once_through_a_real_broker(backend: Backend, group_commit: Option<u32>) {
    let db = database(backend).await;
    let (topic, group, run) = (unique("shop"), unique("group"), unique("R").replace('_', ""));
    let mut s = settings(&db.url, &topic, &group, "solo", 2);
    if let Some(listener_batch) = group_commit {
        s = with_group_commit(s, listener_batch);
    }
    let service = Service::start(&s);
    let (report, sends) = produce(&topic, &run, 2000, 0, &["--duplicates", "0.3"]);
    let t = &report.tally;
    for kind in ["producer_retry", "producer_resend", "late_duplicate", "poison", "malformed"] {
        assert!(t.sends.get(kind).copied().unwrap_or(0) > 0, "the traffic has {kind} sends: {:?}", t.sends);
    }
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    if group_commit.is_some() {
        assert_groups_formed(&service);
    }
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_messages_with_thirty_percent_duplicates_are_applied_exactly_once_on_mariadb() {
    exactly_once_through_a_real_broker(Backend::MySql, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_group_commit_two_thousand_messages_are_applied_exactly_once_on_postgres() {
    exactly_once_through_a_real_broker(Backend::Postgres, Some(1)).await;
}

/// Starts a consumer, stops it with `stop` two seconds into a 2,000-message stream, starts a
/// second one in the same group, and checks that the books converge.
async fn interrupted_mid_stream(
    prefix: &str,
    names: [&str; 2],
    group_commit: bool,
    stop: impl FnOnce(Service),
) {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique(prefix), unique("group"), unique(prefix).replace('_', ""));
    let configure = |name: &str| {
        let s = settings(&db.url, &topic, &group, name, 2);
        if group_commit { with_group_commit(s, 16) } else { s }
    };
    let first = Service::start(&configure(names[0]));
    let producer = {
        let (topic, run) = (topic.clone(), run.clone());
        std::thread::spawn(move || produce(&topic, &run, 2000, 500, &["--duplicates", "0.3"]))
    };
    if group_commit {
        // Once groups are committing, so that the stop lands among groups in flight.
        wait_for_groups(&first, 3, Duration::from_secs(30));
        assert_groups_formed(&first);
    } else {
        // About 2 of the stream's 4 seconds in.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop(first);
    let second = Service::start(&configure(names[1]));
    let (report, sends) = producer.join().expect("producer thread");
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    let by_instance = processed_by_instance(&db.store, &group).await;
    assert!(by_instance.contains_key(names[1]), "{by_instance:?}");
    assert_eq!(second.terminate().code(), Some(0));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_group_converges_to_the_same_books_after_restart() {
    interrupted_mid_stream("gcrash", ["before-crash", "after-crash"], true, Service::kill_hard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_exits_zero_after_the_deliveries_in_flight_and_loses_nothing() {
    interrupted_mid_stream("term", ["terminated", "restarted"], false, |first| {
        let exit = first.terminate();
        assert_eq!(exit.code(), Some(0), "{}", tail(&exit.log));
        assert!(exit.log.contains("SIGTERM") && exit.log.contains("idemgate stopped"), "{}", tail(&exit.log));
    })
    .await;
}

/// The last lines of a log, for failure messages.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains("PopBuffer")).collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
