//! The deployment files under `deploy/`, checked by the tools that would refuse them: the
//! systemd unit by `systemd-analyze` (`verify`, and `security --offline` for its exposure), the
//! Kubernetes objects by `kubernetes-validate` against the API's schemas and the two
//! prometheus-operator objects against the JSON schemas of `monitoring.coreos.com/v1`, each
//! check shown to refuse a broken copy; and the settings they ship by `idemgate config`.
//! `scripts/install-deploy-checks.sh` installs the tools (once per machine); a tool that is
//! missing fails these tests.

mod kubernetes;
mod systemd;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The workspace's root, where `deploy/` and `scripts/` are.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace root")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `command`, failing the test with `install` named when the program is not there.
fn run(command: &mut Command, install: &str) -> Output {
    command.output().unwrap_or_else(|e| panic!("cannot run {:?} ({e}): {install}", command.get_program()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Where `scripts/install-deploy-checks.sh` put the validators: it installs them the first time
/// and only prints the place afterwards.
fn checks_root() -> PathBuf {
    let out = run(
        &mut Command::new(root().join("scripts/install-deploy-checks.sh")),
        "scripts/install-deploy-checks.sh is part of the workspace",
    );
    assert!(out.status.success(), "scripts/install-deploy-checks.sh failed:\n{}", text(&out.stderr));
    PathBuf::from(text(&out.stdout).trim())
}

/// The longest `idemgate serve` takes to stop after SIGTERM with `http`'s settings: each
/// delivery in flight is answered within the broker's answer deadline (RocketMQ's, the default), then the HTTP server lets the
/// requests it holds finish, each within `http.request_timeout_ms`.
fn drain_time(request_timeout_ms: u64) -> Duration {
    idemgate::broker::Limits::ROCKETMQ.answer_within + Duration::from_millis(request_timeout_ms)
}

/// `idemgate --config FILE config` for the TOML `config`, with `env` (and no other
/// `IDEMGATE_` variable of this process): its exit code, and the effective settings it prints.
fn effective_config(config: &str, env: &[(String, String)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("idemgate.toml");
    std::fs::write(&path, config).expect("write the configuration");
    let mut command = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    command.args(["--config", &path.to_string_lossy(), "config"]).current_dir(dir.path());
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("IDEMGATE_")) {
        command.env_remove(key);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    let out = run(&mut command, "the idemgate binary is built with the tests");
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// One value of the settings `idemgate config` printed, by its dotted key.
fn setting(printed: &str, key: &str) -> toml::Value {
    let settings: toml::Value = toml::from_str(printed)
        .unwrap_or_else(|e| panic!("idemgate config printed no TOML ({e}):\n{printed}"));
    key.split('.')
        .try_fold(&settings, |value, part| value.get(part))
        .unwrap_or_else(|| panic!("{key} is not in the printed settings:\n{printed}"))
        .clone()
}

/// Fails when the TOML `config` (shipped as `file`) sets a secret: those come from the
/// environment, out of the file that is readable by all.
fn assert_sets_no_secret(config: &str, file: &str) {
    let settings: toml::Value = toml::from_str(config).unwrap_or_else(|e| panic!("{file}: {e}"));
    for key in ["database.url", "http.auth_token", "http.basic_password", "redis.url"] {
        let set = key.split('.').try_fold(&settings, |value, part| value.get(part)).is_some();
        assert!(!set, "{file} sets {key}: secrets go in the environment");
    }
}
