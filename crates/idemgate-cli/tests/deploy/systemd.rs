//! `deploy/systemd/`: the unit, its example configuration and its example secrets file.

use std::process::Command;
use std::time::Duration;

use super::{assert_sets_no_secret, drain_time, effective_config, read, run, setting, text};

const UNIT: &str = "deploy/systemd/idemgate.service";
/// Where the unit runs the binary: where `cargo install --root /usr/local` puts it.
const INSTALLED: &str = "ExecStart=/usr/local/bin/idemgate ";
const INSTALL_SYSTEMD: &str = "install Debian's systemd package (scripts/install-deploy-checks.sh does)";

/// The unit's text with its `ExecStart` running the binary these tests were built with, which
/// `systemd-analyze verify` requires to exist.
fn unit_with_built_binary() -> String {
    let unit = read(UNIT);
    assert_eq!(unit.matches(INSTALLED).count(), 1, "{UNIT} runs the installed binary:\n{unit}");
    unit.replace(INSTALLED, &format!("ExecStart={} ", env!("CARGO_BIN_EXE_idemgate")))
}

/// `systemd-analyze ARGS… idemgate.service` on `unit`, written to a folder of its own: exit code,
/// and standard output and error together.
fn systemd_analyze(args: &[&str], unit: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("idemgate.service");
    std::fs::write(&path, unit).expect("write the unit");
    let out = run(Command::new("systemd-analyze").args(args).arg(&path), INSTALL_SYSTEMD);
    (out.status.code(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
}

/// The value of `key=` in the unit, when it is set once.
fn directive<'a>(unit: &'a str, key: &str) -> Option<&'a str> {
    let prefix = format!("{key}=");
    let mut values = unit.lines().filter_map(|l| l.strip_prefix(prefix.as_str()));
    let value = values.next();
    assert!(values.next().is_none(), "{key} is set more than once");
    value
}

#[test]
fn the_unit_passes_systemd_analyze_verify_without_a_warning_and_a_broken_copy_does_not() {
    let unit = unit_with_built_binary();
    let (code, said) = systemd_analyze(&["verify"], &unit);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.trim().is_empty(), "systemd-analyze verify has something to say:\n{said}");

    // A binary that is not there fails; a misspelt key and a bad value are warned about.
    let missing = unit.replace(env!("CARGO_BIN_EXE_idemgate"), "/nonexistent/idemgate");
    let (code, said) = systemd_analyze(&["verify"], &missing);
    assert_ne!(code, Some(0), "{said}");
    assert!(said.contains("is not executable"), "{said}");
    let misspelt = unit
        .replace("NoNewPrivileges=yes", "NoNewPriviledges=yes")
        .replace("ProtectSystem=strict", "ProtectSystem=strickt");
    let (_, said) = systemd_analyze(&["verify"], &misspelt);
    assert!(said.contains("Unknown key 'NoNewPriviledges'"), "{said}");
    assert!(said.contains("strickt"), "{said}");
}

#[test]
fn the_unit_is_hardened_as_a_network_service_and_systemd_rates_its_exposure_at_most_1_5() {
    let unit = read(UNIT);
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("StateDirectory", "idemgate"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("Restart", "on-failure"),
        ("UMask", "0077"),
    ] {
        assert_eq!(directive(&unit, key), Some(value), "{key} in {UNIT}");
    }
    assert!(unit.lines().any(|l| l == "SystemCallFilter=@system-service"), "{UNIT}");

    let (code, said) = systemd_analyze(&["security", "--offline=true"], &unit_with_built_binary());
    assert_eq!(code, Some(0), "{said}");
    let exposure: f64 = said
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for idemgate.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|figure| figure.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure level:\n{said}"));
    assert!(exposure <= 1.5, "exposure {exposure}:\n{said}");
}

/// systemd kills the service when `TimeoutStopSec` runs out: it must outlast the drain.
#[test]
fn the_unit_gives_the_service_longer_to_stop_than_it_takes_to_drain() {
    let unit = read(UNIT);
    let (code, printed, err) = effective_config(&read("deploy/systemd/idemgate.toml"), &[]);
    assert_eq!(code, Some(0), "{err}");
    let request_timeout_ms = setting(&printed, "http.request_timeout_ms").as_integer().expect("a number");
    let drain = drain_time(request_timeout_ms as u64);
    let stop: u64 = directive(&unit, "TimeoutStopSec").expect("TimeoutStopSec").parse().expect("seconds");
    assert!(
        Duration::from_secs(stop) >= drain + Duration::from_secs(10),
        "TimeoutStopSec={stop} leaves under 10 s beyond the drain ({drain:?})"
    );
    assert_eq!(directive(&unit, "KillSignal"), Some("SIGTERM"));
}

/// The example configuration is valid as it stands, keeps the loopback bind, and its secrets
/// file (installed mode 0600) holds only settings the service reads, masked when printed.
#[test]
fn the_example_configuration_is_valid_and_its_secrets_file_is_read_as_settings() {
    let env_file = read("deploy/systemd/idemgate.env");
    let mut env: Vec<(String, String)> = env_file
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("not KEY=value: {l}"));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert!(env.iter().all(|(k, _)| k.starts_with("IDEMGATE_") && k.contains("__")), "{env:?}");
    // The commented-out secrets too, with a password and a token.
    for line in env_file.lines().filter_map(|l| l.strip_prefix("# IDEMGATE_")) {
        let (k, v) = line.split_once('=').expect("KEY=value");
        env.retain(|(key, _)| key != &format!("IDEMGATE_{k}"));
        env.push((format!("IDEMGATE_{k}"), v.to_owned()));
    }
    let config = read("deploy/systemd/idemgate.toml");
    let (code, printed, err) = effective_config(&config, &env);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(setting(&printed, "http.bind").as_str(), Some("127.0.0.1:8080"), "{printed}");
    assert_eq!(setting(&printed, "consumer.group").as_str(), Some("wallet_consumer"));
    assert!(!printed.contains("CHANGE-ME"), "a secret printed:\n{printed}");
    assert_eq!(setting(&printed, "http.auth_token").as_str(), Some("***"));
    assert_sets_no_secret(&config, "deploy/systemd/idemgate.toml");
    let unit = read(UNIT);
    assert_eq!(directive(&unit, "EnvironmentFile"), Some("/etc/idemgate/idemgate.env"));
    assert!(
        unit.contains("install -m 0600 deploy/systemd/idemgate.env /etc/idemgate/idemgate.env"),
        "{UNIT}"
    );
}
