//! The web UI in a real headless Chromium (Debian's `chromium` and `chromium-driver`), driven
//! over WebDriver, against `idemgate serve` consuming a real broker with traffic.
//!
//! One payment key is given a story: its first send fails (the order is missing) and is
//! retried until it is dead-lettered; the order then arrives and the producer sends the payment
//! twice more, so the first resend is processed and the second is a `producer_resend`
//! duplicate. The browser loads the overview, types the bizId into the search box and checks
//! that the timeline shows the retries, the dead letter and the producer resend. Screenshots are
//! saved under `target/tmp/browser/` as the test's artifacts.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use idemgate::broker::Producer;
use idemgate::store::Backend;

use super::support::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A chromedriver on a free port, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        for binary in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(binary).exists(),
                "{binary} is missing: scripts/install-chromium.sh installs Debian's chromium and chromium-driver"
            );
        }
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let child = Command::new(CHROMEDRIVER)
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".to_owned()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "chromedriver did not listen within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, url: format!("http://127.0.0.1:{port}") }
    }

    async fn browser(&self, profile: &std::path::Path) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            serde_json::json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--hide-scrollbars", "--window-size=1400,1300",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        ClientBuilder::native().capabilities(caps).connect(&self.url).await.expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn artifacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&dir).expect("artifact directory");
    dir
}

async fn texts(client: &Client, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in client.find_all(Locator::Css(css)).await.expect("find") {
        out.push(e.text().await.expect("text"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engineer_traces_a_key_with_a_resend_a_retry_and_a_dead_letter_in_chromium() {
    let driver = Driver::start();
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("web"), unique("group"), unique("W").replace('_', ""));
    let service = Service::start(&settings(&db.url, &topic, &group, "web", 2));
    let base = format!("http://{}", service_addr(&service));

    // Background traffic, so that the overview has something to show.
    let (report, _) = produce(&topic, &run, 300, 0, &["--duplicates", "0.3", "--poison", "0.02"]);
    assert!(report.sent >= 300, "{report:?}");

    let key = format!("{run}-PAY-TRACE");
    let order_no = format!("{run}-ORD-TRACE");
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");
    producer.send(&payment(&topic, &key, &order_no, 1_250)).await.expect("send the payment");
    wait_for_log(&db.store, &key, "dead letter", |s| s.iter().any(|o| o.starts_with("dead_lettered"))).await;
    producer.send(&order(&topic, &order_no, 1_250)).await.expect("send the order");
    wait_for_log(&db.store, &order_no, "processed order", |s| s.iter().any(|o| o.starts_with("processed")))
        .await;
    producer.send(&payment(&topic, &key, &order_no, 1_250)).await.expect("resend the payment");
    wait_for_log(&db.store, &key, "processed resend", |s| s.iter().any(|o| o.starts_with("processed"))).await;
    producer.send(&payment(&topic, &key, &order_no, 1_250)).await.expect("resend the payment again");
    let seen =
        wait_for_log(&db.store, &key, "duplicate", |s| s.iter().any(|o| o == "duplicate/producer_resend"))
            .await;
    producer.shutdown().await;
    assert_eq!(seen, ["failed/", "failed/", "dead_lettered/", "processed/", "duplicate/producer_resend"]);

    let profile = tempfile::tempdir().expect("profile dir");
    let client = driver.browser(profile.path()).await;
    let shots = artifacts();

    // 1. The overview.
    client.goto(&format!("{base}/")).await.expect("open the overview");
    assert_eq!(
        client.find(Locator::Css("h1")).await.unwrap().text().await.unwrap().split(' ').next(),
        Some("Overview")
    );
    let windows = texts(&client, ".window").await;
    assert_eq!(windows.len(), 2, "two windows: {windows:?}");
    assert!(windows[1].contains("dead letters"), "{windows:?}");
    assert!(client.find(Locator::Css("svg.chart rect")).await.is_ok(), "the chart is drawn");
    std::fs::write(shots.join("overview.png"), client.screenshot().await.expect("screenshot")).unwrap();

    // 2. Search the bizId from the box at the top, as an engineer would.
    let search = client.find(Locator::Css("form.search input[name=q]")).await.expect("the search box");
    search.send_keys(&key).await.expect("type the bizId");
    client.find(Locator::Css("form.search button")).await.unwrap().click().await.expect("search");
    client.wait().for_element(Locator::Css("section.summary")).await.expect("the trace page");
    assert!(client.current_url().await.unwrap().as_str().contains("/trace?q="));

    // 3. The timeline shows the retries, the dead letter and the producer resend.
    let retries = texts(&client, "table.deliveries tr.row-retry").await;
    let dead = texts(&client, "table.deliveries tr.row-dead").await;
    let processed = texts(&client, "table.deliveries tr.row-ok").await;
    let duplicates = texts(&client, "table.deliveries tr.row-dup").await;
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(retries.iter().all(|r| r.contains("does not exist yet")), "the error text is shown: {retries:?}");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].contains("dead lettered"), "{dead:?}");
    assert_eq!(processed.len(), 1, "{processed:?}");
    assert_eq!(duplicates.len(), 1, "{duplicates:?}");
    assert!(duplicates[0].contains("producer resend"), "{duplicates:?}");
    let summary = client.find(Locator::Css("section.summary")).await.unwrap().text().await.unwrap();
    assert!(summary.contains("applied once"), "{summary}");
    assert!(summary.contains("retries 2") && summary.contains("dead letters 1"), "{summary}");
    let business = texts(&client, "dl.facts").await.join("\n");
    assert!(business.contains("PAID") && business.contains(&order_no), "{business}");
    std::fs::write(shots.join("trace.png"), client.screenshot().await.expect("screenshot")).unwrap();

    // The dead-letter list links to the same trace.
    client.goto(&format!("{base}/dead-letters")).await.unwrap();
    let listed = texts(&client, "table.deliveries tr.row-dead").await;
    let row = listed.iter().find(|r| r.contains(&key)).expect("the key is among the dead letters");
    assert!(row.contains("applied since"), "the resend resolved it: {row}");
    assert!(
        listed.iter().any(|r| r.contains("still unapplied")),
        "the poison ones are not resolved: {listed:?}"
    );
    let link = client.find(Locator::LinkText(&key)).await.expect("the key is listed among dead letters");
    link.click().await.unwrap();
    client.wait().for_element(Locator::Css("section.summary")).await.expect("the trace page");
    std::fs::write(shots.join("dead-letters-to-trace.png"), client.screenshot().await.unwrap()).unwrap();

    client.close().await.expect("close the browser");
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}
