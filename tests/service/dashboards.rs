//! The Grafana dashboard, the Grafana provisioning examples and the Prometheus rules in
//! `dashboards/`: the dashboard's structure (it must provision from the file with no edits),
//! its queries (valid PromQL, checked by promtool), the rules' own checks and unit tests
//! (`scripts/check-rules.sh`), and the mixin in `mixin/` they are generated from (the shipped
//! files are what it generates; another selector leaves no default job behind). promtool is
//! required: a machine without it fails these tests (`scripts/install-prometheus.sh` installs
//! it). jsonnet is required as well: a machine without it fails the tests that regenerate the
//! files (`scripts/install-jsonnet.sh` installs it).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard_text() -> String {
    read("dashboards/idemgate.json")
}

fn dashboard() -> Value {
    serde_json::from_str(&dashboard_text()).expect("dashboards/idemgate.json is not valid JSON")
}

/// Every panel, including those nested in rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            if let Some(nested) = panel.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    assert!(!out.is_empty(), "the dashboard has no panels");
    out
}

/// Panels that show data (rows only group them).
fn data_panels(dashboard: &Value) -> Vec<&Value> {
    panels(dashboard).into_iter().filter(|p| p["type"] != "row").collect()
}

fn title(panel: &Value) -> String {
    format!("panel {} {:?}", panel["id"], panel["title"].as_str().unwrap_or(""))
}

fn targets(panel: &Value) -> &[Value] {
    panel["targets"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn variables(dashboard: &Value) -> &[Value] {
    dashboard["templating"]["list"]
        .as_array()
        .map(Vec::as_slice)
        .expect("the dashboard has no templating.list")
}

fn variable<'a>(dashboard: &'a Value, name: &str) -> &'a Value {
    variables(dashboard)
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("the dashboard has no template variable {name:?}"))
}

/// Every PromQL expression of the panels, with where it comes from.
fn expressions(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in data_panels(dashboard) {
        for target in targets(panel) {
            let expr = target["expr"].as_str().unwrap_or("").to_owned();
            out.push((format!("{} target {}", title(panel), target["refId"]), expr));
        }
    }
    out
}

fn uses_the_datasource_variable(datasource: &Value) -> bool {
    datasource["uid"] == "${datasource}" && datasource.get("type").is_none_or(|t| t == "prometheus")
}

/// Replaces Grafana's variables by what Prometheus would receive: durations for the interval
/// variables and a match-all regex for the template variables (always used in `=~"…"`).
fn substitute_grafana_variables(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, consumed) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').unwrap_or_else(|| panic!("unclosed ${{ in {expr}"));
            let name = braced[..end].split(':').next().unwrap_or("");
            (name, end + 2)
        } else {
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            (&after[..end], end)
        };
        out.push_str(match name {
            "__rate_interval" | "__range" => "5m",
            "__interval" => "1m",
            "" => panic!("a bare $ in {expr}"),
            _ => ".*",
        });
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}

/// The position just after the parenthesis that closes the one opened at `open`.
fn closing_parenthesis(text: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses in {text}");
}

/// How many selectors of `metric` (`metric{…}`) `expr` holds.
fn selectors_of(expr: &str, metric: &str) -> usize {
    let pattern = format!("{metric}{{");
    expr.match_indices(&pattern)
        .filter(|(at, _)| {
            !expr[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        })
        .count()
}

fn promtool() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("promtool"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "promtool is required for these tests and is not on PATH: run scripts/install-prometheus.sh"
            )
        })
}

fn output_of(command: &mut Command) -> (bool, String) {
    let output = command.output().unwrap_or_else(|e| panic!("could not run {command:?}: {e}"));
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[test]
fn the_dashboard_provisions_without_import_placeholders() {
    let text = dashboard_text();
    assert!(!text.contains("${DS_"), "the dashboard refers to a ${{DS_…}} import input");
    assert!(!text.contains("__inputs"), "the dashboard declares __inputs");
    assert!(!text.contains("__requires"), "the dashboard declares __requires");
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "idemgate", "a fixed uid keeps links to the dashboard stable");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["id"].is_null(), "a provisioned dashboard must not carry a database id");
}

#[test]
fn panel_ids_are_unique() {
    let dashboard = dashboard();
    let mut seen = HashSet::new();
    for panel in panels(&dashboard) {
        let id = panel["id"].as_u64().unwrap_or_else(|| panic!("{} has no numeric id", title(panel)));
        assert!(seen.insert(id), "panel id {id} is used twice");
    }
}

