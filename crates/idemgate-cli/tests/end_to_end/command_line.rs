//! The command line as a user runs it: `idemgate` and `idemgate-shop` started as processes on
//! a SQLite file, their output and exit codes read. The data they read is written through the
//! gate first, with the example shop's handlers.

use idemgate::delivery::Delivery;
use idemgate::gate::{Gate, Policy};
use idemgate::outcome::Outcome;
use idemgate_shop as shop;
use serde_json::Value;

/// The consumer group of the gate that writes the data and of the command line that reads it.
const GROUP: &str = "cli-tests";

/// A gate of `GROUP` on the shop's routes and handlers, assembled as the service assembles it.
fn gate(store: idemgate::store::Store, instance: &str) -> Gate {
    let mut settings = shop::settings();
    settings.consumer.group = GROUP.to_owned();
    settings.consumer.instance = instance.to_owned();
    idemgate::app::assemble_gate(&settings, store, shop::handlers(), None).expect("gate")
}

fn delivered(message: Delivery, msg_id: &str, uniq_key: &str, reconsume: i32) -> Delivery {
    Delivery {
        msg_id: msg_id.to_owned(),
        uniq_key: uniq_key.to_owned(),
        reconsume_times: reconsume,
        ..message
    }
}

/// A `stock.deduct` of `quantity` of `sku` for `biz_id`.
fn stock_deduct(biz_id: &str, msg_id: &str, uniq_key: &str, sku: &str, quantity: i64) -> Delivery {
    let body = shop::DeductStock { sku: sku.to_owned(), quantity };
    delivered(shop::deduction_message(shop::TOPIC, biz_id, &body), msg_id, uniq_key, 0)
}

/// A payment of 500 cents for `order_no`, after `reconsume` failures.
fn payment(payment_no: &str, order_no: &str, msg_id: &str, uniq_key: &str, reconsume: i32) -> Delivery {
    let body = shop::ConfirmPayment {
        order_no: order_no.to_owned(),
        payment_no: payment_no.to_owned(),
        amount_cents: 500,
    };
    delivered(shop::payment_message(shop::TOPIC, &body), msg_id, uniq_key, reconsume)
}

/// An order of SKU-W for 500 cents.
fn order(order_no: &str, msg_id: &str) -> Delivery {
    let body = shop::CreateOrder {
        order_no: order_no.to_owned(),
        user_id: "u-1".to_owned(),
        sku: "SKU-W".to_owned(),
        quantity: 1,
        amount_cents: 500,
    };
    delivered(shop::order_message(shop::TOPIC, &body), msg_id, &format!("U-{msg_id}"), 0)
}

/// A SQLite database in `dir` for the command line to read, with stock of SKU-W: its URL, a
/// store on it and a gate of the group `GROUP`.
async fn command_line_database(
    dir: &tempfile::TempDir,
) -> (String, idemgate::store::Store, idemgate::gate::Gate) {
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("cli.db").display());
    let store = idemgate::store::Store::open(&url, &Default::default()).await.expect("store");
    shop::migrate(&store).await.expect("the shop's tables");
    shop::seed_stock(&store, "SKU-W", 100).await.expect("stock");
    let gate = gate(store.clone(), "cli-1");
    (url, store, gate)
}

/// `idemgate trace` prints the same story in the terminal, and says with its exit code whether
/// it found one key, several or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_command_prints_the_story_and_exits_by_what_it_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (url, store, gate) = command_line_database(&dir).await;
    assert_eq!(
        gate.process(&stock_deduct("D-CLI", "M1", "U1", "SKU-W", 3)).await.outcome,
        Outcome::Processed
    );
    assert_eq!(
        gate.process(&stock_deduct("D-CLI", "M2", "U2", "SKU-W", 3)).await.outcome,
        Outcome::Duplicate
    );
    assert_eq!(gate.process(&order("D-CLI", "M3")).await.outcome, Outcome::Processed);
    store.close().await;

    let run = |args: &[&str]| idemgate(&url, &[&["trace"], args].concat());
    let (code, text, err) = run(&["D-CLI", "--biz-type", "stock.deduct"]);
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(text.contains("state: applied once"), "{text}");
    assert!(text.contains("1 producer_resend"), "{text}");
    assert!(text.contains("by msgId M1"), "{text}");
    assert!(text.contains("stock ledger: applied once"), "{text}");
    assert_eq!(text.matches("\n  20").count(), 2, "two timeline lines: {text}");

    let (code, text, _) = run(&["D-CLI"]);
    assert_eq!(code, Some(5), "two biz_types: {text}");
    assert!(text.contains("biz_type=order.create") && text.contains("biz_type=stock.deduct"), "{text}");

    let (code, text, _) = run(&["M2", "--format", "json"]);
    assert_eq!(code, Some(0));
    let json: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        (json["matched_by"].as_str(), json["story"]["key"]["biz_id"].as_str()),
        (Some("msg_id"), Some("D-CLI"))
    );

    let (code, text, _) = run(&["NOPE-1"]);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("nothing found"));

    // --execute-time reads epoch milliseconds or RFC 3339, as a route does.
    for (time, expected) in
        [("1970-01-01T00:00:00Z", Some(0)), ("0", Some(0)), ("1970-01-01T08:00:00+08:00", Some(0))]
    {
        let (code, text, err) = run(&["D-CLI", "--biz-type", "stock.deduct", "--execute-time", time]);
        assert_eq!(code, expected, "{time}: {text}{err}");
    }
    let (code, text, _) =
        run(&["D-CLI", "--biz-type", "stock.deduct", "--execute-time", "1970-01-01T00:00:01Z"]);
    assert_eq!(code, Some(5), "another execute_time: {text}");
    assert!(text.contains("exists, but not with the biz_type, execute_time or group asked for"), "{text}");

    let (code, _, err) = run(&["bad\u{7}key"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("control character"), "{err}");
}

