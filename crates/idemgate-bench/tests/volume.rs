//! `idemgate-bench volume` as a user runs it, at a small size. The benchmark checks its own
//! answers (the gate's books after every run, each trace's claim and both deliveries, a clean
//! reconcile, an archive pass and the log's retention that leave nothing past their cutoff), so a
//! benchmark that no longer measures what it says fails here before its figures are taken.

/// Runs `idemgate-bench volume` on PostgreSQL and MariaDB with 300 messages and 10 lookups a
/// step, and `args`; its standard output, once it has succeeded.
fn volume(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate-bench"))
        .args(["volume", "--backends", "postgres,mysql", "--messages", "300", "--lookups", "10"])
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run idemgate-bench volume");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout.into_owned()
}

/// Two steps on PostgreSQL and MariaDB: each step's row is printed, the second step holds ten
/// times the claims and two log rows each, and every pass did work.
#[test]
fn bench_volume_at_a_small_size_fills_measures_and_checks_each_step() {
    let stdout = volume(&["--sizes", "9000,90000"]);
    for backend in ["postgres", "mysql"] {
        let rows: Vec<Vec<&str>> = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("| {backend} | ")) && l.matches('|').count() == 25)
            .map(|l| l.split('|').map(str::trim).filter(|c| !c.is_empty()).collect())
            .collect();
        assert_eq!(rows.len(), 2, "{backend}: one row per step:\n{stdout}");
        for (row, loaded) in rows.iter().zip([9_000i64, 90_000]) {
            let number = |i: usize| row[i].parse::<f64>().unwrap_or_else(|_| panic!("{backend}: {row:?}"));
            // The loaded claims, the gate's own, and two log rows for each claim of the log's
            // 14 days (of the 90).
            let logged = 2 * loaded * 14 / 90;
            assert!(number(1) as i64 > loaded && number(2) as i64 >= logged * 9 / 10, "{backend}: {row:?}");
            assert!(number(4) > 100.0 && number(5) > 100.0, "bytes per claim and per log row: {row:?}");
            assert!(number(6) > 0.0 && number(7) > 0.0, "the gate's rate and its ratio: {row:?}");
            assert!(number(9) > 0.0 && number(10) > 0.0, "the naive pattern's rate and its ratio: {row:?}");
            // One day of the 90 each: a ninetieth of the log, give or take the fills' edges,
            // deleted row by row, then the next one dropped whole.
            let day = 2 * loaded / 90;
            for (column, what) in [(16, "deleted row by row"), (20, "dropped")] {
                let rows = number(column) as i64;
                assert!(
                    (day * 8 / 10..=day * 12 / 10).contains(&rows),
                    "{backend}: {rows} {what}, of ~{day}: {row:?}"
                );
            }
        }
    }
    assert!(stdout.contains("| idempotent_record | idempotent_record_claim_key |"), "{stdout}");
    assert!(stdout.contains("| delivery_log | delivery_log_key |"), "{stdout}");
    assert!(!stdout.contains("idempotent_record_biz_id"), "the key led by biz_id serves bizId: {stdout}");
}

/// `--first-claim-shape` measures the claim as it was first shaped, to compare: its index on
/// biz_id is there after every pass, and the archive job left the key as it was.
#[test]
fn bench_volume_measures_the_first_claim_shape_when_asked() {
    let stdout = volume(&["--sizes", "9000", "--first-claim-shape"]);
    assert!(stdout.contains("the claim as first shaped"), "{stdout}");
    for backend in ["postgres", "mysql"] {
        let biz_id_index = format!("| {backend} | ");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&biz_id_index) && l.contains("| idempotent_record_biz_id |")),
            "{backend}: the index on biz_id is measured: {stdout}"
        );
    }
}