#[test]
fn every_panel_fits_in_the_24_column_grid() {
    let dashboard = dashboard();
    for panel in panels(&dashboard) {
        let grid = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"]
            .map(|k| grid[k].as_u64().unwrap_or_else(|| panic!("{} has no gridPos.{k}", title(panel))));
        assert!(w > 0 && h > 0, "{} has an empty gridPos", title(panel));
        assert!(x + w <= 24, "{} ends at column {} (x {x} + w {w}) of 24", title(panel), x + w);
        assert!(y < 1000, "{} is placed at row {y}", title(panel));
    }
}

/// Fails when two of `panels` share a cell of the grid.
fn assert_apart<'a>(panels: impl IntoIterator<Item = &'a Value>) {
    let mut cells = HashSet::new();
    for panel in panels {
        let grid = &panel["gridPos"];
        let at = |k: &str| grid[k].as_u64().unwrap_or(0);
        for row in at("y")..at("y") + at("h") {
            for column in at("x")..at("x") + at("w") {
                assert!(
                    cells.insert((row, column)),
                    "{} overlaps another panel at row {row}, column {column}",
                    title(panel)
                );
            }
        }
    }
}

/// The rows of the dashboard that hold their panels folded away.
fn collapsed_rows(dashboard: &Value) -> Vec<&Value> {
    let top = dashboard["panels"].as_array().expect("the dashboard has no panels");
    top.iter().filter(|p| p["type"] == "row" && p["collapsed"] == true).collect()
}