/// `idemgate trace --by trace_id` finds a key by the trace id its message's `traceparent`
/// carried, as `--by any` does with 32 hex digits, and prints the trace, linked through
/// `http.trace_url_template` when it is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_command_finds_a_key_by_its_trace_id() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (url, store, gate) = command_line_database(&dir).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut d = stock_deduct("D-OTEL", "M1", "U1", "SKU-W", 1);
    d.properties.insert(
        idemgate::delivery::TRACEPARENT_PROPERTY.to_owned(),
        format!("00-{trace_id}-00f067aa0ba902b7-01"),
    );
    assert_eq!(gate.process(&d).await.outcome, Outcome::Processed);
    store.close().await;

    for by in ["trace_id", "any"] {
        let (code, text, err) = idemgate(&url, &["trace", trace_id, "--by", by]);
        assert_eq!(code, Some(0), "--by {by}: {text}{err}");
        assert!(text.contains("bizId \"D-OTEL\"") && text.contains("found by trace id"), "{text}");
        assert!(text.contains(&format!("trace {trace_id}")), "{text}");
    }
    let (code, text, err) = idemgate(&url, &["trace", "not-a-trace", "--by", "trace_id"]);
    assert_eq!(code, Some(1), "{text}{err}");
    assert!(err.contains("a trace id is 32 hex digits"), "{err}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate-shop"))
        .args(["trace", trace_id, "--by", "trace_id"])
        .env("IDEMGATE_DATABASE__URL", &url)
        .env("IDEMGATE_CONSUMER__GROUP", GROUP)
        .env("IDEMGATE_HTTP__TRACE_URL_TEMPLATE", "http://jaeger:16686/trace/{trace_id}")
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("trace {trace_id}  http://jaeger:16686/trace/{trace_id}")), "{text}");
}

