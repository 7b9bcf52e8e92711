//! The benchmarks run as a user runs them, at a small size: each checks its own answers, so a
//! benchmark that no longer measures what it says fails here before its figures are taken.

/// `idemgate-bench trace` at a small size on every backend: every lookup it times is checked (the
/// key's deliveries, its claim, and for the hot key a summary that names the second processed
/// delivery deep in its timeline), the old way's summary misses that delivery, and the naive
/// schema's drops name indexes the migrations made. The figures of the full size, and the
/// target they are held to, are in docs/benchmarks.md.
#[test]
fn bench_trace_at_a_small_size_checks_every_lookup_and_names_the_hot_keys_double_apply() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate-bench"))
        .args([
            "trace",
            "--backends",
            "sqlite,postgres,mysql",
            "--claims",
            "2000",
            "--hot-key-rows",
            "20000",
            "--lookups",
            "20",
            "--hot-lookups",
            "5",
            "--old-lookups",
            "2",
            "--naive-lookups",
            "2",
            // A debug build on a busy machine: the timing target is the release run's.
            "--target-p99-ms",
            "60000",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate-bench trace");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let hot_rows: Vec<&str> = stdout.lines().filter(|l| l.contains("| 20000 |")).collect();
    assert_eq!(hot_rows.len(), 3, "one hot-key row per backend:\n{stdout}");
    for row in hot_rows {
        assert!(row.trim_end().ends_with("| no |"), "the old way's 500 rows miss the double apply: {row}");
    }
}