#[test]
fn panels_do_not_overlap() {
    // The dashboard's own grid; a collapsed row's panels take no room in it until the row is
    // opened, so they are laid out apart from each other, below their row.
    let dashboard = dashboard();
    assert_apart(dashboard["panels"].as_array().expect("the dashboard has no panels"));
    for row in collapsed_rows(&dashboard) {
        let nested = row["panels"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        assert!(!nested.is_empty(), "{} is collapsed and empty", title(row));
        assert_apart(nested);
        for panel in nested {
            assert!(
                panel["gridPos"]["y"].as_u64() > row["gridPos"]["y"].as_u64(),
                "{} is above its row",
                title(panel)
            );
            assert!(panel.get("panels").is_none(), "{} nests panels inside a row", title(panel));
        }
    }
}

#[test]
fn the_optional_parts_sit_in_collapsed_rows() {
    let dashboard = dashboard();
    let rows = collapsed_rows(&dashboard);
    for (part, metric) in [
        ("Redis", "idemgate_prefilter_total"),
        ("Group commit", "idemgate_group_commits_total"),
        ("Group commit", "idemgate_group_fallbacks_total"),
        ("Galera", "idemgate_transient_retries_total"),
        ("Process", "process_resident_memory_bytes"),
    ] {
        let row = rows
            .iter()
            .find(|r| r["title"].as_str().is_some_and(|t| t.contains(part)))
            .unwrap_or_else(|| panic!("no collapsed row for {part}"));
        let reads = row["panels"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(targets)
            .any(|t| t["expr"].as_str().is_some_and(|e| e.contains(metric)));
        assert!(reads, "the {part} row has no panel reading {metric}");
        // Nowhere else: an optional part's panels are all in its row.
        for panel in dashboard["panels"].as_array().into_iter().flatten().filter(|p| p["type"] != "row") {
            assert!(
                !targets(panel).iter().any(|t| t["expr"].as_str().is_some_and(|e| e.contains(metric))),
                "{} reads {metric} outside the {part} row",
                title(panel)
            );
        }
    }
}

#[test]
fn deploys_are_marked_when_a_new_version_of_idemgate_build_info_appears() {
    let dashboard = dashboard();
    let annotations = dashboard["annotations"]["list"].as_array().expect("no annotations.list");
    let deploys = annotations.iter().find(|a| a["name"] == "Deploys").expect("no Deploys annotation");
    assert!(uses_the_datasource_variable(&deploys["datasource"]), "{}", deploys["datasource"]);
    assert_eq!(deploys["enable"], true);
    let expr = deploys["expr"].as_str().expect("the Deploys annotation has no expr");
    assert!(expr.contains("idemgate_build_info{") && expr.contains("version"), "{expr}");
    assert!(
        expr.contains(" unless ") && expr.contains(" offset "),
        "not a version that was absent before: {expr}"
    );
    for name in ["cluster", "job", "broker", "consumer_group"] {
        assert!(expr.contains(&format!("=~\"${name}\"")), "the Deploys annotation ignores ${name}: {expr}");
    }
    assert!(deploys["titleFormat"].as_str().is_some_and(|t| t.contains("{{version}}")));
}

#[test]
fn every_panel_and_target_uses_the_datasource_variable() {
    let dashboard = dashboard();
    for panel in data_panels(&dashboard) {
        assert!(
            uses_the_datasource_variable(&panel["datasource"]),
            "{} has datasource {} instead of uid ${{datasource}}",
            title(panel),
            panel["datasource"]
        );
        for target in targets(panel) {
            assert!(
                uses_the_datasource_variable(&target["datasource"]),
                "{} target {} has datasource {} instead of uid ${{datasource}}",
                title(panel),
                target["refId"],
                target["datasource"]
            );
        }
    }
    for var in variables(&dashboard).iter().filter(|v| v["type"] == "query") {
        assert!(
            uses_the_datasource_variable(&var["datasource"]),
            "template variable {} has datasource {} instead of uid ${{datasource}}",
            var["name"],
            var["datasource"]
        );
    }
}

#[test]
fn every_panel_has_a_unit() {
    let dashboard = dashboard();
    for panel in data_panels(&dashboard) {
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("");
        assert!(!unit.is_empty(), "{} has no fieldConfig.defaults.unit", title(panel));
    }
}

#[test]
fn every_panel_has_a_target_and_every_target_an_expression() {
    let dashboard = dashboard();
    for panel in data_panels(&dashboard) {
        assert!(!targets(panel).is_empty(), "{} has no target", title(panel));
        let mut ref_ids = HashSet::new();
        for target in targets(panel) {
            let expr = target["expr"].as_str().unwrap_or("");
            assert!(!expr.trim().is_empty(), "{} target {} has no expr", title(panel), target["refId"]);
            assert!(
                ref_ids.insert(target["refId"].to_string()),
                "{} repeats refId {}",
                title(panel),
                target["refId"]
            );
        }
    }
}

#[test]
fn every_rate_and_increase_uses_the_rate_interval() {
    let dashboard = dashboard();
    let mut checked = 0;
    for (origin, expr) in expressions(&dashboard) {
        for function in ["rate(", "increase("] {
            let mut from = 0;
            while let Some(found) = expr[from..].find(function) {
                let start = from + found;
                let open = start + function.len() - 1;
                let close = closing_parenthesis(&expr, open);
                let call = &expr[start..close];
                assert!(
                    call.ends_with("[$__rate_interval])"),
                    "{origin}: {call} does not use [$__rate_interval]"
                );
                checked += 1;
                from = close;
            }
        }
    }
    assert!(checked > 0, "no rate() or increase() found at all");
}

#[test]
fn the_template_variables_filter_by_biz_type_topic_and_instance() {
    let dashboard = dashboard();
    let datasource = variable(&dashboard, "datasource");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    for name in ["biz_type", "topic", "instance", "consumer_group", "cluster", "broker"] {
        let var = variable(&dashboard, name);
        assert_eq!(var["type"], "query", "{name} is not a query variable");
        let query = var["query"]["query"].as_str().or(var["query"].as_str()).unwrap_or("");
        assert!(
            query.starts_with("label_values(") && query.ends_with(&format!(", {name})")),
            "{name} is not filled from label_values(…, {name}): {query}"
        );
        assert_eq!(var["allValue"], ".*", "{name}'s All must match every value, the empty one included");
    }
    // The job: one of those the mixin's selector matches (job="idemgate" by default), in the
    // selected cluster.
    let job = variable(&dashboard, "job");
    let query = job["query"]["query"].as_str().unwrap_or("");
    assert_eq!(query, "label_values(up{job=\"idemgate\", cluster=~\"$cluster\"}, job)");
    // Every panel query is filtered by the variables its metric has labels for, and every
    // selector by the cluster and the job.
    for (origin, expr) in expressions(&dashboard) {
        for metric in ["idemgate_deliveries_total", "idemgate_redeliveries_total"] {
            if expr.contains(metric) {
                for name in ["biz_type", "topic", "instance", "consumer_group", "broker"] {
                    assert!(
                        expr.contains(&format!("{name}=~\"${name}\"")),
                        "{origin} reads {metric} without the {name} filter"
                    );
                }
            }
        }
        let selectors = expr.matches('{').count();
        assert!(selectors > 0, "{origin} selects no series by label: {expr}");
        for name in ["cluster", "job"] {
            assert_eq!(
                expr.matches(&format!("{name}=~\"${name}\"")).count(),
                selectors,
                "{origin} has a selector without the {name} filter: {expr}"
            );
        }
        // Every series of the service carries `broker`; `up`, which Prometheus writes, does not.
        assert_eq!(
            expr.matches("broker=~\"$broker\"").count(),
            selectors - selectors_of(&expr, "up"),
            "{origin} has a selector of the service's series without the broker filter, or one of `up` with it: {expr}"
        );
        assert!(!expr.contains("job=\"idemgate\""), "{origin} names the job instead of $job: {expr}");
    }
}

#[test]
fn the_broker_variable_lists_the_kinds_of_broker_and_filters_every_series_of_the_service() {
    let dashboard = dashboard();
    let broker = variable(&dashboard, "broker");
    let query = broker["query"]["query"].as_str().unwrap_or("");
    assert_eq!(query, "label_values(idemgate_build_info{cluster=~\"$cluster\", job=~\"$job\"}, broker)");
    assert_eq!(broker["definition"], broker["query"]["query"]);
    // Chosen like the consumer group: one, or All.
    let group = variable(&dashboard, "consumer_group");
    for key in ["multi", "includeAll", "allValue", "hide"] {
        assert_eq!(broker[key], group[key], "the broker variable's {key} differs from consumer_group's");
    }
    // Listed before the variables it narrows, and each of them filtered by it.
    let names: Vec<&str> = variables(&dashboard).iter().filter_map(|v| v["name"].as_str()).collect();
    let at =
        |name: &str| names.iter().position(|n| *n == name).unwrap_or_else(|| panic!("no variable {name}"));
    for name in ["consumer_group", "instance", "biz_type", "topic", "idemgate_url"] {
        assert!(at("broker") < at(name), "the broker variable comes after {name}: {names:?}");
        let query = variable(&dashboard, name)["query"]["query"].as_str().unwrap_or("");
        assert!(query.contains("broker=~\"$broker\""), "{name} is not narrowed by $broker: {query}");
    }
    assert!(dashboard["tags"].as_array().is_some_and(|tags| {
        ["rocketmq", "rabbitmq", "kafka"].iter().all(|kind| tags.iter().any(|t| t == kind))
    }));
    // The lag is collapsed per queue: a queue is named by its broker (broker_name) and number,
    // within one kind of broker.
    let lag: Vec<String> = expressions(&dashboard)
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| e.contains("idemgate_consumer_lag_messages"))
        .collect();
    assert!(!lag.is_empty(), "no panel reads idemgate_consumer_lag_messages");
    for expr in lag {
        assert!(expr.contains("max by (broker, topic, broker_name, queue)"), "{expr}");
    }
}

#[test]
fn links_go_to_the_idemgate_ui_through_the_url_variable() {
    let dashboard = dashboard();
    let url = variable(&dashboard, "idemgate_url");
    // Filled from the service's own http.public_url, never typed in: a fixed default would
    // send every link to one machine.
    assert_eq!(url["type"], "query", "idemgate_url is a {} variable", url["type"]);
    let query = url["query"]["query"].as_str().unwrap_or("");
    assert!(
        query.starts_with("label_values(idemgate_build_info{") && query.ends_with("}, ui_url)"),
        "idemgate_url is not filled from label_values(idemgate_build_info…, ui_url): {query}"
    );
    for name in ["consumer_group", "instance"] {
        assert!(query.contains(&format!("{name}=~\"${name}\"")), "idemgate_url ignores ${name}: {query}");
    }
    assert_eq!(url["definition"], url["query"]["query"]);
    assert_eq!(url["multi"], false, "a link opens one UI");
    assert_eq!(url["includeAll"], false, "a link opens one UI");
    assert!(url["current"].get("value").is_none(), "a saved value would outlive the deployment it named");

    let mut all_links: Vec<(String, String)> = Vec::new();
    for link in dashboard["links"].as_array().into_iter().flatten() {
        all_links.push(("dashboard".into(), link["url"].as_str().unwrap_or("").to_owned()));
    }
    for panel in data_panels(&dashboard) {
        let panel_links = panel["links"].as_array().into_iter().flatten();
        let data_links = panel["fieldConfig"]["defaults"]["links"].as_array().into_iter().flatten();
        for link in panel_links.chain(data_links) {
            all_links.push((title(panel), link["url"].as_str().unwrap_or("").to_owned()));
        }
    }
    for (origin, link) in &all_links {
        assert!(
            link.starts_with("${idemgate_url}/"),
            "{origin} links to {link:?}, not to a page of the idemgate UI"
        );
    }
    let has = |target: &str| all_links.iter().any(|(_, link)| link.starts_with(target));
    for page in [
        "${idemgate_url}/trace",
        "${idemgate_url}/dead-letters?biz_type=${biz_type",
        "${idemgate_url}/collisions?biz_type=",
        "${idemgate_url}/invalid",
        "${idemgate_url}/archive",
        "${idemgate_url}/anomalies?kind=",
    ] {
        assert!(has(page), "no link to {page}");
    }
    let dead_letters = data_panels(&dashboard)
        .into_iter()
        .find(|p| p["title"] == "Dead letters")
        .expect("no Dead letters panel");
    assert!(
        dead_letters["links"].as_array().into_iter().flatten().any(|l| l["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("${idemgate_url}/dead-letters?biz_type=${biz_type"))),
        "the Dead letters panel does not link to the dead letters of the selected biz_type"
    );
}

#[test]
fn the_panels_cover_every_metric_of_the_service() {
    let dashboard = dashboard();
    let all: String = expressions(&dashboard).into_iter().map(|(_, e)| e + "\n").collect();
    for metric in [
        "idemgate_deliveries_total",
        "idemgate_conflicts_total",
        "idemgate_redeliveries_total",
        "idemgate_key_collisions_total",
        "idemgate_illegal_transitions_total",
        "idemgate_handler_duration_seconds_bucket",
        "idemgate_delivery_duration_seconds_bucket",
        "idemgate_end_to_end_seconds_bucket",
        "idemgate_dedup_rows",
        "idemgate_archive_runs_total",
        "idemgate_archive_rows_moved_total",
        "idemgate_archive_last_success_timestamp_seconds",
        "idemgate_archive_last_run_duration_seconds",
        "idemgate_delivery_log_partitions_ahead_seconds",
        "idemgate_delivery_log_overflow_rows",
        "idemgate_reconcile_anomalies",
        "idemgate_reconcile_last_run_timestamp_seconds",
        "idemgate_duplicate_ratio",
        "idemgate_conflicts_per_second",
        "idemgate_group_fallbacks_total",
        "idemgate_group_deferrals_total",
        "idemgate_consumer_lag_messages",
        "idemgate_consumer_lag_seconds",
        "idemgate_consumer_lag_reads_total",
        "idemgate_consumer_buffered_messages",
        "idemgate_transient_retries_total",
        "idemgate_ambiguous_commits_total",
    ] {
        assert!(all.contains(metric), "no panel shows {metric}");
    }
    for quantile in ["0.5", "0.95", "0.99"] {
        assert!(all.contains(&format!("histogram_quantile({quantile},")), "no p{quantile} latency panel");
    }
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let dashboard = dashboard();
    let mut queries = expressions(&dashboard);
    // The selectors inside the variables' label_values(…) queries too.
    for var in variables(&dashboard).iter().filter(|v| v["type"] == "query") {
        let query = var["query"]["query"].as_str().or(var["query"].as_str()).unwrap_or("");
        let inner = query.strip_prefix("label_values(").and_then(|q| q.rsplit_once(','));
        if let Some((selector, _label)) = inner {
            queries.push((format!("variable {}", var["name"]), selector.to_owned()));
        }
    }
    for annotation in dashboard["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(expr) = annotation["expr"].as_str() {
            queries.push((format!("annotation {}", annotation["name"]), expr.to_owned()));
        }
    }
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (origin, expr)) in queries.iter().enumerate() {
        let promql = substitute_grafana_variables(expr);
        rules.push_str(&format!("      # {origin}\n"));
        rules.push_str(&format!("      - record: dashboard:query_{i}\n"));
        rules.push_str(&format!("        expr: {}\n", serde_json::Value::String(promql)));
    }
    let file = std::env::temp_dir().join(format!("idemgate-dashboard-queries-{}.yml", std::process::id()));
    std::fs::write(&file, &rules).expect("write the query check file");
    let (ok, output) = output_of(Command::new(promtool()).args(["check", "rules", "--lint=none"]).arg(&file));
    let _ = std::fs::remove_file(&file);
    assert!(ok, "promtool rejects a dashboard query:\n{output}\n{rules}");
}

#[test]
fn the_provisioning_examples_load_the_dashboard_from_a_file() {
    let datasources = read("dashboards/provisioning/datasources/idemgate.yml");
    assert!(datasources.contains("apiVersion: 1"));
    assert!(datasources.contains("type: prometheus"));
    let providers = read("dashboards/provisioning/dashboards/idemgate.yml");
    assert!(providers.contains("apiVersion: 1"));
    assert!(providers.contains("type: file"));
    let path = providers
        .lines()
        .find_map(|line| line.trim().strip_prefix("path:"))
        .map(|p| p.trim().trim_matches('"').to_owned())
        .expect("the dashboard provider has no path");
    let readme = read("dashboards/README.md");
    assert!(readme.contains(&path), "dashboards/README.md does not say where {path} is");
}

#[test]
fn the_prometheus_rules_pass_promtool_checks_and_unit_tests() {
    let promtool = promtool();
    let script = root().join("scripts/check-rules.sh");
    let (ok, output) = output_of(Command::new("bash").arg(&script).current_dir(root()));
    assert!(ok, "scripts/check-rules.sh failed (promtool: {}):\n{output}", promtool.display());
    assert!(
        output.contains("check-rules: ") && output.contains(" passed"),
        "scripts/check-rules.sh did not report its tests:\n{output}"
    );
}

// ---------------------------------------------------------------------------------------------
// The rules and alerts as files.

/// The names of the alerts in `dashboards/prometheus/alerts.rules.yml`, each once.
fn alert_names() -> Vec<String> {
    let mut names: Vec<String> = read("dashboards/prometheus/alerts.rules.yml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_owned())
        .collect();
    names.dedup();
    assert!(names.len() >= 10, "too few alerts found: {names:?}");
    names
}

#[test]
fn every_alert_has_a_rule_test_where_it_fires_and_one_where_it_does_not() {
    // In the unit tests, `alertname: X` is followed by `exp_alerts: []` (expected quiet) or by
    // `exp_alerts:` and the alerts it must fire with.
    let tests = read("dashboards/prometheus/tests/alerts.test.yml");
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    let (mut fires, mut quiet) = (HashSet::new(), HashSet::new());
    for pair in lines.windows(2) {
        if let Some(name) = pair[0].strip_prefix("alertname:") {
            match pair[1] {
                "exp_alerts: []" => quiet.insert(name.trim().to_owned()),
                "exp_alerts:" => fires.insert(name.trim().to_owned()),
                other => panic!("alertname {name} followed by {other:?}"),
            };
        }
    }
    for name in alert_names() {
        assert!(fires.contains(&name), "no rule test in which {name} fires");
        assert!(quiet.contains(&name), "no rule test in which {name} stays quiet");
    }
}

#[test]
fn every_alert_links_to_its_runbook_section_and_to_the_ui() {
    let runbook = read("docs/runbook.md");
    let headings: HashSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let rules = read("dashboards/prometheus/alerts.rules.yml");
    let links: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("runbook_url:")).collect();
    assert_eq!(links.len(), rules.lines().filter(|l| l.trim().starts_with("- alert:")).count());
    assert_eq!(links.len(), rules.lines().filter(|l| l.trim().starts_with("ui_url:")).count());
    for name in alert_names() {
        let anchor = name.to_ascii_lowercase();
        assert!(headings.contains(&anchor), "docs/runbook.md has no section ## {name}");
        assert!(
            links.iter().any(|l| l.trim().trim_matches('"').ends_with(&format!("/docs/runbook.md#{anchor}"))),
            "{name}'s runbook_url is not its section of docs/runbook.md"
        );
    }
}

/// The rules of a rule file written by `mixin/lib/rulefile.libsonnet`, each as its fields
/// (`record` or `alert`, `expr`, and the annotations) with their values as YAML reads them: a
/// plain or double-quoted scalar, a literal block (`|`, `|-`) or a folded one (`>-`, whose
/// lines are single-spaced words).
fn rules_of(relative: &str) -> Vec<HashMap<String, String>> {
    let text = read(relative);
    let lines: Vec<&str> = text.lines().collect();
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut rules: Vec<HashMap<String, String>> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        let entry = trimmed.strip_prefix("- ");
        if entry.is_some_and(|e| e.starts_with("record:") || e.starts_with("alert:")) {
            rules.push(Default::default());
        }
        let field = entry.unwrap_or(trimmed);
        let Some((key, value)) = field.split_once(':') else { continue };
        let Some(rule) = rules.last_mut() else { continue };
        let value = value.trim();
        let value = match value {
            "|" | "|-" | ">-" => {
                let mut block = Vec::new();
                while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > indent(line)) {
                    block.push(lines[i].trim());
                    i += 1;
                }
                while block.last().is_some_and(|l| l.is_empty()) {
                    block.pop();
                }
                block.join(if value == ">-" { " " } else { "\n" })
            }
            quoted if quoted.starts_with('"') => {
                serde_json::from_str::<String>(quoted).unwrap_or_else(|e| panic!("{relative}: {quoted}: {e}"))
            }
            plain => plain.to_owned(),
        };
        rule.insert(key.trim().to_owned(), value);
    }
    rules
}