/// Runs `idemgate-shop` (idemgate's command line with the example shop's handlers) with
/// `database_url` and `args`: exit code, stdout, stderr.
fn idemgate(database_url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate-shop"))
        .args(args)
        .env("IDEMGATE_DATABASE__URL", database_url)
        .env("IDEMGATE_DATABASE__ACQUIRE_TIMEOUT_MS", "3000")
        .env("IDEMGATE_CONSUMER__GROUP", GROUP)
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Each answer has an exit code of its own, and none is clap's 2 for a command line it cannot
/// read: anomalies found, a replay refused, several keys traced and a mistyped flag are told
/// apart by a script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anomalies_a_refused_replay_several_matches_and_a_usage_error_exit_apart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (url, store, gate) = command_line_database(&dir).await;
    // A payment before its order, at its last attempt: dead-lettered, never applied, lost.
    let last = Policy::default().max_reconsume_times;
    assert_eq!(gate.process(&payment("P-X", "O-X", "M1", "U1", last)).await.outcome, Outcome::DeadLettered);

    let (code, out, err) = idemgate(&url, &["reconcile"]);
    assert_eq!(code, Some(6), "anomalies found: {out}{err}");
    assert!(out.contains("lost"), "{out}");
    let (code, out, err) = idemgate(&url, &["replay", "--biz-id", "P-X", "--dry-run"]);
    assert_eq!(code, Some(0), "a dead letter that can be replayed: {out}{err}");

    // The order comes, the payment is redelivered and applied: its key is claimed now.
    assert_eq!(gate.process(&order("O-X", "M2")).await.outcome, Outcome::Processed);
    assert_eq!(gate.process(&payment("P-X", "O-X", "M3", "U1", 0)).await.outcome, Outcome::Processed);
    // And a stock deduction that happens to carry the same bizId: two keys to trace.
    assert_eq!(gate.process(&stock_deduct("O-X", "M4", "U4", "SKU-W", 1)).await.outcome, Outcome::Processed);
    store.close().await;
    let (code, out, err) = idemgate(&url, &["reconcile"]);
    assert_eq!(code, Some(0), "nothing lost any more: {out}{err}");
    let (code, out, err) = idemgate(&url, &["replay", "--biz-id", "P-X", "--dry-run"]);
    assert_eq!(code, Some(7), "refused, already applied: {out}{err}");
    assert!(out.contains("refused: already applied"), "{out}");
    let (code, out, err) = idemgate(&url, &["trace", "O-X"]);
    assert_eq!(code, Some(5), "O-X is an order and a deduction: {out}{err}");

    for (args, says) in [
        (&["reconcile", "--sinse", "24h"][..], "unexpected argument '--sinse'"),
        (&["trace", "P-X", "--by", "bizid"], "possible values: any, biz_id, msg_id, uniq_key, trace_id"),
        (&["trace", "P-X", "--execute-time", "soon"], "neither epoch milliseconds nor an RFC 3339 time"),
        (
            &["replay", "--biz-id", "P-X", "--execute-time", "tomorrow", "--dry-run"],
            "neither epoch milliseconds",
        ),
        (&["replay", "--dry-run"], "required"),
    ] {
        let (code, out, err) = idemgate(&url, args);
        assert_eq!(code, Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
    }
    let (code, out, _) = idemgate(&url, &["trace", "--help"]);
    assert_eq!(code, Some(0), "help is not an error");
    assert!(out.contains("--execute-time <TIME>"), "{out}");
}

/// A password in the database URL's query string (`?password=`, which the PostgreSQL driver
/// takes) is masked like the `user:password@` one: `idemgate config` prints `***`.
#[test]
fn the_config_command_masks_a_password_in_the_url_query() {
    let (code, out, err) = idemgate("postgres://u@127.0.0.1/x?sslmode=disable&password=hunter2", &["config"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!out.contains("hunter2") && !err.contains("hunter2"), "{out}{err}");
    assert!(out.contains("url = \"postgres://u@127.0.0.1/x?sslmode=disable&password=***\""), "{out}");
}

/// The broker account's secret, from its environment variable, is printed as `***` by
/// `idemgate config`; a secret file that cannot be read stops the command with the key and the
/// path named.
#[test]
fn the_config_command_masks_the_broker_secret_and_names_an_unreadable_secret_file() {
    let run = |vars: &[(&str, &str)]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate-shop"))
            .arg("config")
            .env("IDEMGATE_ROCKETMQ__ACCESS_KEY", "idemgate-orders")
            .envs(vars.iter().copied())
            .env_remove("RUST_LOG")
            .output()
            .expect("run idemgate config");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, out) = run(&[("IDEMGATE_ROCKETMQ__SECRET_KEY", "Zebra-s3cret-9931")]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("Zebra-s3cret-9931"), "{out}");
    assert!(
        out.contains("secret_key = \"***\"") && out.contains("access_key = \"idemgate-orders\""),
        "{out}"
    );
    let (code, out) = run(&[("IDEMGATE_ROCKETMQ__SECRET_KEY_FILE", "/nonexistent/rocketmq-secret")]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("rocketmq.secret_key_file") && out.contains("/nonexistent/rocketmq-secret"),
        "{out}"
    );
}

/// A database that cannot be reached: the error names the masked URL, never the password.
#[test]
fn a_failed_connection_never_prints_the_password() {
    let (code, out, err) = idemgate("postgres://u@127.0.0.1:1/x?password=hunter2", &["migrate"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("postgres://u@127.0.0.1:1/x?password=***"), "the error names the database: {err}");
    assert!(!out.contains("hunter2") && !err.contains("hunter2"), "{out}{err}");
}

/// A password pasted in raw, with the characters a URL gives meaning to (`#`, `?`, `@`, `/`,
/// `&`), in the user information or a query parameter, on every scheme and without one:
/// neither `idemgate config` nor the error of a connection that fails (a closed port) shows any
/// four characters of it in a row.
#[test]
fn a_raw_password_of_any_shape_never_reaches_the_config_or_a_connection_error() {
    let secret = "s3cr#t?p@/w&d";
    for url in [
        format!("postgres://u:{secret}@127.0.0.1:1/x"),
        format!("postgresql://user@server:{secret}@127.0.0.1:1/x?sslmode=disable"),
        format!("mysql://root:{secret}@127.0.0.1:1/test?ssl-mode=DISABLED&charset=utf8mb4"),
        format!("postgres://u@127.0.0.1:1/x?sslmode=disable&password={secret}"),
        format!("mysql://root@127.0.0.1:1/test?charset=utf8mb4&password={secret}"),
        format!("sqlite:///no-such-dir/x.db?key={secret}"),
        format!("u:{secret}@127.0.0.1:1/x"),
    ] {
        for command in ["config", "migrate"] {
            let (code, out, err) = idemgate(&url, &[command]);
            let shown = format!("{out}{err}");
            for piece in secret.as_bytes().windows(4) {
                let piece = std::str::from_utf8(piece).expect("ASCII");
                assert!(!shown.contains(piece), "{command} with {url} shows {piece:?}:\n{shown}");
            }
            if command == "migrate" {
                assert_eq!(code, Some(1), "{url}: {shown}");
            }
        }
    }
}

#[test]
fn the_demo_keeps_the_terminal_for_its_urls_and_status_lines_and_logs_to_a_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .current_dir(dir.path())
        .args(["demo", "--seconds", "4", "--status-every", "1", "--rate", "300", "--duplicates", "0.5"])
        .env("IDEMGATE_HTTP__BIND", "127.0.0.1:0")
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate demo");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Web UI at http://127.0.0.1:"), "{stdout}");
    assert!(stdout.contains("Log in idemgate-demo.log"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.contains("deliveries/s")).count() >= 3, "{stdout}");
    for shown in [&stdout, &stderr] {
        assert!(
            !shown.contains(" WARN ") && !shown.contains(" INFO "),
            "log lines on the terminal:\n{shown}"
        );
    }
    let log = std::fs::read_to_string(dir.path().join("idemgate-demo.log")).expect("the demo's log file");
    assert!(log.contains("duplicate delivery skipped"), "the duplicates' warnings went to the file");
}

