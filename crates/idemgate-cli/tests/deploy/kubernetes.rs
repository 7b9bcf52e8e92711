//! `deploy/kubernetes/`: the Deployment, its ConfigMap and Service, the ServiceMonitor, the
//! PrometheusRule made from the rule files, and the example Secret.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;
use serde_yaml::Value;

use super::{
    assert_sets_no_secret, checks_root, drain_time, effective_config, read, root, run, setting, text,
};

const DIR: &str = "deploy/kubernetes";
/// The files `kubectl apply -f deploy/kubernetes/` applies, and the example Secret in
/// `examples/`; a file added to either folder fails `every_file_in_the_folder_is_checked`
/// until it is listed here.
const FILES: [&str; 6] = [
    "configmap.yaml",
    "deployment.yaml",
    "service.yaml",
    "servicemonitor.yaml",
    "prometheusrule.yaml",
    "examples/secret.yaml",
];

fn files() -> Vec<String> {
    FILES.iter().map(|f| format!("{DIR}/{f}")).collect()
}

/// Every object of `relative`, a YAML file of one or more documents.
fn objects(relative: &str) -> Vec<Value> {
    let text = read(relative);
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| Value::deserialize(document).unwrap_or_else(|e| panic!("{relative}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The one object of `kind` across the manifests.
fn object(kind: &str) -> Value {
    let found: Vec<Value> =
        files().iter().flat_map(|f| objects(f)).filter(|o| o["kind"].as_str() == Some(kind)).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found.into_iter().next().expect("one")
}

/// `kubernetes-validate --strict` (unknown fields refused) on `paths`: exit code and what it said.
fn kubernetes_validate(paths: &[PathBuf]) -> (Option<i32>, String) {
    let validator = checks_root().join("venv/bin/kubernetes-validate");
    let out =
        run(Command::new(&validator).arg("--strict").args(paths), "run scripts/install-deploy-checks.sh");
    (out.status.code(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
}

/// `scripts/check-crds.mjs` on `objects` (source, object): exit code and what it said.
fn check_crds(objects: &[(String, Value)]) -> (Option<i32>, String) {
    let input: Vec<serde_json::Value> = objects
        .iter()
        .map(|(source, object)| {
            serde_json::json!({ "source": source, "object": serde_json::to_value(object).expect("JSON") })
        })
        .collect();
    let mut child = Command::new("node")
        .arg(root().join("scripts/check-crds.mjs"))
        .arg(checks_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run node ({e}): run scripts/install-deploy-checks.sh"));
    serde_json::to_writer(child.stdin.take().expect("stdin"), &input).expect("write the objects");
    let out = child.wait_with_output().expect("node");
    (out.status.code(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
}

fn is_custom(object: &Value) -> bool {
    object["apiVersion"].as_str().is_some_and(|v| v.starts_with("monitoring.coreos.com/"))
}

#[test]
fn every_file_in_the_folder_is_checked() {
    let mut listed = files();
    listed.sort();
    let mut found = Vec::new();
    for dir in [DIR.to_owned(), format!("{DIR}/examples")] {
        for entry in std::fs::read_dir(root().join(&dir)).expect("deploy/kubernetes") {
            let path = entry.expect("entry").path();
            if path.is_file() {
                found.push(format!("{dir}/{}", path.file_name().expect("name").to_string_lossy()));
            }
        }
    }
    found.sort();
    assert_eq!(found, listed);
}

/// The built-in kinds against Kubernetes' own schemas, strictly; the prometheus-operator kinds,
/// for which kubernetes-validate has no schema, against theirs. Each check refuses a broken copy.
#[test]
fn the_manifests_pass_the_kubernetes_and_prometheus_operator_schemas_and_broken_copies_do_not() {
    let paths: Vec<PathBuf> = files().iter().map(|f| root().join(f)).collect();
    let (code, said) = kubernetes_validate(&paths);
    assert_eq!(code, Some(0), "{said}");
    let all: Vec<(String, Value)> =
        files().iter().flat_map(|f| objects(f).into_iter().map(move |o| (f.clone(), o))).collect();
    for (file, object) in &all {
        let name = format!(
            "{}/{}",
            object["kind"].as_str().unwrap_or("").to_lowercase(),
            object["metadata"]["name"].as_str().unwrap_or("")
        );
        if is_custom(object) {
            assert!(
                said.contains(&format!(
                    "WARN {} Couldn't find schema for kind {}",
                    root().join(file).display(),
                    object["kind"].as_str().unwrap_or("")
                )),
                "{said}"
            );
        } else {
            assert!(said.contains(&format!("passed for resource {name} ")), "{name} not validated:\n{said}");
        }
    }
    let custom: Vec<(String, Value)> = all.iter().filter(|(_, o)| is_custom(o)).cloned().collect();
    assert_eq!(custom.len(), 3, "the ServiceMonitor and two PrometheusRules");
    let (code, said) = check_crds(&custom);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(said.lines().filter(|l| l.starts_with("VALID ")).count(), 3, "{said}");

    // Broken copies: a misspelt field and a port that is no number in the Deployment; a rule
    // without its expression and a scrape interval that is no duration.
    let dir = tempfile::tempdir().expect("temp dir");
    let deployment = read(&format!("{DIR}/deployment.yaml"));
    for (name, broken) in [
        ("misspelt.yaml", deployment.replace("readinessProbe:", "readinesProbe:")),
        ("port.yaml", deployment.replace("containerPort: 8080", "containerPort: http-8080")),
    ] {
        assert_ne!(broken, deployment);
        let path = dir.path().join(name);
        std::fs::write(&path, broken).expect("write");
        let (code, said) = kubernetes_validate(&[path]);
        assert_eq!(code, Some(1), "{name}: {said}");
        assert!(said.contains("ERROR") && said.contains("did not validate"), "{name}: {said}");
    }
    let mut slow = object("ServiceMonitor");
    slow["spec"]["endpoints"][0]["interval"] = Value::from("half a minute");
    let rules = objects(&format!("{DIR}/prometheusrule.yaml"));
    let mut ruleless = rules[1].clone();
    let first_rule = &mut ruleless["spec"]["groups"][0]["rules"][0];
    first_rule.as_mapping_mut().expect("a rule").remove("expr");
    let (code, said) = check_crds(&[("interval".to_owned(), slow), ("expr".to_owned(), ruleless)]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("INVALID interval") && said.contains("/interval must match pattern"), "{said}");
    assert!(said.contains("INVALID expr") && said.contains("must have required property expr"), "{said}");
    // An object of a kind the check has no schema for is not let through.
    let mut unknown = rules[0].clone();
    unknown["apiVersion"] = Value::from("monitoring.coreos.com/v2");
    let (code, said) = check_crds(&[("unknown".to_owned(), unknown)]);
    assert_eq!(code, Some(2), "{said}");
}

/// The kubelet's probes reach `/healthz` and `/readyz` on the port the ConfigMap binds, every
/// address of the pod; the pod is given longer to stop than the service takes to drain.
#[test]
fn the_deployment_probes_health_and_readiness_on_the_bound_port_and_outlasts_the_drain() {
    let deployment = object("Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let port = &container["ports"][0];
    assert_eq!((port["name"].as_str(), port["containerPort"].as_u64()), (Some("http"), Some(8080)));
    for (probe, path) in
        [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]
    {
        let get = &container[probe]["httpGet"];
        assert_eq!((get["path"].as_str(), get["port"].as_str()), (Some(path), Some("http")), "{probe}");
    }

    let config = config_map_settings();
    let (code, printed, err) = effective_config(&config, &[]);
    assert_eq!(code, Some(0), "the ConfigMap's idemgate.toml: {err}");
    assert_eq!(setting(&printed, "http.bind").as_str(), Some("0.0.0.0:8080"), "{printed}");
    let request_timeout_ms = setting(&printed, "http.request_timeout_ms").as_integer().expect("a number");
    let drain = drain_time(request_timeout_ms as u64);
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
    assert!(
        Duration::from_secs(grace) >= drain + Duration::from_secs(10),
        "terminationGracePeriodSeconds {grace} leaves under 10 s beyond the drain ({drain:?})"
    );
    assert_eq!(
        container["args"],
        serde_yaml::from_str::<Value>(r#"["--config", "/etc/idemgate/idemgate.toml", "serve"]"#)
            .expect("YAML")
    );
    let mount = &container["volumeMounts"][0];
    assert_eq!(
        (mount["mountPath"].as_str(), pod["volumes"][0]["configMap"]["name"].as_str()),
        (Some("/etc/idemgate"), Some("idemgate-config"))
    );
    // The image is the one scripts/build-image.sh tags for this version.
    assert_eq!(container["image"].as_str(), Some(format!("idemgate:{}", idemgate::VERSION).as_str()));
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
}

/// The `idemgate.toml` the ConfigMap holds.
fn config_map_settings() -> String {
    object("ConfigMap")["data"]["idemgate.toml"].as_str().expect("idemgate.toml in the ConfigMap").to_owned()
}

/// Secrets come from the Secret, never the ConfigMap; the example Secret's keys are settings the
/// service reads, masked when printed; the ServiceMonitor scrapes with the same token.
#[test]
fn secrets_come_from_the_secret_and_prometheus_scrapes_with_its_token() {
    let config = config_map_settings();
    assert_sets_no_secret(&config, "the ConfigMap's idemgate.toml");
    let deployment = object("Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["envFrom"][0]["secretRef"]["name"].as_str(), Some("idemgate"));
    let secret = object("Secret");
    assert_eq!(secret["metadata"]["name"].as_str(), Some("idemgate"));
    let env: Vec<(String, String)> = secret["stringData"]
        .as_mapping()
        .expect("stringData")
        .iter()
        .map(|(k, v)| (k.as_str().expect("key").to_owned(), v.as_str().expect("value").to_owned()))
        .collect();
    assert!(env.iter().any(|(k, _)| k == "IDEMGATE_DATABASE__URL"), "{env:?}");
    let (code, printed, err) = effective_config(&config, &env);
    assert_eq!(code, Some(0), "{err}");
    assert!(!printed.contains("CHANGE-ME"), "a secret printed:\n{printed}");
    assert_eq!(setting(&printed, "http.auth_token").as_str(), Some("***"));

    let monitor = object("ServiceMonitor");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!((endpoint["port"].as_str(), endpoint["path"].as_str()), (Some("http"), Some("/metrics")));
    let credentials = &endpoint["authorization"]["credentials"];
    assert_eq!(
        (credentials["name"].as_str(), credentials["key"].as_str()),
        (Some("idemgate"), Some("IDEMGATE_HTTP__AUTH_TOKEN"))
    );
    // The alerts select the job Prometheus names after the Service.
    let service = object("Service");
    assert_eq!(service["metadata"]["name"].as_str(), Some("idemgate"));
    assert!(read("dashboards/prometheus/alerts.rules.yml").contains(r#"up{job="idemgate"}"#));
    assert_eq!(monitor["spec"]["selector"]["matchLabels"], service["spec"]["selector"]);
    assert_eq!(service["spec"]["ports"][0]["targetPort"].as_str(), Some("http"));
}

/// The PrometheusRule file is what `scripts/kubernetes-rules.sh` prints, and each object's
/// spec is its rule file as Prometheus reads it.
#[test]
fn the_prometheus_rules_embed_the_rule_files_as_the_script_prints_them() {
    let out = run(&mut Command::new(root().join("scripts/kubernetes-rules.sh")), "part of the workspace");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout) == read(&format!("{DIR}/prometheusrule.yaml")),
        "{DIR}/prometheusrule.yaml is stale: run scripts/kubernetes-rules.sh > {DIR}/prometheusrule.yaml"
    );
    let rules = objects(&format!("{DIR}/prometheusrule.yaml"));
    assert_eq!(rules.len(), 2);
    for (rule, file) in rules.iter().zip(["recording", "alerts"]) {
        let path = format!("dashboards/prometheus/{file}.rules.yml");
        let expected: Value = serde_yaml::from_str(&read(&path)).expect("the rule file");
        assert_eq!(rule["spec"], expected, "{path}");
        assert_eq!(rule["metadata"]["name"].as_str(), Some(format!("idemgate-{file}").as_str()));
    }
}
