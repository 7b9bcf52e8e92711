//! Several instances of the service on one database, as one consumer group runs them: each
//! built by `Application::build` on the same scratch database, each scraped on its own port,
//! their series added up as the dashboard and the alerts add them.

use std::time::{Duration, Instant};

use chrono::Timelike;
use idemgate::app::{Application, Feed, Running};
use idemgate::config::Settings;
use idemgate::store::{Backend, StoreOptions, query_built};
use idemgate_shop as shop;
use idemgate_testkit::scratch::ScratchDb;
use sqlx::Row;

use super::support::{GROUP, metric_at, now_ms};

/// Running instances on one database.
struct Instances {
    db: ScratchDb,
    running: Vec<Running>,
}

impl Instances {
    /// `ids.len()` instances of [`GROUP`] on one scratch database, each changed by `configure`.
    async fn start(backend: Backend, ids: &[&str], configure: impl Fn(&mut Settings)) -> Self {
        let db = ScratchDb::create(backend, &StoreOptions { max_connections: 4, ..Default::default() })
            .await
            .unwrap_or_else(|e| panic!("{e}. Start the service (scripts/services.sh)."));
        let mut running = Vec::new();
        for id in ids {
            let mut settings = shop::settings();
            settings.database.url = db.url.clone();
            settings.http.bind = "127.0.0.1:0".to_owned();
            settings.consumer.group = GROUP.to_owned();
            settings.consumer.instance = (*id).to_owned();
            configure(&mut settings);
            let handlers = settings.handlers_with(shop::handlers()).expect("handlers");
            let app = Application::build_with(&settings, handlers, Feed::Caller)
                .await
                .expect("the instance builds");
            running.push(app.start().await.expect("the instance starts"));
        }
        Self { db, running }
    }

    fn addrs(&self) -> Vec<String> {
        self.running.iter().map(|r| r.url().trim_start_matches("http://").to_owned()).collect()
    }

    /// A metric summed over every instance's scrape, as `sum(...)` over instances adds it.
    async fn summed(&self, prefix: &str) -> f64 {
        let mut total = 0.0;
        for addr in self.addrs() {
            total += metric_at(&addr, prefix).await;
        }
        total
    }

    async fn scalar(&self, sql: &str, binds: &[&str]) -> i64 {
        let mut q = query_built(self.db.store.backend(), sql.to_owned());
        for b in binds {
            q = q.bind(b.to_string());
        }
        let row = q.fetch_one(self.db.store.pool()).await.unwrap_or_else(|e| panic!("{e}: {sql}"));
        row.try_get::<i64, _>(0).expect("an integer")
    }

    async fn execute(&self, sql: &str) {
        let q = query_built(self.db.store.backend(), sql.to_owned());
        q.execute(self.db.store.pool()).await.unwrap_or_else(|e| panic!("{e}: {sql}"));
    }

    async fn stop(self) {
        for running in self.running.into_iter().rev() {
            running.stop().await.expect("the instance stops cleanly");
        }
        self.db.drop_now().await;
    }
}

/// Three instances share one archive schedule tick; a fourth, dead, left a pass running. The
/// archive panels and IdemgateArchiveFailing sum the series over the instances: that sum is
/// each pass once, by its status, and each archived claim once.
async fn three_instances_on_one_database_count_each_archive_pass_once(backend: Backend) {
    // One tick, far enough ahead for the three to be running by then, on the cron's clock (UTC).
    let tick = chrono::Utc::now() + chrono::Duration::seconds(10);
    let schedule = format!("{} {} {} * * *", tick.second(), tick.minute(), tick.hour());
    let instances = Instances::start(backend, &["archiver-1", "archiver-2", "archiver-3"], |s| {
        s.archive.schedule = schedule.clone();
        s.archive.dedup_retention_days = 1;
    })
    .await;
    assert!(
        chrono::Utc::now() + chrono::Duration::seconds(2) < tick,
        "{backend}: started too late for the tick"
    );
    // The dead instance's pass, left running: whoever takes the lease next marks it failed.
    let started = now_ms() - 60_000;
    instances
        .execute(&format!(
            "INSERT INTO archive_run (kind, status, started_by, instance_id, started_at_ms, cutoff_ms) \
             VALUES ('dedup', 'running', 'schedule', 'archiver-dead', {started}, 0)"
        ))
        .await;
    for i in 0..30 {
        instances
            .execute(&format!(
                "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
                 payload_hash, instance_id, claimed_at_ms) VALUES ('{GROUP}', '{}', 'old-{i}', 0, 'M-old-{i}', \
                 'U-old-{i}', 'hash', 'seed', {})",
                shop::STOCK_DEDUCT,
                now_ms() - 2 * 86_400_000,
            ))
            .await;
    }

    // Each of the three records its dedup pass of the tick: one archives, the others skip.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ours = "SELECT COUNT(*) FROM archive_run WHERE kind = 'dedup' AND finished_at_ms IS NOT NULL \
                AND instance_id LIKE 'archiver-_'";
    while instances.scalar(ours, &[]).await < 3 {
        assert!(Instant::now() < deadline, "{backend}: the three instances did not all pass the tick");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let by_status = "SELECT COUNT(*) FROM archive_run WHERE kind = 'dedup' AND status = ?";
    for status in ["success", "failed", "skipped"] {
        let recorded = instances.scalar(by_status, &[status]).await;
        let series = format!("idemgate_archive_runs_total{{consumer_group=\"{GROUP}\",status=\"{status}\"}}");
        assert_eq!(
            instances.summed(&series).await,
            recorded as f64,
            "{backend}: the {status} passes summed over three instances ({recorded} in archive_run)"
        );
    }
    assert_eq!(instances.scalar(by_status, &["failed"]).await, 1, "{backend}: the dead instance's pass");
    assert_eq!(instances.scalar(by_status, &["running"]).await, 0, "{backend}");
    assert_eq!(instances.summed("idemgate_archive_rows_moved_total{").await, 30.0, "{backend}");
    assert_eq!(instances.scalar("SELECT COUNT(*) FROM idempotent_record_archive", &[]).await, 30);

    // The database's last success is every instance's, the same number: its max is the time.
    let mut last = Vec::new();
    for addr in instances.addrs() {
        last.push(metric_at(&addr, "idemgate_archive_last_success_timestamp_seconds{").await);
    }
    assert!(last[0] > 0.0 && last.iter().all(|t| *t == last[0]), "{backend}: {last:?}");
    instances.stop().await;
}

#[tokio::test]
async fn three_sqlite_instances_count_each_archive_pass_once() {
    three_instances_on_one_database_count_each_archive_pass_once(Backend::Sqlite).await;
}

#[tokio::test]
async fn three_postgres_instances_count_each_archive_pass_once() {
    three_instances_on_one_database_count_each_archive_pass_once(Backend::Postgres).await;
}

#[tokio::test]
async fn three_mariadb_instances_count_each_archive_pass_once() {
    three_instances_on_one_database_count_each_archive_pass_once(Backend::MySql).await;
}