/// `idemgate serve` with `config` (TOML) and nothing else: its exit code and standard error.
fn serve(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("idemgate.toml");
    std::fs::write(&path, config).expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["--config", &path.to_string_lossy(), "serve"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate serve");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn serve_refuses_to_start_without_routes_or_a_consumer_group_and_names_what_is_missing() {
    let route =
        "[[routes]]\ntopic = \"wallet\"\ntags = \"*\"\nbiz_type = \"wallet.credit\"\nbiz_id = \"keys\"\n";
    let (code, err) = serve(route);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("consumer.group: is not set"), "{err}");
    let (code, err) = serve("[consumer]\ngroup = \"wallet_consumer\"\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no [[routes]] entry is configured"), "{err}");
    // The example's routes are no one's default: `idemgate` itself has no shop handler.
    let shop_route = "[consumer]\ngroup = \"g\"\n[[routes]]\ntopic = \"t\"\ntags = \"*\"\nbiz_type = \"stock.deduct\"\nbiz_id = \"keys\"\n";
    let (code, err) = serve(shop_route);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no handler named \"stock.deduct\""), "{err}");
}

/// `--version` names the service's version, the one `idemgate_build_info` carries, and exits 0
/// with nothing on standard error; so does the shop's binary, under its own name.
#[test]
fn the_version_flag_prints_the_service_version_and_exits_zero() {
    for (binary, name) in
        [(env!("CARGO_BIN_EXE_idemgate"), "idemgate"), (env!("CARGO_BIN_EXE_idemgate-shop"), "idemgate-shop")]
    {
        for flag in ["--version", "-V"] {
            let out = std::process::Command::new(binary).arg(flag).output().expect("run --version");
            let (stdout, stderr) =
                (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert_eq!(out.status.code(), Some(0), "{name} {flag}: {stdout}{stderr}");
            assert_eq!(stdout, format!("{name} {}\n", idemgate::VERSION), "{name} {flag}");
            assert!(stderr.is_empty(), "{name} {flag}: {stderr}");
        }
    }
    assert_eq!(idemgate::VERSION, env!("CARGO_PKG_VERSION"), "one version for the workspace");
}

/// The demo stops on SIGTERM as on Ctrl-C, exiting 0: what `docker stop` and `kubectl delete`
/// send, and what a container's first process only hears with a handler of its own.
#[test]
fn the_demo_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut demo = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .current_dir(dir.path())
        .args(["demo", "--rate", "100", "--status-every", "1"])
        .env("IDEMGATE_HTTP__BIND", "127.0.0.1:0")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run idemgate demo");
    // Once it runs: its first status line (`  1s  … deliveries/s  processed …`).
    let mut stdout = std::io::BufReader::new(demo.stdout.take().expect("stdout"));
    let mut seen = String::new();
    while !seen.contains("deliveries/s  processed") {
        let mut line = String::new();
        let read = std::io::BufRead::read_line(&mut stdout, &mut line).expect("the demo's output");
        assert!(read > 0, "the demo ended before its first status line:\n{seen}");
        seen.push_str(&line);
    }
    let term = std::process::Command::new("kill").args(["-TERM", &demo.id().to_string()]).status();
    assert!(term.expect("kill -TERM").success());
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = demo.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(20) {
            let _ = demo.kill();
            panic!("the demo did not stop within 20 s of SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(0), "{seen}");
}
