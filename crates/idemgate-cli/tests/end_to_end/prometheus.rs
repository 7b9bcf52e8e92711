//! A real Prometheus scraping a real `idemgate serve` fed by a real broker: every expression of
//! the dashboard and of the recording rules returns data, the duplicate ratio agrees with the
//! delivery log, and `promtool check metrics` accepts the exposition.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idemgate::store::{Backend, Sql};
use sqlx::Row;

use crate::support::*;

/// A Prometheus server on a free port, stopped on drop.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Self {
        let bin =
            which("prometheus").expect("prometheus is required (scripts/install-prometheus.sh installs it)");
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = repo_path("dashboards/prometheus");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n  - {}\n\
                 scrape_configs:\n  - job_name: idemgate\n    static_configs:\n      - targets: ['{target}']\n",
                rules.join("recording.rules.yml").display(),
                rules.join("alerts.rules.yml").display()
            ),
        )
        .expect("write prometheus.yml");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Self { child, port, _dir: dir };
        let started = Instant::now();
        while http_get(&format!("127.0.0.1:{port}"), "/-/ready").map(|(s, _)| s) != Some(200) {
            assert!(started.elapsed() < Duration::from_secs(30), "prometheus did not become ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// An instant query; the result array.
    fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        let (status, body) =
            http_get(&format!("127.0.0.1:{}", self.port), &path).expect("prometheus answers");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(status, 200, "{expr}: {body}");
        assert_eq!(v["status"], "success", "{expr}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until Prometheus holds a sample of `group`'s delivery counters. `rate()` counts
    /// only what a counter gained after its first sample, so deliveries made before the first
    /// scrape would be missing from every rate.
    fn wait_for_first_scrape(&self, group: &str, limit: Duration) {
        let started = Instant::now();
        let expr = format!("idemgate_deliveries_total{{consumer_group=\"{group}\"}}");
        while self.query(&expr).is_empty() {
            assert!(started.elapsed() < limit, "prometheus did not scrape the service within {limit:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
}

/// `rel` in the workspace's top folder, where `dashboards/` is (this crate is `crates/idemgate-cli`).
fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every target expression of the dashboard (the panels of its collapsed rows too), with its
/// template variables filled the way Grafana does with "All" selected and the job `idemgate`.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(repo_path("dashboards/idemgate.json")).expect("dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let top = d["panels"].as_array().expect("panels");
    let nested = top.iter().flat_map(|row| row["panels"].as_array().into_iter().flatten());
    let mut out = Vec::new();
    for panel in top.iter().chain(nested) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let filled = expr
                    .replace("$__rate_interval", "2m")
                    .replace("${cluster}", ".*")
                    .replace("$cluster", ".*")
                    .replace("${job}", "idemgate")
                    .replace("$job", "idemgate")
                    .replace("${biz_type}", ".*")
                    .replace("$biz_type", ".*")
                    .replace("${topic}", ".*")
                    .replace("$topic", ".*")
                    .replace("${instance}", ".*")
                    .replace("$instance", ".*")
                    .replace("${consumer_group}", ".*")
                    .replace("$consumer_group", ".*")
                    // The broker this service consumes: every series must carry it.
                    .replace("${broker}", "rocketmq")
                    .replace("$broker", "rocketmq");
                out.push(filled);
            }
        }
    }
    out
}

fn recording_rules() -> Vec<String> {
    let text =
        std::fs::read_to_string(repo_path("dashboards/prometheus/recording.rules.yml")).expect("rules");
    text.lines().filter_map(|l| l.trim().strip_prefix("- record:")).map(|r| r.trim().to_owned()).collect()
}

static RATIO: Sql = Sql::new(
    "SELECT biz_type, SUM(CASE WHEN outcome = 'duplicate' THEN 1 ELSE 0 END), COUNT(*) FROM delivery_log \
     WHERE consumer_group = ? AND biz_type <> '' GROUP BY biz_type",
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_gets_data_for_every_dashboard_and_rule_expression_and_the_true_duplicate_ratio() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("prom"), unique("group"), unique("M").replace('_', ""));
    let service = Service::start(&with_group_commit(settings(&db.url, &topic, &group, "scraped", 2), 1));
    let addr = service_addr(&service);
    let prometheus = Prometheus::start(&addr);
    prometheus.wait_for_first_scrape(&group, Duration::from_secs(30));
    let (report, sends) = produce(&topic, &run, 2000, 0, &["--duplicates", "0.3", "--early-payments", "0.2"]);
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    // An archive pass, so that the archive panels have runs to show (the service reads
    // archive_run at scrape time, at most every 15 s).
    let archive = Command::new(BIN)
        .args(["archive", "--older-than", "1s"])
        .env("IDEMGATE_DATABASE__URL", &db.url)
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate archive");
    assert!(archive.status.success(), "archive: {}", String::from_utf8_lossy(&archive.stderr));
    // A reconcile run of the service's group, so that the reconciler's panels have data. The
    // traffic's poison payments are dead-lettered, so it finds `lost` keys and exits 6.
    let (code, reconcile_out) = reconcile(&db.url, &group);
    assert_eq!(code, Some(6), "reconcile: {reconcile_out}");
    assert!(
        reconcile_out.contains("double_applied 0") && !reconcile_out.contains("lost 0"),
        "{reconcile_out}"
    );
    tokio::time::sleep(Duration::from_secs(17)).await;

    let (status, exposition) = http_get(&addr, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is required (scripts/install-prometheus.sh installs it)");
    promtool.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    let findings =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && findings.trim().is_empty(), "promtool check metrics: {findings}");

    let mut empty = Vec::new();
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "the dashboard has its expressions: {}", exprs.len());
    for expr in exprs.iter().chain(recording_rules().iter()) {
        if prometheus.query(expr).is_empty() {
            empty.push(expr.clone());
        }
    }

    // The duplicate ratio Prometheus records equals the delivery log's, per biz_type.
    let rows = db.store.query(&RATIO).bind(group.as_str()).fetch_all(db.store.pool()).await.unwrap();
    for row in rows {
        let biz_type: String = row.get(0);
        let (dups, all): (i64, i64) = (row.get(1), row.get(2));
        let truth = dups as f64 / all as f64;
        let series = prometheus.query(&format!(
            "consumer_group_biz_type:idemgate_deliveries_duplicate_per_deliveries:ratio_rate5m{{consumer_group=\"{group}\",biz_type=\"{biz_type}\"}}"
        ));
        let reported: f64 = series
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        assert!(
            (reported - truth).abs() < 0.01,
            "{biz_type}: Prometheus says {reported}, the log says {truth}"
        );
    }
    assert!(empty.is_empty(), "{} expressions returned no data:\n{}", empty.len(), empty.join("\n"));
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}
