//! The HTTP server against clients that hold on to it, each a real TCP socket: request heads
//! that never end, form bodies that trickle in a byte at a time, more connections than
//! `http.max_client_connections`; the deliveries and the pages go on meanwhile. And the address
//! the service hands out for its web UI (`http.public_url`), in its metrics and its links.

use std::time::{Duration, Instant};

use idemgate::outcome::Outcome;
use idemgate::store::Backend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::*;

/// A connection whose request head never ends: the request line and one header begun.
async fn half_sent(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let start = format!("GET /api/overview HTTP/1.1\r\nHost: {addr}\r\nX-Still-Typing: ");
    stream.write_all(start.as_bytes()).await.expect("send");
    stream
}

/// How long `stream` stays open before the server closes it (end of stream or a reset), waiting
/// at most `limit`; `None` when it is still open then.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut answer)).await.ok().map(|_| started.elapsed())
}

/// The answer to a replay form whose 1,000-byte body comes one byte every 200 ms, and how long
/// the server kept the connection open after the head; `None` when it was still open after
/// `limit`.
async fn trickled_form(addr: String, limit: Duration) -> (String, Option<Duration>) {
    let stream = TcpStream::connect(&addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    writer.write_all(&head(&addr, "POST", "/replay", &form, 1_000)).await.expect("send");
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        while writer.write_all(b"a").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(limit, reader.read_to_end(&mut answer)).await;
    trickle.abort();
    (String::from_utf8_lossy(&answer).to_ascii_lowercase(), read.ok().map(|_| started.elapsed()))
}

pub async fn http_header_read_timeout_ms(b: Backend) {
    let app = spawn_app(b, |s| s.http.header_read_timeout_ms = 500).await;
    let mut slow = half_sent(&app.addr).await;
    let closed = closed_within(&mut slow, Duration::from_secs(5)).await;
    assert!(
        closed.is_some_and(|t| t >= Duration::from_millis(400) && t < Duration::from_secs(3)),
        "a half-sent request head is closed after half a second (the default waits 10 s): {closed:?}"
    );
    assert_eq!(app.metric("idemgate_http_timeouts_total{phase=\"header\"}").await, 1.0);
    app.stop().await;
}

pub async fn http_request_timeout_ms(b: Backend) {
    let app = spawn_app(b, |s| {
        s.http.query_timeout_ms = 300;
        s.http.request_timeout_ms = 800;
    })
    .await;
    let (answer, took) = trickled_form(app.addr.clone(), Duration::from_secs(5)).await;
    assert!(answer.starts_with("http/1.1 408"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(
        took.is_some_and(|t| t >= Duration::from_millis(700) && t < Duration::from_secs(3)),
        "a trickling body is cut after 0.8 s (the default waits 30 s): {took:?}"
    );
    assert_eq!(app.metric("idemgate_http_timeouts_total{phase=\"request\"}").await, 1.0);
    app.stop().await;
}

pub async fn http_max_client_connections(b: Backend) {
    let app = spawn_app(b, |s| {
        s.http.max_client_connections = 2;
        s.http.header_read_timeout_ms = 60_000;
    })
    .await;
    // Two connections that send nothing hold both places.
    let first = TcpStream::connect(&app.addr).await.expect("connect");
    let second = TcpStream::connect(&app.addr).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let addr = app.addr.clone();
    let third = tokio::spawn(async move { request(&addr, "GET", "/healthz", &[], b"").await });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!third.is_finished(), "a third connection waits while two are open (the default serves 256)");
    drop(first);
    let answered = tokio::time::timeout(Duration::from_secs(5), third).await;
    let reply = answered.expect("served once a place is free").expect("request");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(app.metric("idemgate_http_connection_limit_reached_total").await >= 1.0);
    // What is open while this scrape is served: the second idle connection and the scrape.
    assert_eq!(app.metric("idemgate_http_open_connections").await, 2.0);
    drop(second);
    app.stop().await;
}

pub async fn http_public_url(b: Backend) {
    let app = spawn_app(b, |s| {
        s.http.public_url = "https://idemgate.example.com/".to_owned();
        s.http.grafana_url = "http://grafana.example:3000/d/idemgate".to_owned();
    })
    .await;
    let metrics = app.get("/metrics").await.body;
    let info = metrics.lines().find(|l| l.starts_with("idemgate_build_info{")).expect("idemgate_build_info");
    assert!(info.contains("ui_url=\"https://idemgate.example.com\""), "{info}");
    assert_eq!(app.gate().process(&deduct("pub-1")).await.outcome, Outcome::Processed);
    let page = app.get("/trace?q=pub-1").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let grafana =
        "href=\"http://grafana.example:3000/d/idemgate?var-idemgate_url=https%3A%2F%2Fidemgate.example.com&";
    assert!(page.body.contains(grafana), "the Grafana link leads back to this UI: {}", page.body);
    // The links lead to a name the service answers to, though allowed_hosts does not list it.
    let reply = request(&app.addr, "GET", "/api/overview", &[("Host", "idemgate.example.com")], b"").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    app.stop().await;
}

#[tokio::test]
async fn a_service_bound_to_every_address_names_its_machine_in_its_links_not_0_0_0_0() {
    let app = spawn_app(Backend::Sqlite, |s| s.http.bind = "0.0.0.0:0".to_owned()).await;
    let port = app.addr.rsplit(':').next().expect("a port").to_owned();
    let machine = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the host name");
    let metrics = app.get("/metrics").await.body;
    let info = metrics.lines().find(|l| l.starts_with("idemgate_build_info{")).expect("idemgate_build_info");
    assert!(info.contains(&format!("ui_url=\"http://{}:{port}\"", machine.trim())), "{info}");
    assert!(!info.contains("0.0.0.0"), "{info}");
    app.stop().await;
}

#[tokio::test]
async fn half_sent_requests_and_trickling_bodies_are_cut_while_the_gate_and_the_ui_go_on() {
    for backend in [Backend::Sqlite, Backend::Postgres, Backend::MySql] {
        let app = spawn_app(backend, |s| {
            s.http.header_read_timeout_ms = 3_000;
            s.http.query_timeout_ms = 1_000;
            s.http.request_timeout_ms = 3_500;
        })
        .await;
        let opened = Instant::now();
        let mut slow = Vec::new();
        for _ in 0..200 {
            slow.push(half_sent(&app.addr).await);
        }
        let trickling = tokio::spawn(trickled_form(app.addr.clone(), Duration::from_secs(10)));

        // Meanwhile the pages answer and the deliveries go through the gate.
        assert_eq!(app.get("/api/overview").await.status, 200, "{backend}");
        for i in 0..20 {
            let d = app.gate().process(&deduct(&format!("flood-{i}"))).await;
            assert_eq!(d.outcome, Outcome::Processed, "{backend}");
        }
        let page = app.get("/trace?q=flood-7").await;
        assert_eq!(page.status, 200, "{backend}: {}", page.body);
        assert!(page.body.contains("flood-7"), "{backend}");
        assert!(
            opened.elapsed() < Duration::from_secs(3),
            "{backend}: the pages answered while all were open"
        );
        let ledger = "SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id LIKE ?";
        assert_eq!(app.scalar(ledger, &["flood-%"]).await, 20, "{backend}");

        // Every half-sent head is closed after the header timeout, the trickling body after the
        // request timeout.
        for (i, stream) in slow.iter_mut().enumerate() {
            let left = Duration::from_secs(10).saturating_sub(opened.elapsed());
            assert!(
                closed_within(stream, left).await.is_some(),
                "{backend}: half-sent request {i} still open"
            );
        }
        let (answer, took) = trickling.await.expect("the trickling client");
        assert!(answer.starts_with("http/1.1 408"), "{backend}: {answer}");
        assert!(took.is_some_and(|t| t < Duration::from_secs(6)), "{backend}: {took:?}");
        assert_eq!(app.metric("idemgate_http_timeouts_total{phase=\"header\"}").await, 200.0, "{backend}");
        assert_eq!(app.metric("idemgate_http_timeouts_total{phase=\"request\"}").await, 1.0, "{backend}");
        app.stop().await;
    }
}

#[tokio::test]
async fn stopping_waits_for_slow_clients_no_longer_than_the_timeouts() {
    let app = spawn_app(Backend::Sqlite, |s| {
        s.http.header_read_timeout_ms = 1_000;
        s.http.query_timeout_ms = 300;
        s.http.request_timeout_ms = 1_500;
    })
    .await;
    let _head = half_sent(&app.addr).await;
    let trickling = tokio::spawn(trickled_form(app.addr.clone(), Duration::from_secs(60)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(10), app.stop()).await;
    let took = started.elapsed();
    assert!(
        stopped.is_ok(),
        "stopping still waits after {took:?} on a half-sent head and a body that never ends"
    );
    assert!(
        took < Duration::from_secs(5),
        "stopping waited {took:?} on a half-sent head and a body that never ends"
    );
    let (answer, _) = trickling.await.expect("the trickling client");
    assert!(answer.starts_with("http/1.1 408"), "the request in flight was answered: {answer}");
}