/// The label lists of `expr` after `keyword` (`by` or `on`): `by (a, b)` gives `["a", "b"]`,
/// with the text that follows the list.
fn label_lists<'a>(expr: &'a str, keyword: &str) -> Vec<(Vec<String>, &'a str)> {
    let pattern = format!("{keyword} (");
    expr.match_indices(&pattern)
        .filter(|(at, _)| {
            !expr[..*at].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(at, _)| {
            let open = at + pattern.len() - 1;
            let close = closing_parenthesis(expr, open);
            let labels = expr[open + 1..close - 1].split(',').map(|l| l.trim().to_owned()).collect();
            (labels, &expr[close..])
        })
        .collect()
}

#[test]
fn every_recording_rule_keeps_the_broker_label() {
    let rules = rules_of("dashboards/prometheus/recording.rules.yml");
    assert!(rules.len() >= 10, "too few recording rules: {rules:?}");
    let mut aggregations = 0;
    for rule in &rules {
        let (record, expr) = (&rule["record"], &rule["expr"]);
        for (labels, _) in label_lists(expr, "by") {
            assert!(labels.iter().any(|l| l == "broker"), "{record} aggregates without broker: {expr}");
            assert!(labels.iter().any(|l| l == "cluster"), "{record} aggregates without the cluster: {expr}");
            aggregations += 1;
        }
        for (labels, _) in label_lists(expr, "on") {
            assert!(labels.iter().any(|l| l == "broker"), "{record} matches without broker: {expr}");
        }
    }
    assert!(aggregations >= 8, "too few aggregations found: {aggregations}");
    // The lag's queues: the broker of a RocketMQ queue is broker_name, `broker` is the kind.
    let lag = rules
        .iter()
        .find(|r| r["record"] == "consumer_group_topic:idemgate_consumer_lag_messages:sum_max")
        .expect("no lag recording rule");
    let lists = label_lists(&lag["expr"], "by");
    assert!(
        lists.iter().any(|(labels, _)| ["broker", "broker_name", "queue"]
            .iter()
            .all(|n| labels.iter().any(|l| l == n))),
        "the lag is not collapsed per broker, broker_name and queue: {}",
        lag["expr"]
    );
}

#[test]
fn every_alert_keeps_the_broker_label_and_its_queries_select_it() {
    let rules = rules_of("dashboards/prometheus/alerts.rules.yml");
    assert!(rules.len() >= 10, "too few alerts: {rules:?}");
    for rule in &rules {
        let (alert, expr) = (&rule["alert"], &rule["expr"]);
        for (labels, _) in label_lists(expr, "by") {
            assert!(labels.iter().any(|l| l == "broker"), "{alert} aggregates without broker: {expr}");
        }
        // A join matches on broker, but for one with `up`, which has no broker: it matches on
        // the scrape target alone.
        for (labels, rest) in label_lists(expr, "on") {
            let with_up = rest.trim_start().trim_start_matches('(').starts_with("up{");
            assert_eq!(
                labels.iter().any(|l| l == "broker"),
                !with_up,
                "{alert} matches on {labels:?}, {} broker: {expr}",
                if with_up { "up has no" } else { "without" }
            );
        }
        // The template queries of the annotations: every selector the alert's labels fill in
        // (`…=%q`) selects the alert's broker too; a join with up stays off it.
        for key in ["description", "ui_url"] {
            let text = &rule[key];
            for (at, _) in text.match_indices("=%") {
                let open = text[..at].rfind('{').expect("a selector's opening brace");
                let close = at + text[at..].find('}').expect("a selector's closing brace");
                let selector = &text[open..close];
                assert!(
                    selector.contains("broker=%"),
                    "{alert}'s {key} queries {selector}}} without its broker"
                );
            }
            for (labels, _) in label_lists(text, "on") {
                assert!(
                    !labels.iter().any(|l| l == "broker"),
                    "{alert}'s {key} joins with up on broker: {text}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The mixin the files are generated from.

/// jsonnet, which the mixin's tests need: a machine without it fails them, naming the script
/// that installs it.
fn jsonnet() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("jsonnet"))
        .find(|c| c.is_file())
        .expect("jsonnet is required and is not on PATH: run scripts/install-jsonnet.sh")
}

/// The files `scripts/generate-mixin.sh` writes, relative to its output folder.
const GENERATED: [&str; 3] =
    ["idemgate.json", "prometheus/recording.rules.yml", "prometheus/alerts.rules.yml"];

/// Runs `scripts/generate-mixin.sh` into a new folder, with `options` for jsonnet.
fn generate(options: &[&str]) -> tempfile::TempDir {
    let out = tempfile::tempdir().expect("a temporary folder");
    let script = root().join("scripts/generate-mixin.sh");
    let (ok, output) = output_of(Command::new("bash").arg(&script).arg(out.path()).args(options));
    assert!(ok, "scripts/generate-mixin.sh failed:\n{output}");
    out
}

#[test]
fn the_shipped_dashboard_and_rules_are_what_the_mixin_generates() {
    jsonnet();
    let out = generate(&[]);
    for file in GENERATED {
        let generated = std::fs::read_to_string(out.path().join(file)).expect("a generated file");
        let shipped = read(&format!("dashboards/{file}"));
        if generated != shipped {
            let (line, (want, got)) = generated
                .lines()
                .zip(shipped.lines())
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .map(|(i, pair)| (i + 1, pair))
                .unwrap_or((generated.lines().count().min(shipped.lines().count()) + 1, ("", "")));
            panic!(
                "dashboards/{file} is not what mixin/ generates (run scripts/generate-mixin.sh); \
                 first difference at line {line}:\n  generated: {want}\n  shipped:   {got}"
            );
        }
    }
}

#[test]
fn another_job_selector_leaves_no_default_job_and_the_rule_tests_pass_under_it() {
    jsonnet();
    let promtool = promtool();
    let out = generate(&["--tla-code", r#"config={idemgateSelector: 'job="payments-idemgate"'}"#]);
    let dir = out.path();
    for file in GENERATED {
        let text = std::fs::read_to_string(dir.join(file)).expect("a generated file");
        for default in [r#"job="idemgate""#, r#"job=\"idemgate\""#, r#"job=\\\"idemgate\\\""#] {
            assert!(!text.contains(default), "{file} still selects {default}");
        }
        assert!(text.contains("payments-idemgate"), "{file} does not name the selector's job");
    }
    let alerts = std::fs::read_to_string(dir.join("prometheus/alerts.rules.yml")).unwrap();
    assert!(alerts.contains(r#"absent(up{job="payments-idemgate"})"#), "{alerts}");

    let rules: Vec<PathBuf> = GENERATED[1..].iter().map(|f| dir.join(f)).collect();
    let (ok, output) = output_of(Command::new(&promtool).args(["check", "rules", "--lint=all"]).args(&rules));
    assert!(ok, "promtool rejects the rules for job payments-idemgate:\n{output}");

    // The unit tests of the shipped rules, their series and expectations moved to the other
    // job: each alert fires and stays quiet exactly as it does under the default. IdemgateDown
    // in particular stays quiet while payments-idemgate's targets are up.
    let tests = dir.join("prometheus/tests");
    std::fs::create_dir_all(&tests).unwrap();
    for name in ["alerts.test.yml", "recording.test.yml"] {
        let moved = read(&format!("dashboards/prometheus/tests/{name}"))
            .replace(r#"job="idemgate""#, r#"job="payments-idemgate""#)
            .replace(r#"job=\"idemgate\""#, r#"job=\"payments-idemgate\""#)
            .replace("job: idemgate", "job: payments-idemgate")
            .replace("(job idemgate)", "(job payments-idemgate)");
        std::fs::write(tests.join(name), moved).unwrap();
        let (ok, output) = output_of(Command::new(&promtool).args(["test", "rules"]).arg(tests.join(name)));
        assert!(ok, "{name} fails with the rules for job payments-idemgate:\n{output}");
    }
}

#[test]
fn the_mixin_sources_are_as_jsonnetfmt_formats_them() {
    let jsonnet = jsonnet();
    // jsonnetfmt comes with jsonnet, in the same package.
    let jsonnetfmt = jsonnet.with_file_name("jsonnetfmt");
    let mut sources = Vec::new();
    let mut folders = vec![root().join("mixin")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("mixin/ is readable") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonnet" || e == "libsonnet") {
                sources.push(path);
            }
        }
    }
    assert!(sources.len() >= 8, "the mixin's sources: {sources:?}");
    let (ok, output) = output_of(Command::new(&jsonnetfmt).arg("--test").args(&sources));
    assert!(ok, "jsonnetfmt would change the mixin (run jsonnetfmt -i on mixin/**/*sonnet):\n{output}");
}
