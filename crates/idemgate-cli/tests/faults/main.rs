//! Faults that take a whole service away: PostgreSQL stopped and started again under a running
//! `idemgate serve` with group commit on. This binary holds the only test that restarts the
//! database server, so no other test runs while it is down (test binaries run one at a time).

#[allow(dead_code)]
#[path = "../end_to_end/support.rs"]
mod support;

use std::process::Command;
use std::time::Duration;

use idemgate::store::Backend;
use support::*;

/// `pg_ctlcluster` on the local cluster, as the test scripts start it.
fn pg_ctlcluster(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("a local PostgreSQL cluster (/etc/postgresql)")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .max()
        .expect("a PostgreSQL version directory");
    let status = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .status()
        .expect("run pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster {version} main {action}: {status}");
}

/// The sum of a metric's samples in an exposition.
fn sample(text: &str, name: &str, with: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_stream_loses_nothing_applies_nothing_twice_and_the_consumer_recovers() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("pgrestart"), unique("group"), unique("P").replace('_', ""));
    // Retries enough for every delivery that meets the outage to come back after it; no poison,
    // which would take those 16 retries (hours) to be dead-lettered.
    let service = Service::start(&with_group_commit(settings(&db.url, &topic, &group, "solo", 16), 16));
    let producer = {
        let (topic, run) = (topic.clone(), run.clone());
        std::thread::spawn(move || {
            produce(&topic, &run, 2000, 400, &["--duplicates", "0.3", "--poison", "0"])
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg_ctlcluster("stop");
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg_ctlcluster("start");
    let (report, sends) = producer.join().expect("producer thread");
    assert_converges(&db.store, &run, &group, &report, &sends).await;

    // The outage was felt (groups retried or split, deliveries failed and came back) and the
    // consumer got over it by itself.
    let (status, text) = http_get(&service_addr(&service), "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    let felt = sample(&text, "idemgate_group_retries_total", "")
        + sample(&text, "idemgate_group_commits_total", "result=\"split\"")
        + sample(&text, "idemgate_deliveries_total", "outcome=\"failed\"");
    assert!(felt > 0.0, "the outage left no trace in the metrics:\n{text}");
    assert!(sample(&text, "idemgate_group_commits_total", "result=\"committed\"") > 0.0);
    let exit = service.terminate();
    assert_eq!(exit.code(), Some(0), "{}", exit.log);
    db.drop_now().await;
}
